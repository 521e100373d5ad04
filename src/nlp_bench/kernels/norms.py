"""LayerNorm and RMSNorm in Triton: one kernel for both, statistics in fp32 whatever the input dtype.

Each pass keeps whole rows in registers (one, or a [rows x width] tile of a few) and the forward saves
only the per-row mean and 1/std. With `persistent` (Megatron's persist-layer-norm, the default) a few
programs per multiprocessor loop over the rows; without it, one program per tile. Up to width 8192 the
backward is one kernel whose programs also sum their rows' weight and bias gradients in registers (one
partial row each, summed by a small kernel). Wider rows would spill those accumulators (8x slower at
12288, measured), so there dx and a second kernel over [rows x column-block] tiles for the parameter
gradients run apart. Chunked kernels, which read a row twice and hold one chunk, are a launch option for
wide rows (see norm_settings.LAUNCH).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nlp_bench.kernels.blocks import programs, row_block
from nlp_bench.kernels.norm_settings import settings


@triton.jit
def _tile(PTR, start, stride, cols, M, N, ROWS: tl.constexpr):
    """Rows start .. start + ROWS of an [M, N] matrix in its own dtype; rows and columns outside read as 0."""
    rows = tl.cast(start, tl.int64) + tl.arange(0, ROWS)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    return tl.load(PTR + rows[:, None] * stride + cols[None, :], mask=mask, other=0.0)


@triton.jit
def _norm_forward(X, W, B, Y, MEAN, RSTD, stride_x, stride_y, M, N, eps,
                  RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, ROWS: tl.constexpr,
                  PREFETCH: tl.constexpr, BLOCK: tl.constexpr):
    """ROWS rows at a time as one [ROWS, BLOCK] tile: more bytes in flight per program for the same
    weight and bias registers. With PREFETCH a persistent program loads its next tile before it reduces
    this one, so its loads overlap its arithmetic."""
    cols = tl.arange(0, BLOCK)
    col_mask = cols < N
    if HAS_W:
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    if HAS_B:
        b = tl.load(B + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    first, step = tl.program_id(0) * ROWS, tl.num_programs(0) * ROWS
    if PREFETCH:
        x_next = _tile(X, first, stride_x, cols, M, N, ROWS)
    for start in range(first, M, step):
        if PREFETCH:
            x = x_next.to(tl.float32)
            x_next = _tile(X, start + step, stride_x, cols, M, N, ROWS)
        else:
            x = _tile(X, start, stride_x, cols, M, N, ROWS).to(tl.float32)
        rows = tl.cast(start, tl.int64) + tl.arange(0, ROWS)
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        if RMS:
            xc = x
        else:
            mean = tl.sum(x, axis=1) / N
            xc = tl.where(mask, x - mean[:, None], 0.0)
            tl.store(MEAN + rows, mean, mask=row_mask)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / N + eps)
        tl.store(RSTD + rows, rstd, mask=row_mask)
        y = xc * rstd[:, None]
        if HAS_W:
            y = y * w
        if HAS_B:
            y = y + b
        tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _norm_backward(X, W, DY, DX, MEAN, RSTD, DW, DB, stride_x, stride_dy, stride_dx, M, N,
                   RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, PARTIALS: tl.constexpr,
                   ROWS: tl.constexpr, PREFETCH: tl.constexpr, BLOCK: tl.constexpr):
    """dx and, with PARTIALS, this program's partial weight/bias gradients (kept in registers) in the same
    pass over x and dy: for rows up to 8192 wide, where the accumulators fit beside the rows. PREFETCH as
    in the forward."""
    cols = tl.arange(0, BLOCK)
    col_mask = cols < N
    if HAS_W:
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    db = tl.zeros([BLOCK], dtype=tl.float32)
    first, step = tl.program_id(0) * ROWS, tl.num_programs(0) * ROWS
    if PREFETCH:
        x_next = _tile(X, first, stride_x, cols, M, N, ROWS)
        dy_next = _tile(DY, first, stride_dy, cols, M, N, ROWS)
    for start in range(first, M, step):
        if PREFETCH:
            x, dy = x_next.to(tl.float32), dy_next.to(tl.float32)
            x_next = _tile(X, start + step, stride_x, cols, M, N, ROWS)
            dy_next = _tile(DY, start + step, stride_dy, cols, M, N, ROWS)
        else:
            x = _tile(X, start, stride_x, cols, M, N, ROWS).to(tl.float32)
            dy = _tile(DY, start, stride_dy, cols, M, N, ROWS).to(tl.float32)
        rows = tl.cast(start, tl.int64) + tl.arange(0, ROWS)
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)[:, None]
        if RMS:
            xhat = x * rstd
        else:
            xhat = tl.where(mask, (x - tl.load(MEAN + rows, mask=row_mask, other=0.0)[:, None]) * rstd, 0.0)
        if HAS_W:
            wdy = dy * w
        else:
            wdy = dy
        c1 = tl.sum(xhat * wdy, axis=1)[:, None] / N
        if RMS:
            dx = (wdy - xhat * c1) * rstd
        else:
            dx = (wdy - xhat * c1 - tl.sum(wdy, axis=1)[:, None] / N) * rstd
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        if PARTIALS:
            dw += tl.sum(dy * xhat, axis=0)
            db += tl.sum(dy, axis=0)
    if PARTIALS:
        partial = tl.cast(tl.program_id(0), tl.int64) * N + cols
        if HAS_W:
            tl.store(DW + partial, dw, mask=col_mask)
        if HAS_B:
            tl.store(DB + partial, db, mask=col_mask)


@triton.jit
def _norm_forward_chunked(X, W, B, Y, MEAN, RSTD, stride_x, stride_y, M, N, eps,
                          RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, CHUNK: tl.constexpr):
    """A row too wide to hold in registers without spilling, CHUNK columns at a time: the statistics in a
    first pass (each chunk's mean and squared deviations merged as Chan et al. do, as stable as the whole-row
    pass), the output in a second that reads the row again, from cache."""
    for row in range(tl.program_id(0), M, tl.num_programs(0)):
        r = tl.cast(row, tl.int64)
        mean = 0.0
        m2 = 0.0
        for start in range(0, N, CHUNK):
            cols = start + tl.arange(0, CHUNK)
            mask = cols < N
            x = tl.load(X + r * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
            if RMS:
                m2 += tl.sum(x * x, axis=0)
            else:
                count = tl.minimum(N - start, CHUNK).to(tl.float32)
                chunk_mean = tl.sum(x, axis=0) / count
                d = tl.where(mask, x - chunk_mean, 0.0)
                before = start * 1.0
                delta = chunk_mean - mean
                m2 += tl.sum(d * d, axis=0) + delta * delta * before * count / (before + count)
                mean += delta * count / (before + count)
        rstd = 1.0 / tl.sqrt(m2 / N + eps)
        tl.store(RSTD + r, rstd)
        if not RMS:
            tl.store(MEAN + r, mean)
        for start in range(0, N, CHUNK):
            cols = start + tl.arange(0, CHUNK)
            mask = cols < N
            x = tl.load(X + r * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
            y = (x - mean) * rstd
            if HAS_W:
                y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
            if HAS_B:
                y = y + tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(Y + r * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _chunk_terms(X, W, DY, r, stride_x, stride_dy, cols, mask, mean, rstd, HAS_W: tl.constexpr):
    """xhat and weight * dy of one chunk of row r (zero where masked: dy is loaded as zero there)."""
    xhat = (tl.load(X + r * stride_x + cols, mask=mask, other=0.0).to(tl.float32) - mean) * rstd
    wdy = tl.load(DY + r * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_W:
        wdy = wdy * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    return xhat, wdy


@triton.jit
def _norm_backward_chunked(X, W, DY, DX, MEAN, RSTD, stride_x, stride_dy, stride_dx, M, N,
                           RMS: tl.constexpr, HAS_W: tl.constexpr, CHUNK: tl.constexpr):
    """dx of a wide row, CHUNK columns at a time: the two row sums in a first pass, dx in a second that reads
    x and dy again, from cache (the weight and bias gradients are _norm_param_grads')."""
    for row in range(tl.program_id(0), M, tl.num_programs(0)):
        r = tl.cast(row, tl.int64)
        rstd = tl.load(RSTD + r)
        if RMS:
            mean = 0.0
        else:
            mean = tl.load(MEAN + r)
        c1 = 0.0
        c2 = 0.0
        for start in range(0, N, CHUNK):
            cols = start + tl.arange(0, CHUNK)
            xhat, wdy = _chunk_terms(X, W, DY, r, stride_x, stride_dy, cols, cols < N, mean, rstd, HAS_W)
            c1 += tl.sum(xhat * wdy, axis=0)
            if not RMS:
                c2 += tl.sum(wdy, axis=0)
        c1 = c1 / N
        c2 = c2 / N
        for start in range(0, N, CHUNK):
            cols = start + tl.arange(0, CHUNK)
            xhat, wdy = _chunk_terms(X, W, DY, r, stride_x, stride_dy, cols, cols < N, mean, rstd, HAS_W)
            tl.store(DX + r * stride_dx + cols, ((wdy - xhat * c1 - c2) * rstd).to(DX.dtype.element_ty),
                     mask=cols < N)


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


@triton.jit
def _sum_partials(PW, PB, DW, DB, G, N, HAS_W: tl.constexpr, HAS_B: tl.constexpr, TILE_G: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    """The weight and bias gradients: the G partial rows summed in fp32 and written in the parameters' dtype,
    one launch where a torch reduction and a cast would take two."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    dw = tl.zeros([TILE_G, BLOCK_N], dtype=tl.float32)
    db = tl.zeros([TILE_G, BLOCK_N], dtype=tl.float32)
    for start in range(0, G, TILE_G):
        rows = tl.cast(start, tl.int64) + tl.arange(0, TILE_G)
        mask = (rows < G)[:, None] & col_mask[None, :]
        offsets = rows[:, None] * N + cols[None, :]
        if HAS_W:
            dw += tl.load(PW + offsets, mask=mask, other=0.0)
        if HAS_B:
            db += tl.load(PB + offsets, mask=mask, other=0.0)
    if HAS_W:
        tl.store(DW + cols, tl.sum(dw, axis=0).to(DW.dtype.element_ty), mask=col_mask)
    if HAS_B:
        tl.store(DB + cols, tl.sum(db, axis=0).to(DB.dtype.element_ty), mask=col_mask)


#: summing the partial rows: rows per tile, columns per program
SUM_TILE, SUM_COLS = 32, 32


def forward_warps(block: int) -> int:
    return min(max(block // 512, 1), 8)


def backward_warps(block: int) -> int:
    return min(max(block // 1024, 4), 16)


def _grid(m: int, rows: int, device: torch.device, per_processor: int, persistent: bool) -> int:
    """Programs over m rows taken `rows` at a time: a few per multiprocessor, or one per tile."""
    tiles = triton.cdiv(m, rows)
    return programs(tiles, device, per_processor) if persistent else tiles


def _chunk(width: int, chunk: int) -> int:
    """The chunk width for a row of `width` (0: the whole row in one block)."""
    return chunk if 0 < chunk < width else 0


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
        launch = settings(n)
        chunk = _chunk(n, launch["forward_chunk"])
        block, rows = row_block(n), 1 if chunk else launch["forward_rows"]
        grid = (_grid(m, rows, x.device, launch["forward_per_processor"], persistent),)
        flags = dict(RMS=rms, HAS_W=weight is not None, HAS_B=bias is not None)
        args = (x2, weight, bias, y, mean, rstd, x2.stride(0), y.stride(0), m, n, eps)
        if chunk:
            _norm_forward_chunked[grid](*args, **flags, CHUNK=chunk,
                                        num_warps=launch["forward_warps"] or forward_warps(chunk))
        else:
            _norm_forward[grid](*args, **flags, ROWS=rows, PREFETCH=persistent and launch["forward_prefetch"],
                                BLOCK=block, num_warps=launch["forward_warps"] or forward_warps(block))
        ctx.save_for_backward(x2, weight, bias, mean, rstd)
        ctx.rms, ctx.persistent = rms, persistent
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, bias, mean, rstd = ctx.saved_tensors
        m, n = x2.shape
        dy2 = _rows(dy)
        dx = torch.empty_like(x2)
        launch = settings(n)
        if n <= launch["fused_backward_max"] and (weight is not None or bias is not None):
            dw, db = _fused_backward(launch, ctx.rms, x2, weight, bias, dy2, dx, mean, rstd)
        else:
            dw, db = _split_backward(launch, ctx.rms, ctx.persistent, x2, weight, bias, dy2, dx, mean, rstd)
        return dx.view(dy.shape), dw, db, None, None, None


def _fused_backward(launch, rms, x2, weight, bias, dy2, dx, mean, rstd):
    m, n = x2.shape
    block, rows = row_block(n), launch["backward_rows"]
    g = _grid(m, rows, x2.device, launch["backward_per_processor"], True)
    partial = torch.empty((2, g, n), dtype=torch.float32, device=x2.device)
    _norm_backward[(g,)](x2, weight, dy2, dx, mean, rstd, partial[0], partial[1], x2.stride(0), dy2.stride(0),
                         dx.stride(0), m, n, RMS=rms, HAS_W=weight is not None, HAS_B=bias is not None, PARTIALS=True,
                         ROWS=rows, PREFETCH=launch["backward_prefetch"], BLOCK=block,
                         num_warps=launch["backward_warps"] or backward_warps(block))
    return _param_grads(partial, weight, bias)


def _split_backward(launch, rms, persistent, x2, weight, bias, dy2, dx, mean, rstd):
    m, n = x2.shape
    chunk = _chunk(n, launch["backward_chunk"])
    block, rows = row_block(n), 1 if chunk else launch["backward_rows"]
    grid = (_grid(m, rows, x2.device, launch["backward_per_processor"], persistent),)
    if chunk:
        _norm_backward_chunked[grid](x2, weight, dy2, dx, mean, rstd, x2.stride(0), dy2.stride(0), dx.stride(0), m, n,
                                     RMS=rms, HAS_W=weight is not None, CHUNK=chunk,
                                     num_warps=launch["backward_warps"] or backward_warps(chunk))
    else:
        _norm_backward[grid](x2, weight, dy2, dx, mean, rstd, None, None, x2.stride(0), dy2.stride(0), dx.stride(0), m,
                             n, RMS=rms, HAS_W=weight is not None, HAS_B=False, PARTIALS=False, ROWS=rows,
                             PREFETCH=persistent and launch["backward_prefetch"], BLOCK=block,
                             num_warps=launch["backward_warps"] or backward_warps(block))
    if weight is None and bias is None:
        return None, None
    tile, cols = launch["param_tile"], launch["param_cols"]
    group = max(launch["param_rows"], tile)  # whole tiles: both are powers of two
    groups = triton.cdiv(m, group)
    partial = torch.empty((2, groups, n), dtype=torch.float32, device=x2.device)
    _norm_param_grads[(triton.cdiv(n, cols), groups)](
        x2, dy2, mean, rstd, partial[0], partial[1], x2.stride(0), dy2.stride(0), m, n, group,
        RMS=rms, HAS_B=bias is not None, TILE_M=tile, BLOCK_N=cols, num_warps=launch["param_warps"] or 4)
    return _param_grads(partial, weight, bias)


def _param_grads(partial, weight, bias):
    g, n = partial.shape[1:]
    dw = None if weight is None else torch.empty_like(weight)
    db = None if bias is None else torch.empty_like(bias)
    _sum_partials[(triton.cdiv(n, SUM_COLS),)](partial[0], partial[1], dw, db, g, n, HAS_W=weight is not None,
                                               HAS_B=bias is not None, TILE_G=SUM_TILE, BLOCK_N=SUM_COLS, num_warps=4)
    return dw, db


def triton_layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
                      persistent: bool = True) -> torch.Tensor:
    return _Norm.apply(x, weight, bias, eps, False, persistent)


def triton_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, persistent: bool = True) -> torch.Tensor:
    return _Norm.apply(x, weight, None, eps, True, persistent)
