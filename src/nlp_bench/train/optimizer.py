"""Adam(W) over this rank's shard of the flat fp32 weights (grad_buffer.GradBuffer): fp32 master weights,
fp16 loss scaling, clipping by the global norm. With Megatron's distributed optimizer (ZeRO-1) the shard
is 1/dp of the buffer and each dp rank updates its own; otherwise it is the whole buffer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from nlp_bench import kernels
from nlp_bench.train import collectives
from nlp_bench.train.grad_buffer import GradBuffer


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
    """A fused AdamW (nlp_bench.kernels' on a GPU, else torch's) on views of the master shard: matrices
    decay, biases and norms do not."""

    def __init__(self, buffer: GradBuffer, *, betas: tuple[float, float], eps: float, weight_decay: float,
                 clip_grad: float, scaler: LossScaler | None) -> None:
        self.buffer, self.scaler, self.clip_grad = buffer, scaler, clip_grad
        lo = buffer.range.start
        # fp32: the master shard is the parameters' own memory; bf16/fp16: a shard of the fp32 copy
        self.master = buffer.weights[buffer.range]
        by_decay: dict[float, list[nn.Parameter]] = {weight_decay: [], 0.0: []}
        self._views: list[tuple[nn.Parameter, int, int]] = []  # (view, start, end) within the shard
        for p, start in zip(buffer.params, buffer.offsets, strict=True):
            a, b = max(start, lo), min(start + p.numel(), lo + buffer.shard_size)
            if b > a:
                view = nn.Parameter(self.master[a - lo:b - lo], requires_grad=False)
                view.grad = buffer.grad_shard[a - lo:b - lo]
                by_decay[weight_decay if p.ndim >= 2 else 0.0].append(view)
                self._views.append((view, a - lo, b - lo))
        param_groups = [{"params": v, "weight_decay": wd} for wd, v in by_decay.items() if v]
        if kernels.select.runs_triton("adam", self.master):
            self.adam = kernels.FusedAdam(param_groups, lr=0.0, betas=betas, eps=eps, use_triton=True)
        else:
            # torch's fused kernel exists for CPU and CUDA; an xla device gets the plain loop
            self.adam = torch.optim.AdamW(param_groups, lr=0.0, betas=betas, eps=eps,
                                          fused=self.master.device.type in ("cpu", "cuda") or None)

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale if self.scaler else 1.0

    @property
    def shards(self) -> int:
        return self.buffer.shards

    def _norm(self) -> float:
        buffer, groups = self.buffer, self.buffer.groups
        g = buffer.grad_shard if buffer.counted is None else buffer.grad_shard[buffer.counted]
        sq = torch.linalg.vector_norm(g).double().square().reshape(1)
        if buffer.shards > 1:
            collectives.all_reduce(sq, groups.dp_group)
        collectives.all_reduce(sq, groups.tp_group)
        collectives.all_reduce(sq, groups.pp_group)
        return math.sqrt(sq.item())

    def step(self, lr: float) -> tuple[bool, float]:
        """Reduce, unscale, check, clip and update; returns (skipped, grad norm)."""
        self.buffer.reduce(self.loss_scale)
        grads = self.buffer.grad_shard
        found_inf = collectives.any_true(not bool(torch.isfinite(grads).all()))
        if self.scaler is not None:
            self.scaler.update(found_inf)
        if found_inf:
            return True, float("nan")
        norm = self._norm()
        if self.clip_grad > 0 and norm > self.clip_grad:
            grads.mul_(self.clip_grad / (norm + 1e-6))
        for group in self.adam.param_groups:
            group["lr"] = lr
        self.adam.step()
        self.buffer.write_back(self.master)
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
        return {"master": self.master.clone(), "numel": self.buffer.numel, **moments,
                "step": steps[0] if steps else 0.0, "scaler": vars(self.scaler).copy() if self.scaler else None}

    def load_state(self, shards: list[dict]) -> None:
        """Restore from the saved shards of all dp ranks (one, when the optimizer was not distributed),
        whatever the current dp size: join them, drop the old padding, cut this rank's shard."""
        numel = shards[0]["numel"]
        if numel != self.buffer.numel:
            raise ValueError("the checkpoint's optimizer holds another number of parameters")

        def mine(key: str) -> torch.Tensor:
            full = torch.cat([s[key] for s in shards])[:numel]
            padded = torch.zeros(self.buffer.weights.numel(), dtype=torch.float32)
            padded[:numel] = full
            return padded[self.buffer.range].to(self.master.device)

        self.master.copy_(mine("master"))
        self.buffer.write_back(self.master)
        if shards[0]["step"] > 0:
            exp_avg, exp_avg_sq = mine("exp_avg"), mine("exp_avg_sq")
            for view, a, b in self._views:
                self.adam.state[view] = {"step": torch.tensor(shards[0]["step"], dtype=torch.float32),
                                         "exp_avg": exp_avg[a:b].clone(), "exp_avg_sq": exp_avg_sq[a:b].clone()}
        if self.scaler is not None and shards[0]["scaler"] is not None:
            vars(self.scaler).update(shards[0]["scaler"])
