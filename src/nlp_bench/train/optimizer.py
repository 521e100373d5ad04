"""Adam(W) over this rank's shard of the flat fp32 weights (grad_buffer.GradBuffer): fp32 master weights,
fp16 loss scaling, clipping by the global norm. With Megatron's distributed optimizer (ZeRO-1) the shard
is 1/dp of the buffer and each dp rank updates its own; otherwise it is the whole buffer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from nlp_bench import kernels
from nlp_bench.train import collectives
from nlp_bench.train.device_adam import DeviceAdamW
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
    decay, biases and norms do not. `on_device` (xla): the inf check, the norm and the clipping stay on the
    device and the update is DeviceAdamW's, so the whole step is one graph; `step` then returns tensors that
    the trainer reads after the step ran, and hands the flag back to `update_scale`."""

    def __init__(self, buffer: GradBuffer, *, betas: tuple[float, float], eps: float, weight_decay: float,
                 clip_grad: float, scaler: LossScaler | None, on_device: bool = False) -> None:
        self.buffer, self.scaler, self.clip_grad = buffer, scaler, clip_grad
        lo = buffer.range.start
        # fp32: the master shard is the parameters' own memory; bf16/fp16: a shard of the fp32 copy
        self.master = buffer.weights[buffer.range]
        by_decay: dict[float, list[nn.Parameter]] = {weight_decay: [], 0.0: []}
        self._views: list[tuple[nn.Parameter, int, int]] = []  # (view, start, end) within the shard
        decayed: list[tuple[int, int]] = []
        for p, start in zip(buffer.params, buffer.offsets, strict=True):
            a, b = max(start, lo), min(start + p.numel(), lo + buffer.shard_size)
            if b > a:
                view = nn.Parameter(self.master[a - lo:b - lo], requires_grad=False)
                view.grad = buffer.grad_shard[a - lo:b - lo]
                by_decay[weight_decay if p.ndim >= 2 else 0.0].append(view)
                self._views.append((view, a - lo, b - lo))
                if p.ndim >= 2:
                    decayed.append((a - lo, b - lo))
        param_groups = [{"params": v, "weight_decay": wd} for wd, v in by_decay.items() if v]
        self.on_device = None
        if on_device:
            self.on_device = DeviceAdamW(self.master, buffer.grad_shard, decayed, betas=betas, eps=eps,
                                         weight_decay=weight_decay)
        elif kernels.select.runs_triton("adam", self.master):
            self.adam = kernels.FusedAdam(param_groups, lr=0.0, betas=betas, eps=eps, use_triton=True)
        else:
            self.adam = torch.optim.AdamW(param_groups, lr=0.0, betas=betas, eps=eps,
                                          fused=self.master.device.type in ("cpu", "cuda") or None)

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale if self.scaler else 1.0

    @property
    def shards(self) -> int:
        return self.buffer.shards

    def _norm_squared(self, g: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The square of the global gradient norm in `dtype`, summed over the groups that split the gradients
        (the local norm is taken in the gradients' own dtype: no copy of the shard)."""
        buffer, groups = self.buffer, self.buffer.groups
        sq = torch.linalg.vector_norm(g).to(dtype).square().reshape(1)
        if buffer.shards > 1:
            collectives.all_reduce(sq, groups.dp_group)
        collectives.all_reduce(sq, groups.tp_group)
        experts = buffer.grad_shard[buffer.expert_range]
        if experts.numel():  # one whole copy of every expert lies over expert tp x ep
            sq = sq + collectives.all_reduce(torch.linalg.vector_norm(experts).to(dtype).square().reshape(1),
                                             groups.experts.tp_ep_group)
        collectives.all_reduce(sq, groups.pp_group)
        return sq

    def step(self, lr: float) -> tuple[bool, float] | tuple[torch.Tensor, torch.Tensor]:
        """Reduce, unscale, check, clip and update; returns (skipped, grad norm)."""
        self.buffer.reduce(self.loss_scale)
        if self.on_device is not None:
            return self._step_on_device(lr)
        grads, buffer = self.buffer.grad_shard, self.buffer
        found_inf = collectives.any_true(not bool(torch.isfinite(grads).all()), buffer.groups.host)
        if found_inf:
            return True, float("nan")
        g = grads if buffer.counted is None else grads[buffer.counted]
        norm = math.sqrt(self._norm_squared(g, torch.float64).item())
        if self.clip_grad > 0 and norm > self.clip_grad:
            grads.mul_(self.clip_grad / (norm + 1e-6))
        for group in self.adam.param_groups:
            group["lr"] = lr
        self.adam.step()
        self.buffer.write_back(self.master)
        return False, norm

    def _step_on_device(self, lr: float) -> tuple[torch.Tensor, torch.Tensor]:
        """The same step with no host read: (1.0 where skipped, the norm), both on the device. fp32 throughout,
        as Neuron has no fp64."""
        grads, buffer = self.buffer.grad_shard, self.buffer
        skipped = collectives.any_on_device(~torch.isfinite(grads).all(), dist.group.WORLD)
        g = grads if buffer.counted is None else torch.where(buffer.counted, grads, torch.zeros_like(grads))
        norm = self._norm_squared(g, torch.float32).sqrt()
        if self.clip_grad > 0:  # Megatron's rule: multiply by clip / (norm + 1e-6) where that is below 1
            grads.mul_((self.clip_grad / (norm + 1e-6)).clamp(max=1.0))
        self.on_device.step(lr, 1.0 - skipped)
        self.buffer.write_back(self.master)
        return skipped.reshape(()), norm.reshape(())

    def update_scale(self, skipped: bool) -> None:
        """The loss scale after a step (fp16), once the host knows whether the step was skipped."""
        if self.scaler is not None:
            self.scaler.update(skipped)

    def state(self) -> dict:
        """This rank's shard of the optimizer, laid out like the master shard: fp32 weights, Adam
        moments, step count, loss scale."""
        if self.on_device is not None:
            adam = self.on_device
            return {"master": self.master.clone(), "numel": self.buffer.numel, "exp_avg": adam.exp_avg.clone(),
                    "exp_avg_sq": adam.exp_avg_sq.clone(), "step": float(adam.steps),
                    "scaler": vars(self.scaler).copy() if self.scaler else None}
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
            if self.on_device is not None:
                self.on_device.load(exp_avg, exp_avg_sq, shards[0]["step"])
            for view, a, b in self._views if self.on_device is None else ():
                self.adam.state[view] = {"step": torch.tensor(shards[0]["step"], dtype=torch.float32),
                                         "exp_avg": exp_avg[a:b].clone(), "exp_avg_sq": exp_avg_sq[a:b].clone()}
        if self.scaler is not None and shards[0]["scaler"] is not None:
            vars(self.scaler).update(shards[0]["scaler"])
