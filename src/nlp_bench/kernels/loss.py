"""Softmax cross-entropy from (vocab-split) logits in Triton, without an fp32 softmax buffer.

The forward pass reads the logits once per row with an online softmax and keeps three numbers per
token (max, sum of exponentials, target logit); under tensor parallelism those are combined across
ranks with [tokens]-sized all-reduces, as Megatron's vocab-parallel cross-entropy does. The backward
pass recomputes softmax - one_hot from the logits and the saved log-sum-exp. With
`inplace_backward` it writes that gradient over the logits themselves, so the loss needs no memory
beyond the logits (the trainer's output layer produces them for the loss alone).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from nlp_bench.kernels.eager import reduce_vocab_shards

_BLOCK = 4096


@triton.jit
def _stats_kernel(LOGITS, TARGET, MAX, SUMEXP, TGT, stride, width, vocab_start, BLOCK: tl.constexpr):
    row = tl.cast(tl.program_id(0), tl.int64)
    base = LOGITS + row * stride
    running_max = tl.full([BLOCK], -1e30, dtype=tl.float32)  # finite: -inf - -inf would be nan
    running_sum = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, width, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(base + cols, mask=cols < width, other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(running_max, x)
        running_sum = running_sum * tl.exp(running_max - new_max) + tl.exp(x - new_max)
        running_max = new_max
    row_max = tl.max(running_max, axis=0)
    tl.store(MAX + row, row_max)
    tl.store(SUMEXP + row, tl.sum(running_sum * tl.exp(running_max - row_max), axis=0))
    local = tl.load(TARGET + row) - vocab_start
    inside = (local >= 0) & (local < width)
    target_logit = tl.load(base + tl.where(inside, local, 0)).to(tl.float32)
    tl.store(TGT + row, tl.where(inside, target_logit, 0.0))


@triton.jit
def _grad_kernel(LOGITS, GRAD, TARGET, LSE, SCALE, stride_l, stride_g, width, vocab_start, BLOCK: tl.constexpr):
    row = tl.cast(tl.program_id(0), tl.int64)
    lse = tl.load(LSE + row)
    scale = tl.load(SCALE + row)
    local = tl.load(TARGET + row) - vocab_start
    for start in range(0, width, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < width
        x = tl.load(LOGITS + row * stride_l + cols, mask=mask, other=0.0).to(tl.float32)
        p = tl.exp(x - lse) - tl.where(cols == local, 1.0, 0.0)
        tl.store(GRAD + row * stride_g + cols, (p * scale).to(GRAD.dtype.element_ty), mask=mask)


class TritonVocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, vocab_start, group, inplace_backward):
        shape, width = target.shape, logits.shape[-1]
        logits2 = logits.reshape(-1, width)
        if logits2.stride(-1) != 1:
            logits2 = logits2.contiguous()
        target1 = target.reshape(-1).contiguous()
        rows = logits2.shape[0]
        stats = torch.empty((3, rows), dtype=torch.float32, device=logits.device)
        row_max, sum_exp, target_logit = stats[0], stats[1], stats[2]
        block = min(_BLOCK, max(16, 1 << (width - 1).bit_length()))
        _stats_kernel[(rows,)](logits2, target1, row_max, sum_exp, target_logit, logits2.stride(0), width,
                               vocab_start, BLOCK=block, num_warps=8 if block >= 2048 else 4)
        if group is not None and dist.get_world_size(group) > 1:
            global_max = reduce_vocab_shards(row_max.clone(), group, dist.ReduceOp.MAX)
            sum_exp.mul_(torch.exp(row_max - global_max))
            reduce_vocab_shards(stats[1:], group)  # sums of exponentials and target logits in one call
            row_max = global_max
        lse = row_max + torch.log(sum_exp)
        ctx.save_for_backward(logits2, target1, lse)
        ctx.vocab_start, ctx.inplace, ctx.block, ctx.shape = vocab_start, inplace_backward, block, logits.shape
        return (lse - target_logit).view(shape)

    @staticmethod
    def backward(ctx, grad_loss):
        logits2, target1, lse = ctx.saved_tensors
        grad = logits2 if ctx.inplace else torch.empty_like(logits2)
        scale = grad_loss.reshape(-1).float().contiguous()
        _grad_kernel[(logits2.shape[0],)](logits2, grad, target1, lse, scale, logits2.stride(0), grad.stride(0),
                                         logits2.shape[1], ctx.vocab_start, BLOCK=ctx.block,
                                         num_warps=8 if ctx.block >= 2048 else 4)
        return grad.view(ctx.shape), None, None, None, None


def triton_vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, vocab_start: int = 0,
                                        group=None, inplace_backward: bool = False) -> torch.Tensor:
    return TritonVocabParallelCrossEntropy.apply(logits, target, vocab_start, group, inplace_backward)
