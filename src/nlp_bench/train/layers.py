"""Tensor-parallel building blocks: column/row-parallel linears, the vocab-parallel embedding and
with Megatron's sequence parallelism as an option (the vocab-parallel cross-entropy is in
nlp_bench.kernels).

Every weight is drawn whole from a generator seeded by (seed, parameter name) and each rank keeps its
shard. So a model built with any tp, pp or dp from the same seed holds the same numbers, which is what
lets the tests compare every layout with the single-rank run iteration by iteration.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from nlp_bench.train import collectives as C


@dataclass(frozen=True)
class TensorParallel:
    size: int
    rank: int
    group: object
    sequence_parallel: bool = False


def master_normal(key: str, shape: tuple[int, ...], std: float, seed: int) -> torch.Tensor:
    """The full (unsharded) weight called `key`, identical on every rank and for every layout."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(key.encode())) % (2**63))
    return torch.empty(shape).normal_(0.0, std, generator=g)


def mark(*params: nn.Parameter, tensor_parallel: bool = False, sequence_parallel: bool = False,
         shared: bool = False, copies: int = 1, expert: bool = False) -> None:
    """Tag parameters for the optimizer: sharded over tp (count in every rank's norm), replicated but fed
    by a sequence shard (sum grads over tp), or a pipeline copy of a tied weight (count once). A tp shard
    held by `copies` neighbouring tp ranks (key/value heads when tp exceeds the query groups) has its
    gradients summed over those ranks and counts once. `expert`: a shard of the experts' grid (summed over
    the expert dp group, counted over expert tp x ep; ProcessGroups.experts)."""
    for p in params:
        p.tensor_parallel = tensor_parallel
        p.sequence_parallel = sequence_parallel
        p.shared_copy = shared
        p.tp_copies = copies
        p.expert_parallel = expert


class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with W split by output rows; the output stays split across ranks.

    With `parts` > 1 the output is several stacked matrices (SwiGLU's gate and up projection): each is
    sharded on its own so every rank holds matching rows of all of them. With `skip_bias_add` the bias
    is left to the caller, which fuses it into the next op (Megatron's bias-gelu). `rows` picks this rank's
    rows of the whole weight where they are not its 1/tp slice; `copies` ranks then hold the same rows
    (see `mark`). Without `bias` the layer has none (Megatron's --disable-bias-linear).
    """

    def __init__(self, in_features: int, out_features: int, std: float, key: str, seed: int,
                 tp: TensorParallel, parts: int = 1, skip_bias_add: bool = False, bias: bool = True,
                 rows: torch.Tensor | None = None, copies: int = 1) -> None:
        super().__init__()
        self.tp, self.skip_bias_add = tp, skip_bias_add
        shards = []
        for i in range(parts):
            full = master_normal(f"{key}.{i}" if parts > 1 else key, (out_features, in_features), std, seed)
            shards.append(full.chunk(tp.size, dim=0)[tp.rank] if rows is None else full[rows])
        self.weight = nn.Parameter(torch.cat(shards).contiguous())
        self.bias = nn.Parameter(torch.zeros(self.weight.shape[0])) if bias else None
        mark(*[p for p in (self.weight, self.bias) if p is not None], tensor_parallel=True, copies=copies)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.multiply(self.gather(x))

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """The input every rank multiplies: the whole sequence under sequence parallelism."""
        if self.tp.sequence_parallel:
            return C.gather_sequence(x, self.tp.group)
        return C.copy_to_group(x, self.tp.group)

    def multiply(self, x: torch.Tensor) -> torch.Tensor:
        """The product with an input `gather` already made."""
        return F.linear(x, self.weight, None if self.skip_bias_add else self.bias)


class RowParallelLinear(nn.Module):
    """y = x W^T + b with W split by input columns; partial sums are reduced (or reduce-scattered along
    the sequence under sequence parallelism) across ranks."""

    def __init__(self, in_features: int, out_features: int, std: float, key: str, seed: int,
                 tp: TensorParallel, bias: bool = True) -> None:
        super().__init__()
        self.tp = tp
        full = master_normal(key, (out_features, in_features), std, seed)
        self.weight = nn.Parameter(full.chunk(tp.size, dim=1)[tp.rank].contiguous())
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        mark(self.weight, tensor_parallel=True)
        if self.bias is not None:
            mark(self.bias, sequence_parallel=tp.sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if self.tp.sequence_parallel:
            y = C.reduce_scatter_sequence(y, self.tp.group)
        else:
            y = C.reduce_from_group(y, self.tp.group)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Token embedding with the (padded) vocabulary split into contiguous ranges, one per rank."""

    def __init__(self, vocab_padded: int, hidden: int, std: float, key: str, seed: int, tp: TensorParallel,
                 shared: bool = False) -> None:
        super().__init__()
        self.tp = tp
        per_rank = vocab_padded // tp.size
        self.vocab_start, self.vocab_end = tp.rank * per_rank, (tp.rank + 1) * per_rank
        full = master_normal(key, (vocab_padded, hidden), std, seed)
        self.weight = nn.Parameter(full.chunk(tp.size, dim=0)[tp.rank].contiguous())
        mark(self.weight, tensor_parallel=True, shared=shared)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        if self.tp.sequence_parallel:
            return C.reduce_scatter_sequence(out, self.tp.group)
        return C.reduce_from_group(out, self.tp.group)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's vocabulary slice of the output logits (the tied or untied output layer)."""
        if self.tp.sequence_parallel:
            x = C.gather_sequence(x, self.tp.group)
        else:
            x = C.copy_to_group(x, self.tp.group)
        return F.linear(x, self.weight)


def scaled_std(std: float, num_layers: int) -> float:
    """Megatron scales the init of layers that write into the residual stream by 1/sqrt(2L)."""
    return std / math.sqrt(2.0 * num_layers)
