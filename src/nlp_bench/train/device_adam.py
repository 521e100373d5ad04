"""AdamW over a flat fp32 shard whose every decision stays on the device: whether the step counts (no inf or
NaN in the gradients), the clipping coefficient, the step count behind the bias corrections.

On xla a host read inside the step cuts the step's graph in two (torch-xla runs what is pending to answer
it), so the flag and the norm must reach the update as tensors. torch's AdamW takes a device-side skip flag
only in its fused CPU and CUDA kernels, and torch-xla's sync-free AdamW exists only where torch-xla does (the
CPU stand-in and the tests without it could not run the same code), hence this small one. Its arithmetic is
torch's AdamW's (decoupled weight decay, bias corrections, eps added after the square root).
"""

from __future__ import annotations

import torch


class DeviceAdamW:
    """`decayed`: the (start, end) runs of the shard that take weight decay (matrices, not biases or norms)."""

    def __init__(self, master: torch.Tensor, grads: torch.Tensor, decayed: list[tuple[int, int]], *,
                 betas: tuple[float, float], eps: float, weight_decay: float) -> None:
        self.master, self.grads, self.decayed = master, grads, _merged(decayed)
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay
        self.exp_avg = torch.zeros_like(master)
        self.exp_avg_sq = torch.zeros_like(master)
        self.steps = torch.zeros((), dtype=torch.float32, device=master.device)

    def step(self, lr: float, good: torch.Tensor) -> None:
        """One update of every element, weighted by `good` (1.0: the step counts; 0.0: everything stays as it
        was, whatever the gradients hold)."""
        beta1, beta2 = self.betas
        good = good.reshape(())
        g = torch.where(good > 0, self.grads, torch.zeros_like(self.grads))
        self.steps.add_(good)
        rate = good * lr
        if self.weight_decay:
            keep = 1.0 - rate * self.weight_decay
            for a, b in self.decayed:
                self.master[a:b].mul_(keep)
        self.exp_avg.mul_(1.0 - (1.0 - beta1) * good).add_(g, alpha=1.0 - beta1)
        self.exp_avg_sq.mul_(1.0 - (1.0 - beta2) * good).addcmul_(g, g, value=1.0 - beta2)
        steps = self.steps.clamp(min=1.0)  # a first step that is skipped must not divide by zero
        correction1 = 1.0 - torch.pow(beta1, steps)
        correction2 = 1.0 - torch.pow(beta2, steps)
        denominator = (self.exp_avg_sq.sqrt() / correction2.sqrt()).add_(self.eps)
        self.master.sub_(self.exp_avg / denominator * (rate / correction1))

    def load(self, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, steps: float) -> None:
        self.exp_avg.copy_(exp_avg)
        self.exp_avg_sq.copy_(exp_avg_sq)
        self.steps.fill_(steps)


def _merged(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Neighbouring runs joined, so the update slices the shard as few times as it can."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(runs):
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out
