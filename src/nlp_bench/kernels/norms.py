"""LayerNorm and RMSNorm in Triton: one kernel for both, statistics in fp32 whatever the input dtype.

Each pass keeps a whole row in registers and the forward saves only the per-row mean and 1/std.
With `persistent` (Megatron's persist-layer-norm, the default) a few programs per multiprocessor
loop over the rows; without it, one program per row. Up to width 8192 the backward is one kernel whose
programs also sum their rows' weight and bias gradients in registers (one partial row each, summed by
torch). Wider rows would spill those accumulators (8x slower at 12288, measured), so there dx and a
second kernel over [rows x column-block] tiles for the parameter gradients run apart.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nlp_bench.kernels.launch import programs, row_block


@triton.jit
def _norm_forward(X, W, B, Y, MEAN, RSTD, stride_x, stride_y, M, N, eps,
                  RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    if HAS_W:
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_B:
        b = tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    for row in range(tl.program_id(0), M, tl.num_programs(0)):
        r = tl.cast(row, tl.int64)
        x = tl.load(X + r * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        if RMS:
            xc = x
        else:
            mean = tl.sum(x, axis=0) / N
            xc = tl.where(mask, x - mean, 0.0)
            tl.store(MEAN + r, mean)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / N + eps)
        tl.store(RSTD + r, rstd)
        y = xc * rstd
        if HAS_W:
            y = y * w
        if HAS_B:
            y = y + b
        tl.store(Y + r * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _norm_backward(X, W, DY, DX, MEAN, RSTD, DW, DB, stride_x, stride_dy, stride_dx, M, N,
                   RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, PARTIALS: tl.constexpr,
                   BLOCK: tl.constexpr):
    """dx and, with PARTIALS, this program's partial weight/bias gradients (kept in registers) in the same
    pass over x and dy: for rows up to 8192 wide, where the accumulators fit beside the row."""
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    if HAS_W:
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    db = tl.zeros([BLOCK], dtype=tl.float32)
    for row in range(tl.program_id(0), M, tl.num_programs(0)):
        r = tl.cast(row, tl.int64)
        x = tl.load(X + r * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + r * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + r)
        if RMS:
            xhat = x * rstd
        else:
            xhat = tl.where(mask, (x - tl.load(MEAN + r)) * rstd, 0.0)
        if HAS_W:
            wdy = dy * w
        else:
            wdy = dy
        c1 = tl.sum(xhat * wdy, axis=0) / N
        if RMS:
            dx = (wdy - xhat * c1) * rstd
        else:
            dx = (wdy - xhat * c1 - tl.sum(wdy, axis=0) / N) * rstd
        tl.store(DX + r * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
        if PARTIALS:
            dw += dy * xhat
            db += dy
    if PARTIALS:
        partial = tl.cast(tl.program_id(0), tl.int64) * N + cols
        if HAS_W:
            tl.store(DW + partial, dw, mask=mask)
        if HAS_B:
            tl.store(DB + partial, db, mask=mask)


@triton.jit
def _norm_param_grads(X, DY, MEAN, RSTD, DW, DB, stride_x, stride_dy, M, N, ROWS_PER_PROGRAM,
                      RMS: tl.constexpr, HAS_B: tl.constexpr, TILE_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Partial sums over a group of rows of dy * xhat (weight) and dy (bias) for a block of columns,
    read as [TILE_M, BLOCK_N] tiles: whole rows would not fit in registers beside the accumulators."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    first = tl.program_id(1) * ROWS_PER_PROGRAM
    dw = tl.zeros([TILE_M, BLOCK_N], dtype=tl.float32)
    db = tl.zeros([TILE_M, BLOCK_N], dtype=tl.float32)
    for start in range(first, first + ROWS_PER_PROGRAM, TILE_M):
        rows = tl.cast(start + tl.arange(0, TILE_M), tl.int64)
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
        if RMS:
            xhat = x * rstd[:, None]
        else:
            xhat = (x - tl.load(MEAN + rows, mask=row_mask, other=0.0)[:, None]) * rstd[:, None]
        dw += dy * xhat
        db += dy
    out = tl.cast(tl.program_id(1), tl.int64) * N + cols
    tl.store(DW + out, tl.sum(dw, axis=0), mask=col_mask)
    if HAS_B:
        tl.store(DB + out, tl.sum(db, axis=0), mask=col_mask)


#: launch settings (benchmark/perf/norm_launch.py times the alternatives on a GPU): warps per program
#: (None: by block width) and, for the persistent launches, programs per multiprocessor
#: fused_backward_max: the widest row whose backward is one kernel with the parameter-gradient sums in
#: registers; wider rows take dx and a tiled parameter-gradient kernel apart (faster above 8192 on an H100)
LAUNCH = {"forward_warps": None, "backward_warps": None, "forward_per_processor": 4, "backward_per_processor": 4,
          "fused_backward_max": 8192}
#: the weight/bias gradient kernel: rows per program (one partial row each), tile rows, columns per program
PARAM_ROWS, PARAM_TILE, PARAM_COLS = 256, 32, 128


def forward_warps(block: int) -> int:
    return min(max(block // 512, 1), 8)


def backward_warps(block: int) -> int:
    return min(max(block // 1024, 4), 16)


def _rows(t: torch.Tensor) -> torch.Tensor:
    t = t.reshape(-1, t.shape[-1])
    return t if t.stride(-1) == 1 else t.contiguous()


class _Norm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, rms, persistent):
        shape, n = x.shape, x.shape[-1]
        x2 = _rows(x)
        m = x2.shape[0]
        y = torch.empty((m, n), dtype=x.dtype, device=x.device)
        mean = torch.empty(m if not rms else 0, dtype=torch.float32, device=x.device)
        rstd = torch.empty(m, dtype=torch.float32, device=x.device)
        block = row_block(n)
        grid = (programs(m, x.device, LAUNCH["forward_per_processor"]) if persistent else m,)
        _norm_forward[grid](x2, weight, bias, y, mean, rstd, x2.stride(0), y.stride(0), m, n, eps,
                            RMS=rms, HAS_W=weight is not None, HAS_B=bias is not None, BLOCK=block,
                            num_warps=LAUNCH["forward_warps"] or forward_warps(block))
        ctx.save_for_backward(x2, weight, bias, mean, rstd)
        ctx.rms, ctx.persistent = rms, persistent
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, bias, mean, rstd = ctx.saved_tensors
        m, n = x2.shape
        dy2 = _rows(dy)
        dx = torch.empty_like(x2)
        if n <= LAUNCH["fused_backward_max"] and (weight is not None or bias is not None):
            dw, db = _fused_backward(ctx.rms, x2, weight, bias, dy2, dx, mean, rstd)
        else:
            dw, db = _split_backward(ctx.rms, ctx.persistent, x2, weight, bias, dy2, dx, mean, rstd)
        return dx.view(dy.shape), dw, db, None, None, None


def _fused_backward(rms, x2, weight, bias, dy2, dx, mean, rstd):
    m, n = x2.shape
    block = row_block(n)
    g = programs(m, x2.device, LAUNCH["backward_per_processor"])
    partial = torch.empty((2, g, n), dtype=torch.float32, device=x2.device)
    _norm_backward[(g,)](x2, weight, dy2, dx, mean, rstd, partial[0], partial[1], x2.stride(0), dy2.stride(0),
                         dx.stride(0), m, n, RMS=rms, HAS_W=weight is not None, HAS_B=bias is not None, PARTIALS=True,
                         BLOCK=block, num_warps=LAUNCH["backward_warps"] or backward_warps(block))
    return _param_grads(partial, weight, bias)


def _split_backward(rms, persistent, x2, weight, bias, dy2, dx, mean, rstd):
    m, n = x2.shape
    block = row_block(n)
    grid = (programs(m, x2.device, LAUNCH["backward_per_processor"]) if persistent else m,)
    _norm_backward[grid](x2, weight, dy2, dx, mean, rstd, None, None, x2.stride(0), dy2.stride(0), dx.stride(0), m, n,
                         RMS=rms, HAS_W=weight is not None, HAS_B=False, PARTIALS=False, BLOCK=block,
                         num_warps=LAUNCH["backward_warps"] or backward_warps(block))
    if weight is None and bias is None:
        return None, None
    groups = triton.cdiv(m, PARAM_ROWS)
    partial = torch.empty((2, groups, n), dtype=torch.float32, device=x2.device)
    _norm_param_grads[(triton.cdiv(n, PARAM_COLS), groups)](
        x2, dy2, mean, rstd, partial[0], partial[1], x2.stride(0), dy2.stride(0), m, n, PARAM_ROWS,
        RMS=rms, HAS_B=bias is not None, TILE_M=PARAM_TILE, BLOCK_N=PARAM_COLS, num_warps=4)
    return _param_grads(partial, weight, bias)


def _param_grads(partial, weight, bias):
    """Sum the per-program partial rows: one reduction for both gradients, one cast where they share a dtype."""
    sums = partial.sum(1)
    if weight is not None and bias is not None and weight.dtype == bias.dtype:
        dw, db = sums.to(weight.dtype)
        return dw, db
    return (None if weight is None else sums[0].to(weight.dtype)), (None if bias is None else sums[1].to(bias.dtype))


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
               persistent: bool = True) -> torch.Tensor:
    return _Norm.apply(x, weight, bias, eps, False, persistent)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, persistent: bool = True) -> torch.Tensor:
    return _Norm.apply(x, weight, None, eps, True, persistent)
