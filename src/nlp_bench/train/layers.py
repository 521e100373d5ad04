"""Tensor-parallel building blocks: column/row-parallel linears, the vocab-parallel embedding and
the vocab-parallel cross-entropy.

Each layer draws its full ("master") weight from the shared generator and keeps its own shard, so a
model built with any tp from the same seed holds the same numbers; that is what lets a test compare
tp 2 with tp 1 iteration by iteration.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from nlp_bench.train import collectives as C


def _shard_rows(full: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    return full.chunk(tp, dim=0)[rank].clone()


def _shard_cols(full: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    return full.chunk(tp, dim=1)[rank].clone()


def _mark_sharded(*params: nn.Parameter) -> None:
    for p in params:
        p.tensor_parallel = True


class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with W split by output rows; the output stays split across ranks."""

    def __init__(self, in_features: int, out_features: int, std: float, tp: int, tp_rank: int, group) -> None:
        super().__init__()
        self.group = group
        full = torch.empty(out_features, in_features).normal_(0.0, std)
        self.weight = nn.Parameter(_shard_rows(full, tp, tp_rank))
        self.bias = nn.Parameter(torch.zeros(out_features // tp))
        _mark_sharded(self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(C.copy_to_group(x, self.group), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = x W^T + b with W split by input columns; partial sums are reduced across ranks."""

    def __init__(self, in_features: int, out_features: int, std: float, tp: int, tp_rank: int, group) -> None:
        super().__init__()
        self.group = group
        full = torch.empty(out_features, in_features).normal_(0.0, std)
        self.weight = nn.Parameter(_shard_cols(full, tp, tp_rank))
        self.bias = nn.Parameter(torch.zeros(out_features))
        _mark_sharded(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return C.reduce_from_group(F.linear(x, self.weight), self.group) + self.bias


class VocabParallelEmbedding(nn.Module):
    """Token embedding with the (padded) vocabulary split into contiguous ranges, one per rank."""

    def __init__(self, vocab_padded: int, hidden: int, std: float, tp: int, tp_rank: int, group) -> None:
        super().__init__()
        self.group = group
        per_rank = vocab_padded // tp
        self.vocab_start, self.vocab_end = tp_rank * per_rank, (tp_rank + 1) * per_rank
        full = torch.empty(vocab_padded, hidden).normal_(0.0, std)
        self.weight = nn.Parameter(_shard_rows(full, tp, tp_rank))
        _mark_sharded(self.weight)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return C.reduce_from_group(out, self.group)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token loss from vocab-split logits without gathering them: only [tokens]-sized reductions
    (max, target logit, sum of exponentials) cross the network."""

    @staticmethod
    def forward(ctx, logits, target, vocab_start, group):
        ctx.input_dtype = logits.dtype
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()  # the softmax needs fp32 range and precision
        logits_max = C.all_reduce(logits.max(dim=-1).values, group, op="max")
        shifted = logits - logits_max.unsqueeze(-1)
        width = shifted.shape[-1]
        outside = (target < vocab_start) | (target >= vocab_start + width)
        local = (target - vocab_start).masked_fill(outside, 0)
        target_logit = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        C.all_reduce(target_logit, group)
        exp = shifted.exp_()
        sum_exp = C.all_reduce(exp.sum(dim=-1), group)
        loss = torch.log(sum_exp) - target_logit
        exp.div_(sum_exp.unsqueeze(-1))  # now the softmax, kept for the backward pass
        ctx.save_for_backward(exp, outside, local)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, outside, local = ctx.saved_tensors
        grad = softmax
        grad.scatter_add_(-1, local.unsqueeze(-1), -(~outside).unsqueeze(-1).to(grad.dtype))
        grad.mul_(grad_loss.unsqueeze(-1))
        return grad.to(ctx.input_dtype), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, vocab_start: int, group) -> torch.Tensor:
    """Per-token cross-entropy of vocab-split logits against global token ids."""
    return _VocabParallelCrossEntropy.apply(logits, target, vocab_start, group)


def scaled_std(std: float, num_layers: int) -> float:
    """Megatron scales the init of layers that write into the residual stream by 1/sqrt(2L)."""
    return std / math.sqrt(2.0 * num_layers)
