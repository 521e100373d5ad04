"""FusedAdam: Adam(W) over many tensors with fp32 master weights (Apex's FusedAdam without the build).

A half-precision parameter gets an fp32 master copy in the optimizer's state and receives the rounded
update. Each tensor is updated by the Triton kernel of nlp_bench.kernels.adam where Triton runs,
otherwise by the same arithmetic in eager torch.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from nlp_bench.kernels import eager, select


class FusedAdam(torch.optim.Optimizer):
    """Adam, or AdamW with `adam_w_mode` (the default, as Apex's FusedAdam), over contiguous tensors.

    `use_triton` is decided by nlp_bench.kernels (the chosen implementation and the tensors' device);
    the torch path runs the same arithmetic eagerly."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, adam_w_mode: bool = True,
                 use_triton: bool | None = None) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"FusedAdam: invalid lr={lr}, betas={betas}, eps={eps} or weight_decay={weight_decay}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.adam_w_mode = adam_w_mode
        self.use_triton = use_triton

    def _state(self, p: torch.Tensor) -> dict:
        state = self.state[p]
        if not state:
            if not p.is_contiguous():
                raise ValueError("FusedAdam updates contiguous tensors only")
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
            if p.dtype != torch.float32:
                state["master"] = p.detach().float()
        return state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self._state(p)
                state["step"] = int(state["step"]) + 1  # a restored checkpoint holds it as a tensor
                master = state.get("master", p)
                args = dict(lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                            weight_decay=group["weight_decay"], step=state["step"], decoupled=self.adam_w_mode)
                triton_here = self.use_triton if self.use_triton is not None else select.runs_triton("adam", p)
                if triton_here:
                    from nlp_bench.kernels.adam import triton_adam_step

                    triton_adam_step(master, p.grad.contiguous(), state["exp_avg"], state["exp_avg_sq"],
                                     None if master is p else p, **args)
                else:
                    eager.eager_adam_step(master, p.grad, state["exp_avg"], state["exp_avg_sq"], **args)
                    if master is not p:
                        p.copy_(master)
        return loss
