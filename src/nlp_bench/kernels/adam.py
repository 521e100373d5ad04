"""The Adam(W) step of FusedAdam in Triton: one pass reads the gradient in its own dtype, updates the
fp32 master weight and both moments, and writes the rounded weight back to a half-precision model,
where eager code needs a separate cast and copy."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

_BLOCK = 2048


@triton.jit
def _adam_kernel(P, G, M, V, OUT, numel, decay, beta1, beta2, eps, weight_decay, step_size, bias_correction2_sqrt,
                 DECOUPLED: tl.constexpr, HAS_OUT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.cast(tl.program_id(0), tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    p = tl.load(P + offs, mask=mask, other=0.0)
    g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(M + offs, mask=mask, other=0.0)
    v = tl.load(V + offs, mask=mask, other=0.0)
    if DECOUPLED:
        p = p * decay
    else:
        g = g + weight_decay * p
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    p = p - step_size * m / (tl.sqrt(v) / bias_correction2_sqrt + eps)
    tl.store(P + offs, p, mask=mask)
    tl.store(M + offs, m, mask=mask)
    tl.store(V + offs, v, mask=mask)
    if HAS_OUT:
        tl.store(OUT + offs, p.to(OUT.dtype.element_ty), mask=mask)


def triton_adam_step(master: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                     out: torch.Tensor | None, *, lr: float, beta1: float, beta2: float, eps: float,
                     weight_decay: float, step: int, decoupled: bool) -> None:
    numel = master.numel()
    _adam_kernel[(triton.cdiv(numel, _BLOCK),)](
        master, grad, exp_avg, exp_avg_sq, out, numel, 1.0 - lr * weight_decay, beta1, beta2, eps, weight_decay,
        lr / (1.0 - beta1 ** step), math.sqrt(1.0 - beta2 ** step), DECOUPLED=decoupled, HAS_OUT=out is not None,
        BLOCK=_BLOCK, num_warps=4)
