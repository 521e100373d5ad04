"""The order in which a pipeline rank runs its forward and backward passes, as data.

pipeline.py executes this table; the tests check it against the 1F1B invariants without starting a
process. Megatron's rules: with v model chunks per rank (virtual stage c·pp + rank holds chunk c), work
unit k of either direction belongs to micro-batch (k div pp·v)·pp + k mod pp and to chunk
(k mod pp·v) div pp, counted from the last chunk for backward passes. Rank r first runs
(pp − r − 1)·2 + (v − 1)·pp forward units (pp − r − 1 without interleaving; all of them when the
micro-batches are as few as the stages), then alternates one forward and one backward unit, then runs
the backward units left. Plain 1F1B is the case v = 1.
"""

from __future__ import annotations

from typing import NamedTuple


class Unit(NamedTuple):
    micro_batch: int
    chunk: int
    forward: bool


def unit(k: int, pp: int, chunks: int, forward: bool) -> tuple[int, int]:
    """(micro-batch, chunk) of the k-th forward or backward unit of any rank."""
    group, offset = divmod(k, pp * chunks)
    chunk = offset // pp
    return group * pp + offset % pp, chunk if forward else chunks - 1 - chunk


def warmup(pp: int, chunks: int, micro_batches: int, rank: int) -> int:
    """Forward units rank runs before its first backward unit."""
    total = micro_batches * chunks
    if chunks == 1:
        return min(pp - rank - 1, total)
    if micro_batches == pp:
        return total
    return min((pp - rank - 1) * 2 + (chunks - 1) * pp, total)


def order(pp: int, chunks: int, micro_batches: int, rank: int) -> list[Unit]:
    """Every unit rank runs in one iteration, in the order it runs them."""
    if not 0 <= rank < pp:
        raise ValueError(f"rank {rank} is not a stage of a {pp}-stage pipeline")
    if chunks > 1 and micro_batches % pp:
        raise ValueError(f"the interleaved schedule needs the micro-batches ({micro_batches}) to be a multiple of "
                         f"pp ({pp})")
    total = micro_batches * chunks
    first = warmup(pp, chunks, micro_batches, rank)
    table = [Unit(*unit(k, pp, chunks, True), True) for k in range(first)]
    for k in range(total - first):
        table.append(Unit(*unit(first + k, pp, chunks, True), True))
        table.append(Unit(*unit(k, pp, chunks, False), False))
    table += [Unit(*unit(k, pp, chunks, False), False) for k in range(total - first, total)]
    return table
