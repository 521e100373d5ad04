"""Adam(W) over one flat buffer: fp32 gradient accumulation, fp32 master weights, fp16 loss scaling,
and Megatron's distributed optimizer (ZeRO-1) as the same code with the flat buffer split over dp.

Every parameter's gradient lands in a view of one fp32 buffer (a hook moves it there as soon as the
backward pass has it). Data-parallel reduction is then one all-reduce of that buffer, or, with the
distributed optimizer, one reduce-scatter: each dp rank updates its own contiguous shard of fp32
master weights and Adam moments and the updated weights are all-gathered back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from nlp_bench import kernels
from nlp_bench.train import collectives
from nlp_bench.train.process_groups import ProcessGroups


@dataclass
class LossScaler:
    """Megatron's dynamic loss scale: halve after `hysteresis` overflows, double after `window` clean steps."""

    scale: float
    window: int
    hysteresis: int
    min_scale: float
    _good: int = 0
    _bad_left: int = 0

    def __post_init__(self) -> None:
        self._bad_left = self.hysteresis

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self._good = 0
            self._bad_left -= 1
            if self._bad_left <= 0:
                self.scale = max(self.scale / 2.0, self.min_scale)
        else:
            self._good += 1
            if self._good == self.window:
                self._good = 0
                self._bad_left = self.hysteresis
                self.scale *= 2.0


