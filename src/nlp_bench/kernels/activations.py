"""Bias + GeLU (tanh approximation, as Megatron's fused bias-gelu) and SwiGLU in Triton.

Both are memory-bound: the fused forward reads the input once and writes the output once instead of
one round trip per eager op, and the backward recomputes the activation from the saved input rather
than saving intermediates. tanh is written with exp: the interpreter has no libdevice.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 1024


@triton.jit
def _tanh(u):
    return 1.0 - 2.0 / (tl.exp(2.0 * u) + 1.0)  # exp overflow gives 1, underflow -1: no nan


@triton.jit
def _bias_gelu_kernel(X, BIAS, DY, OUT, numel, width, HAS_BIAS: tl.constexpr, BACKWARD: tl.constexpr,
                      BLOCK: tl.constexpr):
    offs = tl.cast(tl.program_id(0), tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    z = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        z += tl.load(BIAS + offs % width, mask=mask, other=0.0).to(tl.float32)
    t = _tanh(0.7978845608028654 * z * (1.0 + 0.044715 * z * z))
    if BACKWARD:
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        slope = 0.5 * z * (1.0 - t * t) * (0.7978845608028654 + 0.1070322243 * z * z) + 0.5 * (1.0 + t)
        out = dy * slope
    else:
        out = 0.5 * z * (1.0 + t)
    tl.store(OUT + offs, out.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_kernel(X, DY, OUT, width, stride_x, stride_dy, stride_out, BACKWARD: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.cast(tl.program_id(0), tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(X + row * stride_x + width + cols, mask=mask, other=0.0).to(tl.float32)
    sig = 1.0 / (1.0 + tl.exp(-gate))
    if BACKWARD:
        dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        dgate = dy * up * sig * (1.0 + gate * (1.0 - sig))
        tl.store(OUT + row * stride_out + cols, dgate.to(OUT.dtype.element_ty), mask=mask)
        tl.store(OUT + row * stride_out + width + cols, (dy * gate * sig).to(OUT.dtype.element_ty), mask=mask)
    else:
        tl.store(OUT + row * stride_out + cols, (gate * sig * up).to(OUT.dtype.element_ty), mask=mask)


def _bias_gelu_launch(x: torch.Tensor, bias: torch.Tensor | None, dy: torch.Tensor | None) -> torch.Tensor:
    out = torch.empty_like(x)
    numel = x.numel()
    _bias_gelu_kernel[(triton.cdiv(numel, _BLOCK),)](x, bias, dy, out, numel, x.shape[-1], HAS_BIAS=bias is not None,
                                                    BACKWARD=dy is not None, BLOCK=_BLOCK, num_warps=4)
    return out


class _BiasGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias):
        x = x.contiguous()
        ctx.save_for_backward(x, bias)
        return _bias_gelu_launch(x, bias, None)

    @staticmethod
    def backward(ctx, dy):
        x, bias = ctx.saved_tensors
        dx = _bias_gelu_launch(x, bias, dy.contiguous())
        dbias = dx.reshape(-1, x.shape[-1]).sum(0, dtype=torch.float32).to(bias.dtype) if bias is not None else None
        return dx, dbias


def _swiglu_launch(x2: torch.Tensor, dy2: torch.Tensor | None) -> torch.Tensor:
    rows, width = x2.shape[0], x2.shape[1] // 2
    out = torch.empty_like(x2) if dy2 is not None else torch.empty((rows, width), dtype=x2.dtype, device=x2.device)
    block = min(_BLOCK, max(16, 1 << (width - 1).bit_length()))
    _swiglu_kernel[(rows, triton.cdiv(width, block))](x2, dy2, out, width, x2.stride(0),
                                                      0 if dy2 is None else dy2.stride(0), out.stride(0),
                                                      BACKWARD=dy2 is not None, BLOCK=block, num_warps=4)
    return out


class _Swiglu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        if x.shape[-1] % 2:
            raise ValueError(f"swiglu needs an even last dimension, got {x.shape[-1]}")
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        ctx.save_for_backward(x2)
        ctx.shape = x.shape
        return _swiglu_launch(x2, None).view(*x.shape[:-1], x.shape[-1] // 2)

    @staticmethod
    def backward(ctx, dy):
        (x2,) = ctx.saved_tensors
        return _swiglu_launch(x2, dy.reshape(x2.shape[0], -1).contiguous()).view(ctx.shape)


def triton_bias_gelu(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return _BiasGelu.apply(x, bias)


def triton_swiglu(x: torch.Tensor) -> torch.Tensor:
    return _Swiglu.apply(x)
