"""The mixture-of-experts layer as Megatron-core computes it, on one expert-parallel rank: a router picks
top-k experts per token, the experts (SwiGLU or GeLU MLPs) run as one batched GEMM over padded groups, and
the Switch/GShard load-balancing loss joins the backward pass through the activations (so it reaches the
router from any pipeline stage without the schedule knowing of it).

Megatron's choices kept here, so a run compares with a Megatron one: with softmax scores the top-k picks the
largest logits and the k probabilities are a softmax over those k; with sigmoid scores the k picked scores
are divided by their sum (when k > 1). The auxiliary loss is E * coeff / (k * T^2) * sum_e(tokens_e * sum of
probs_e), its probabilities a softmax (or normalised sigmoid) over all experts, its counts from the top-k
before any token is dropped. A capacity factor gives each expert ceil(T * k / E * factor) slots and drops
the routed tokens past it, lowest probability first (--moe-token-drop-policy probs) or latest first
(position); dropless when there is no factor or the capacity exceeds T.

Every expert's weights are drawn whole under their own name, as the dense layers' are (layers.master_normal),
and each rank keeps its part, so every layout holds the same numbers as one rank. Where the layout puts them:

- tp ranks that see the same tokens (tp without sequence parallelism) hold every expert, whole (expert tp 1)
  or split like a dense MLP (expert tp = tp: partial outputs summed over tp);
- where each rank holds its own tokens (tp 1, or sequence parallelism), Megatron-core's expert grid
  (spec.layout.expert_grid): ep ranks hold E / ep experts each, expert tp ranks split those experts'
  matrices. Each rank pads its tokens into [E, slots, h] groups, slots agreed over expert tp x ep, sends
  each ep rank its experts' groups by one all-to-all, all-gathers them over expert tp, runs its experts,
  reduce-scatters over expert tp and sends the outputs back by a second all-to-all. Equal-sized exchanges
  keep every collective one call on gloo and nccl alike; the padding costs memory linear in the tokens.

Pipeline stages need nothing more: the loss rides on the activations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from nlp_bench import kernels
from nlp_bench.train import collectives as C
from nlp_bench.train import layers
from nlp_bench.train.config import GPTConfig, MoEConfig
from nlp_bench.train.process_groups import ExpertGroups


class _AuxLossScaler(torch.autograd.Function):
    """Passes the activation through and, in the backward pass, gives the auxiliary loss the gradient the
    LM loss gets (Megatron's MoEAuxLossAutoScaler): the loss scale over the micro-batches."""

    scale = 1.0

    @staticmethod
    def forward(ctx, activation: torch.Tensor, aux_loss: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(aux_loss)
        return activation

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (aux_loss,) = ctx.saved_tensors
        return grad, torch.full_like(aux_loss, _AuxLossScaler.scale)


def set_aux_loss_scale(scale: float) -> None:
    """The factor the LM loss is multiplied by before backward (loss scale / micro-batches)."""
    _AuxLossScaler.scale = scale


@dataclass(frozen=True)
class Routing:
    """One batch's routing: per token its top-k experts and their weights, the load-balancing loss (None
    when its coefficient is 0) and the unscaled value Megatron logs."""

    experts: torch.Tensor  # [T, k] int64
    probs: torch.Tensor  # [T, k]
    aux_loss: torch.Tensor | None
    balance: torch.Tensor | None


def route(logits: torch.Tensor, topk: int, score_function: str = "softmax", aux_loss_coeff: float = 0.0,
          count_group=None) -> Routing:
    """Megatron-core's topk_routing_with_score_function (no pre-softmax, groups or bias) and its
    switch_load_balancing_loss_func, on logits [T, E]. `count_group`: the tp ranks that split one sequence
    (sequence parallelism): the tokens per expert and the token count are theirs together, each rank's loss
    holds its own tokens' probabilities, so the ranks' losses add up to the whole sequence's (as Megatron's
    tp_cp reduction); the logged value is that sum on every rank."""
    tokens, experts = logits.shape
    if score_function == "softmax":
        top, index = torch.topk(logits, topk, dim=1)
        probs = torch.softmax(top, dim=-1, dtype=torch.float32)
        scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
    else:
        sig = torch.sigmoid(logits.float())
        top, index = torch.topk(sig, topk, dim=1)
        probs = top / (top.sum(dim=-1, keepdim=True) + 1e-20) if topk > 1 else top
        scores = sig / (sig.sum(dim=-1, keepdim=True) + 1e-20)
    aux = balance = None
    if aux_loss_coeff > 0:
        per_expert = torch.zeros(experts, device=logits.device).index_add_(
            0, index.flatten(), torch.ones(index.numel(), device=logits.device))
        total = tokens * C.size(count_group)
        balance = (scores.sum(dim=0) * C.all_reduce(per_expert, count_group)).sum() * (experts / (topk * total * total))
        aux = balance * aux_loss_coeff
        balance = C.all_reduce(balance.detach().clone(), count_group)
    return Routing(index, probs.to(logits.dtype), aux, balance)


def capacity(tokens: int, num_experts: int, topk: int, factor: float | None) -> int | None:
    """Slots per expert (Megatron's get_capacity over T * k routed tokens); None: no token is dropped."""
    if factor is None:
        return None
    slots = math.ceil(tokens * topk / num_experts * factor)
    return None if slots > tokens else slots


@dataclass(frozen=True)
class Dispatch:
    """Where each kept (token, expert) pair sits in the padded [E, slots, H] expert input."""

    token: torch.Tensor  # [N] token index of each kept pair
    expert: torch.Tensor  # [N]
    slot: torch.Tensor  # [N] row within its expert's group
    weight: torch.Tensor  # [N] its routing probability
    slots: int  # rows per expert group
    dropped: int  # pairs past an expert's capacity


def dispatch(routing: Routing, num_experts: int, slots: int | None, drop_policy: str = "probs") -> Dispatch:
    """Sort the (token, expert) pairs by expert (token order within an expert, or probability first when
    tokens may be dropped by probability) and number them within their expert."""
    tokens, topk = routing.experts.shape
    expert = routing.experts.flatten()
    token = torch.arange(tokens, device=expert.device).repeat_interleave(topk)
    weight = routing.probs.flatten()
    order = torch.arange(expert.numel(), device=expert.device)
    if slots is not None and drop_policy == "probs":
        order = torch.argsort(weight, descending=True, stable=True)
    order = order[torch.argsort(expert[order], stable=True)]
    expert, token, weight = expert[order], token[order], weight[order]
    counts = torch.bincount(expert, minlength=num_experts)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(expert.numel(), device=expert.device) - starts[expert]
    dropped = 0
    if slots is None:
        slots = int(counts.max())
    else:
        keep = slot < slots
        dropped = int((~keep).sum())
        expert, token, weight, slot = expert[keep], token[keep], weight[keep], slot[keep]
    return Dispatch(token, expert, slot, weight, slots, dropped)


@dataclass(frozen=True)
class Share:
    """The part of an MoE layer's experts a rank holds: experts [first, first + count), and slice `rank` of
    `split` of each one's matrices (fc1 by output columns, fc2 by input rows, as a dense MLP under tp)."""

    first: int
    count: int
    split: int = 1
    rank: int = 0


class GroupedExperts(nn.Module):
    """This rank's share of the E MLPs, held as stacked weights [experts, in, out] and run together by two
    batched matrix products over each expert's padded group of tokens. Split matrices give partial sums:
    the caller sums them over the split and then adds `bias2`."""

    def __init__(self, cfg: GPTConfig, moe: MoEConfig, index: int, share: Share) -> None:
        super().__init__()
        self.swiglu, h, f = cfg.swiglu, cfg.hidden_size, moe.ffn_hidden_size
        std, seed, parts = cfg.init_method_std, cfg.seed, 2 if cfg.swiglu else 1
        out_std = layers.scaled_std(std, cfg.num_layers)
        self.share = share

        def stacked(name: str, shape: tuple[int, int], scale: float, pieces: int = 1, dim: int = 0) -> torch.Tensor:
            per_expert = []
            for e in range(share.first, share.first + share.count):
                key = f"layers.{index}.experts.{e}.{name}"
                per_expert.append(torch.cat([
                    layers.master_normal(f"{key}.{i}" if pieces > 1 else key, shape, scale, seed)
                    .chunk(share.split, dim=dim)[share.rank] for i in range(pieces)]).t())
            return torch.stack(per_expert).contiguous()

        self.fc1 = nn.Parameter(stacked("fc1", (f, h), std, parts))  # [experts, h, parts * f / split]
        self.fc2 = nn.Parameter(stacked("fc2", (h, f), out_std, dim=1))  # [experts, f / split, h]
        width = self.fc1.shape[-1]
        self.bias1 = nn.Parameter(torch.zeros(share.count, 1, width)) if cfg.add_bias_linear else None
        self.bias2 = nn.Parameter(torch.zeros(share.count, 1, h)) if cfg.add_bias_linear else None

    def activation(self, y: torch.Tensor) -> torch.Tensor:
        return kernels.swiglu(y) if self.swiglu else F.gelu(y, approximate="tanh")

    def forward(self, groups: torch.Tensor) -> torch.Tensor:
        """[experts, slots, h] -> [experts, slots, h]: every expert's group through its MLP, without the
        output bias where the matrices are split (padding rows stay padding: nothing reads them)."""
        y = torch.bmm(groups, self.fc1) if self.bias1 is None else torch.baddbmm(self.bias1, groups, self.fc1)
        y = torch.bmm(self.activation(y), self.fc2)
        return y if self.bias2 is None or self.share.split > 1 else y + self.bias2


class MoELayer(nn.Module):
    """Router, dispatch, grouped experts, combine; plus the shared experts (a dense MLP `shared` every token
    passes through), as Megatron's MoELayer. `dropped` and `balance` hold what the last forward passes
    dropped and logged, for the trainer's line. `grid`: the experts' grid where the layout has expert
    parallelism or expert tp (ProcessGroups.experts)."""

    def __init__(self, cfg: GPTConfig, tp: layers.TensorParallel, index: int, shared: nn.Module | None = None,
                 grid: ExpertGroups | None = None) -> None:
        super().__init__()
        assert cfg.moe is not None
        self.moe, self.tp, self.shared = cfg.moe, tp, shared
        experts = cfg.moe.num_experts
        self.router = nn.Parameter(layers.master_normal(f"layers.{index}.router", (experts, cfg.hidden_size),
                                                        cfg.init_method_std, cfg.seed))
        layers.mark(self.router, sequence_parallel=tp.sequence_parallel)
        # each tp rank routes its own tokens (tp 1, sequence parallelism): the exchange runs; else tp ranks share them
        self.grid = grid if tp.size == 1 or tp.sequence_parallel else None
        if self.grid is not None:
            per_rank = experts // grid.ep
            share = Share(grid.ep_rank * per_rank, per_rank, grid.etp, grid.etp_rank)
        else:  # tp ranks with the same tokens: every expert, whole or split over tp (expert tp = tp)
            share = Share(0, experts, *((tp.size, tp.rank) if grid is not None else (1, 0)))
        self.experts = GroupedExperts(cfg, cfg.moe, index, share)
        params = list(self.experts.parameters())
        if share.split == tp.size > 1 and share.count == experts:  # held like a dense MLP's shards
            layers.mark(*params, tensor_parallel=True)
        elif share.split > 1 or share.count < experts:
            layers.mark(*params, expert=True)
        else:
            layers.mark(*params, sequence_parallel=tp.sequence_parallel)
        self.balance: list[torch.Tensor] = []
        self.dropped = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        m = self.moe
        coeff = m.aux_loss_coeff if self.training and torch.is_grad_enabled() else 0.0
        count_group = self.tp.group if self.tp.sequence_parallel else None
        routing = route(F.linear(flat, self.router), m.topk, m.score_function, coeff, count_group)
        slots = capacity(flat.shape[0], m.num_experts, m.topk, m.capacity_factor)
        plan = dispatch(routing, m.num_experts, slots, m.drop_policy)
        rows = plan.slots
        if self.grid is not None and slots is None:  # dropless: every rank pads to the longest group
            rows = int(C.all_reduce(torch.tensor([rows], device=flat.device), self.grid.tp_ep_group, "max").item())
        groups = flat.new_zeros(m.num_experts, rows, shape[-1])
        groups[plan.expert, plan.slot] = flat[plan.token]
        out = self._run(groups)[plan.expert, plan.slot] * plan.weight.unsqueeze(-1)
        y = torch.zeros_like(flat).index_add_(0, plan.token, out.to(flat.dtype)).view(shape)
        if self.shared is not None:
            y = y + self.shared(x)
        if self.training:
            self.dropped += plan.dropped
        if routing.aux_loss is not None:
            self.balance.append(routing.balance)
            y = _AuxLossScaler.apply(y, routing.aux_loss)
        return y

    def _run(self, groups: torch.Tensor) -> torch.Tensor:
        """[E, slots, h] of this rank's tokens -> their experts' outputs, wherever the experts are."""
        experts, bias2 = self.experts, self.experts.bias2
        split = experts.share.split > 1
        if self.grid is None:
            if not split:
                return experts(groups)
            out = C.reduce_from_group(experts(C.copy_to_group(groups, self.tp.group)), self.tp.group)
            return out if bias2 is None else out + bias2
        grid, (count, rows, h) = self.grid, (experts.share.count, groups.shape[1], groups.shape[2])
        # [ep, mine, rows, h]: chunk j holds ep rank j's experts' groups; back from each rank, its tokens' groups
        work = C.all_to_all(groups.reshape(grid.ep, count, rows, h), grid.ep_group).transpose(0, 1)
        work = work.reshape(count, grid.ep * rows, h)
        if split:
            work = C.gather_sequence(work.transpose(0, 1).contiguous(), grid.etp_group).transpose(0, 1)
        out = experts(work)
        if split:
            out = C.reduce_scatter_sequence(out.transpose(0, 1).contiguous(), grid.etp_group).transpose(0, 1)
            out = out if bias2 is None else out + bias2
        out = out.reshape(count, grid.ep, rows, h).transpose(0, 1).contiguous()
        return C.all_to_all(out, grid.ep_group).reshape(groups.shape)


def drain(model: nn.Module) -> tuple[float, int, int]:
    """The sum and the number of the logged load-balancing losses of this rank's MoE layers and micro-batches
    since the last call, and the (token, expert) pairs they dropped; all reset."""
    values, dropped = [], 0
    for module in model.modules():
        if isinstance(module, MoELayer):
            values += module.balance
            dropped += module.dropped
            module.balance, module.dropped = [], 0
    return (torch.stack(values).sum().item() if values else 0.0), len(values), dropped