class FlatAdam:
    """In fp32 the parameters and their gradients are themselves views of the flat buffers, so autograd
    accumulates in place and an update needs no copy; in bf16/fp16 the fp32 master copy is separate and
    a hook moves each half-precision gradient into the fp32 buffer as soon as it exists.

    The buffer holds the parameters in reverse order of creation, roughly the order in which the
    backward pass finishes them, cut into buckets of at least `bucket_size` elements. Without the
    distributed optimizer, a bucket is all-reduced over dp (asynchronously) as soon as each of its
    parameters has received the gradient of the iteration's last micro-batch, so the reduction
    overlaps the rest of the backward pass.
    """

    def __init__(self, model: nn.Module, groups: ProcessGroups, *, lr_betas_eps: tuple[float, float, float], weight_decay: float,
                 clip_grad: float, distributed: bool, scaler: LossScaler | None, micro_batches: int = 1,
                 bucket_size: int = 40_000_000) -> None:
        self.model, self.groups, self.scaler = model, groups, scaler
        self.beta1, self.beta2, self.eps = lr_betas_eps
        self.weight_decay, self.clip_grad = weight_decay, clip_grad
        tied = {id(p) for p in model.tied_weights()} if hasattr(model, "tied_weights") else set()
        backward_order = [p for p in model.parameters() if p.requires_grad][::-1]
        # tied copies go last, outside every bucket: they are summed over the embedding group first
        self.params = [p for p in backward_order if id(p) not in tied] + [p for p in backward_order if id(p) in tied]
        device = self.params[0].device
        numel = sum(p.numel() for p in self.params)
        self.shards = groups.dp if distributed else 1
        padded = -(-numel // self.shards) * self.shards
        self.fp32 = all(p.dtype == torch.float32 for p in self.params)
        self.main_grad = torch.zeros(padded, dtype=torch.float32, device=device)
        flat = torch.zeros(padded, dtype=torch.float32, device=device)
        counted = torch.zeros(padded, dtype=torch.float32, device=device)
        self.micro_batches = micro_batches
        self._fired: dict[int, int] = {}
        self._bucket_of: dict[int, int] = {}
        self.buckets: list[tuple[int, int, int]] = []  # (start, end, number of parameters)
        self._late: list[nn.Parameter] = []
        offsets: list[int] = []
        offset = bucket_start = bucket_params = 0
        for p in self.params:
            n = p.numel()
            offsets.append(offset)
            flat[offset:offset + n] = p.detach().reshape(-1).float()
            p.main_grad = self.main_grad[offset:offset + n].view_as(p)
            if self.fp32:
                p.data = flat[offset:offset + n].view_as(p)
                p.grad = p.main_grad  # autograd adds into the buffer in place
            p.register_post_accumulate_grad_hook(self._on_grad)
            # the global norm counts tp shards on every rank, replicated tensors and tied copies once
            once = getattr(p, "tensor_parallel", False) or groups.tp_rank == 0
            counted[offset:offset + n] = 1.0 if once and not getattr(p, "shared_copy", False) else 0.0
            offset += n
            if id(p) in tied:
                self._late.append(p)
                continue
            self._bucket_of[id(p)] = len(self.buckets)
            bucket_params += 1
            if offset - bucket_start >= bucket_size:
                self.buckets.append((bucket_start, offset, bucket_params))
                bucket_start, bucket_params = offset, 0
        if bucket_params:  # the tied copies, last in the buffer, stay outside
            self.buckets.append((bucket_start, offset - sum(p.numel() for p in self._late), bucket_params))
        self.overlap = self.shards == 1 and groups.dp > 1
        self._ready = [0] * len(self.buckets)
        self._pending: dict[int, object] = {}
        self.overlapped = 0  # buckets reduced during the backward pass, over the whole run
        self.shard_size = padded // self.shards
        lo = (groups.dp_rank if distributed else 0) * self.shard_size
        self.range = slice(lo, lo + self.shard_size)
        # fp32: the master shard is the parameters' own memory; bf16/fp16: a shard of the fp32 copy
        self.flat = flat
        self.master = flat[self.range]
        counted = counted[self.range]
        self.counted = None if bool(counted.all()) else counted.bool()
        self.grad_shard = self.main_grad if self.shards == 1 else torch.zeros_like(self.master)
        # a fused AdamW (nlp_bench.kernels' on a GPU, else torch's) on views of the master shard: matrices
        # decay, biases and norms do not
        by_decay: dict[float, list[nn.Parameter]] = {weight_decay: [], 0.0: []}
        self._views: list[tuple[nn.Parameter, int, int]] = []  # (view, start, end) within the shard
        for p, start in zip(self.params, offsets, strict=False):
            a, b = max(start, lo), min(start + p.numel(), lo + self.shard_size)
            if b > a:
                view = nn.Parameter(self.master[a - lo:b - lo], requires_grad=False)
                view.grad = self.grad_shard[a - lo:b - lo]
                by_decay[weight_decay if p.ndim >= 2 else 0.0].append(view)
                self._views.append((view, a - lo, b - lo))
        param_groups = [{"params": v, "weight_decay": wd} for wd, v in by_decay.items() if v]
        if kernels.select.runs_triton("adam", self.master):
            self.adam = kernels.FusedAdam(param_groups, lr=0.0, betas=(self.beta1, self.beta2), eps=self.eps,
                                          use_triton=True)
        else:
            # torch's fused kernel exists for CPU and CUDA; an xla device gets the plain loop
            self.adam = torch.optim.AdamW(param_groups, lr=0.0, betas=(self.beta1, self.beta2), eps=self.eps,
                                          fused=self.master.device.type in ("cpu", "cuda") or None)

    def _on_grad(self, p: torch.Tensor) -> None:
        if not self.fp32:
            p.main_grad.add_(p.grad)  # fp32 accumulation of a half-precision gradient
            p.grad = None
        if not self.overlap or id(p) not in self._bucket_of:
            return
        fired = self._fired.get(id(p), 0) + 1
        self._fired[id(p)] = fired
        if fired == self.micro_batches:  # this parameter's gradient for the iteration is complete
            b = self._bucket_of[id(p)]
            self._ready[b] += 1
            if self._ready[b] == self.buckets[b][2]:
                start, end, _ = self.buckets[b]
                self._pending[b] = collectives.all_reduce_async(self.main_grad[start:end], self.groups.dp_group)

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale if self.scaler else 1.0

    def zero_grad(self) -> None:
        self.main_grad.zero_()
        self._fired.clear()
        self._ready = [0] * len(self.buckets)

    def _reduce(self) -> None:
        groups = self.groups
        if self.shards > 1:
            collectives.all_reduce_grads([p.main_grad for p in self._late], groups.embedding_group)
            collectives.reduce_scatter_flat(self.main_grad, self.grad_shard, groups.dp_group)
        else:
            for b, (start, end, _) in enumerate(self.buckets):
                if b in self._pending:
                    self._pending.pop(b).wait()
                    self.overlapped += 1
                else:  # a bucket the backward pass did not complete (e.g. a parameter without gradient)
                    collectives.all_reduce(self.main_grad[start:end], groups.dp_group)
            late = [p.main_grad for p in self._late]
            collectives.all_reduce_grads(late, groups.embedding_group)
            collectives.all_reduce_grads(late, groups.dp_group)
        # sums commute: summing sequence-parallel gradients over tp after dp gives the same numbers
        collectives.all_reduce_grads(self._sp_grads(), groups.tp_group)
        self.grad_shard.div_(groups.dp * self.loss_scale)

    def _sp_grads(self) -> list[torch.Tensor]:
        """This rank's part of the gradients of sequence-parallel parameters (in the shard, if sharded)."""
        out = []
        offset, lo, hi = 0, self.range.start, self.range.stop
        for p in self.params:
            n = p.numel()
            a, b = max(offset, lo), min(offset + n, hi)
            if getattr(p, "sequence_parallel", False) and b > a:
                out.append(self.grad_shard[a - lo:b - lo])
            offset += n
        return out

    def _norm(self) -> float:
        g = self.grad_shard if self.counted is None else self.grad_shard[self.counted]
        sq = torch.linalg.vector_norm(g).double().square().reshape(1)
        if self.shards > 1:
            collectives.all_reduce(sq, self.groups.dp_group)
        collectives.all_reduce(sq, self.groups.tp_group)
        collectives.all_reduce(sq, self.groups.pp_group)
        return math.sqrt(sq.item())

    def step(self, lr: float) -> tuple[bool, float]:
        """Reduce, unscale, check, clip and update; returns (skipped, grad norm)."""
        self._reduce()
        found_inf = collectives.any_true(not bool(torch.isfinite(self.grad_shard).all()))
        if self.scaler is not None:
            self.scaler.update(found_inf)
        if found_inf:
            return True, float("nan")
        norm = self._norm()
        if self.clip_grad > 0 and norm > self.clip_grad:
            self.grad_shard.mul_(self.clip_grad / (norm + 1e-6))
        for group in self.adam.param_groups:
            group["lr"] = lr
        self.adam.step()
        self._write_back()
        return False, norm

    def state(self) -> dict:
        """This rank's shard of the optimizer, laid out like the master shard: fp32 weights, Adam
        moments, step count, loss scale."""
        moments = {}
        for key in ("exp_avg", "exp_avg_sq"):
            flat = torch.zeros_like(self.master)
            for view, a, b in self._views:
                if view in self.adam.state:
                    flat[a:b] = self.adam.state[view][key]
            moments[key] = flat
        steps = [float(st["step"]) for st in self.adam.state.values()]
        return {"master": self.master.clone(), "numel": sum(p.numel() for p in self.params), **moments,
                "step": steps[0] if steps else 0.0, "scaler": vars(self.scaler).copy() if self.scaler else None}

    def load_state(self, shards: list[dict]) -> None:
        """Restore from the saved shards of all dp ranks (one, when the optimizer was not distributed),
        whatever the current dp size: join them, drop the old padding, cut this rank's shard."""
        numel = shards[0]["numel"]
        if numel != sum(p.numel() for p in self.params):
            raise ValueError("the checkpoint's optimizer holds another number of parameters")

        def mine(key: str) -> torch.Tensor:
            full = torch.cat([s[key] for s in shards])[:numel]
            padded = torch.zeros(self.flat.numel(), dtype=torch.float32)
            padded[:numel] = full
            return padded[self.range].to(self.master.device)

        self.master.copy_(mine("master"))
        self._write_back()
        if shards[0]["step"] > 0:
            exp_avg, exp_avg_sq = mine("exp_avg"), mine("exp_avg_sq")
            for view, a, b in self._views:
                self.adam.state[view] = {"step": torch.tensor(shards[0]["step"], dtype=torch.float32),
                                         "exp_avg": exp_avg[a:b].clone(), "exp_avg_sq": exp_avg_sq[a:b].clone()}
        if self.scaler is not None and shards[0]["scaler"] is not None:
            vars(self.scaler).update(shards[0]["scaler"])

    def _write_back(self) -> None:
        if self.shards > 1:
            collectives.all_gather_flat(self.master.clone(), self.flat, self.groups.dp_group)
        if self.fp32:
            return  # the parameters are views of self.flat
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                p.copy_(self.flat[offset:offset + n].view_as(p))
                offset += n
