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

from nlp_bench.train import collectives
from nlp_bench.train.grid import Grid


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
    a hook moves each half-precision gradient into the fp32 buffer as soon as it exists."""

    def __init__(self, model: nn.Module, grid: Grid, *, lr_betas_eps: tuple[float, float, float], weight_decay: float,
                 clip_grad: float, distributed: bool, scaler: LossScaler | None) -> None:
        self.model, self.grid, self.scaler = model, grid, scaler
        self.beta1, self.beta2, self.eps = lr_betas_eps
        self.weight_decay, self.clip_grad = weight_decay, clip_grad
        params = [p for p in model.parameters() if p.requires_grad]
        # weight-decayed matrices first, then biases and norms: each is one contiguous region of the buffer
        self.params = [p for p in params if p.ndim >= 2] + [p for p in params if p.ndim < 2]
        boundary = sum(p.numel() for p in self.params if p.ndim >= 2)
        device = self.params[0].device
        numel = sum(p.numel() for p in self.params)
        self.shards = grid.dp if distributed else 1
        padded = -(-numel // self.shards) * self.shards
        self.fp32 = all(p.dtype == torch.float32 for p in self.params)
        self.main_grad = torch.zeros(padded, dtype=torch.float32, device=device)
        flat = torch.zeros(padded, dtype=torch.float32, device=device)
        counted = torch.zeros(padded, dtype=torch.float32, device=device)
        offset = 0
        for p in self.params:
            n = p.numel()
            flat[offset:offset + n] = p.detach().reshape(-1).float()
            p.main_grad = self.main_grad[offset:offset + n].view_as(p)
            if self.fp32:
                p.data = flat[offset:offset + n].view_as(p)
                p.grad = p.main_grad  # autograd adds into the buffer in place
            else:
                p.register_post_accumulate_grad_hook(_accumulate)
            # the global norm counts tp shards on every rank, replicated tensors and tied copies once
            once = getattr(p, "tensor_parallel", False) or grid.tp_rank == 0
            counted[offset:offset + n] = 1.0 if once and not getattr(p, "shared_copy", False) else 0.0
            offset += n
        self.shard_size = padded // self.shards
        lo = (grid.dp_rank if distributed else 0) * self.shard_size
        self.range = slice(lo, lo + self.shard_size)
        # fp32: the master shard is the parameters' own memory; bf16/fp16: a shard of the fp32 copy
        self.flat = flat
        self.master = flat[self.range]
        counted = counted[self.range]
        self.counted = None if bool(counted.all()) else counted.bool()
        self.grad_shard = self.main_grad if self.shards == 1 else torch.zeros_like(self.master)
        # torch's fused AdamW runs on views of the master shard, one group with weight decay, one without
        groups = []
        for a, b, wd in ((lo, min(lo + self.shard_size, boundary), weight_decay),
                         (max(lo, boundary), lo + self.shard_size, 0.0)):
            if b > a:
                view = nn.Parameter(self.master[a - lo:b - lo], requires_grad=False)
                view.grad = self.grad_shard[a - lo:b - lo]
                groups.append({"params": [view], "weight_decay": wd})
        self.adam = torch.optim.AdamW(groups, lr=0.0, betas=(self.beta1, self.beta2), eps=self.eps, fused=True)

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale if self.scaler else 1.0

    def zero_grad(self) -> None:
        self.main_grad.zero_()

    def _reduce(self) -> None:
        grid = self.grid
        collectives.all_reduce_grads([p.main_grad for p in self.params if getattr(p, "sequence_parallel", False)],
                                     grid.tp_group)
        tied = self.model.tied_weights() if hasattr(self.model, "tied_weights") else []
        collectives.all_reduce_grads([p.main_grad for p in tied], grid.embedding_group)
        if self.shards > 1:
            collectives.reduce_scatter_flat(self.main_grad, self.grad_shard, grid.dp_group)
        else:
            collectives.all_reduce(self.main_grad, grid.dp_group)
        self.grad_shard.div_(grid.dp * self.loss_scale)

    def _norm(self) -> float:
        g = self.grad_shard if self.counted is None else self.grad_shard[self.counted]
        sq = torch.linalg.vector_norm(g).double().square().reshape(1)
        if self.shards > 1:
            collectives.all_reduce(sq, self.grid.dp_group)
        collectives.all_reduce(sq, self.grid.tp_group)
        collectives.all_reduce(sq, self.grid.pp_group)
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
        """This rank's shard of the optimizer: fp32 master weights, Adam moments, step, loss scale."""
        groups = [self.adam.state[g["params"][0]] for g in self.adam.param_groups]
        return {
            "master": self.master.clone(), "numel": sum(p.numel() for p in self.params),
            "exp_avg": torch.cat([st["exp_avg"] for st in groups]) if groups[0] else None,
            "exp_avg_sq": torch.cat([st["exp_avg_sq"] for st in groups]) if groups[0] else None,
            "step": float(groups[0]["step"]) if groups[0] else 0.0,
            "scaler": vars(self.scaler).copy() if self.scaler else None,
        }

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
        if shards[0]["exp_avg"] is not None:
            exp_avg, exp_avg_sq = mine("exp_avg"), mine("exp_avg_sq")
            offset = 0
            for group in self.adam.param_groups:
                view = group["params"][0]
                n = view.numel()
                self.adam.state[view] = {
                    "step": torch.tensor(shards[0]["step"], dtype=torch.float32),
                    "exp_avg": exp_avg[offset:offset + n].clone().view_as(view),
                    "exp_avg_sq": exp_avg_sq[offset:offset + n].clone().view_as(view),
                }
                offset += n
        if self.scaler is not None and shards[0]["scaler"] is not None:
            vars(self.scaler).update(shards[0]["scaler"])

    def _write_back(self) -> None:
        if self.shards > 1:
            collectives.all_gather_flat(self.master.clone(), self.flat, self.grid.dp_group)
        if self.fp32:
            return  # the parameters are views of self.flat
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                p.copy_(self.flat[offset:offset + n].view_as(p))
                offset += n



def _accumulate(p: torch.Tensor) -> None:
    """Move a fresh gradient into the fp32 buffer (fp32 accumulation over micro-batches)."""
    p.main_grad.add_(p.grad)
    p.grad = None
