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

from nlp_bench.spec.layout import virtual_stages


class Unit(NamedTuple):
    micro_batch: int
    chunk: int
    forward: bool


def unit(k: int, pp: int, chunks: int, forward: bool) -> tuple[int, int]:
    """(micro-batch, chunk) of the k-th forward or backward unit of any rank."""
    group, offset = divmod(k, virtual_stages(pp, chunks))
    chunk = offset // pp
    return group * pp + offset % pp, chunk if forward else chunks - 1 - chunk


def warmup(pp: int, chunks: int, micro_batches: int, rank: int) -> int:
    """Forward units rank runs before its first backward unit."""
    total = micro_batches * chunks
    if chunks == 1:
        return min(pp - rank - 1, total)
    if micro_batches == pp:
        return total
    return min((pp - rank - 1) * 2 + virtual_stages(pp, chunks) - pp, total)


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


class Step(NamedTuple):
    """One step of a rank's schedule: the unit it runs (None while its input is still on its way), then one
    exchange with its neighbours. `send_next`/`send_prev`: the unit's output activation goes to the next
    rank, its input gradient to the previous one. `recv_prev`/`recv_next`: (micro-batch, chunk) of this
    rank's unit whose input activation, or output gradient, arrives in this exchange."""

    time: int
    unit: Unit | None
    send_next: bool
    send_prev: bool
    recv_prev: tuple[int, int] | None
    recv_next: tuple[int, int] | None


def _ready(u: Unit, rank: int, pp: int, chunks: int, arrived: set[tuple[int, int, bool]]) -> bool:
    """Can rank run unit u now: is its input here (data or a received activation; the loss or a received
    gradient)? A backward's own forward ran before it on this rank (order() guarantees it)."""
    if u.forward:
        return (rank == 0 and u.chunk == 0) or (u.micro_batch, u.chunk, True) in arrived
    return (rank == pp - 1 and u.chunk == chunks - 1) or (u.micro_batch, u.chunk, False) in arrived


def steps(pp: int, chunks: int, micro_batches: int, rank: int) -> list[Step]:
    """Rank's whole iteration, transfers included (see schedule)."""
    return schedule(pp, chunks, micro_batches)[rank]


def schedule(pp: int, chunks: int, micro_batches: int) -> list[list[Step]]:
    """Every rank's steps, made by running all ranks' orders in time steps: at time t each rank runs its
    next unit if that unit's input arrived before t, then sends what the unit made; the neighbour receives
    it in its exchange of the same time t. So every send meets its receive in the same exchange, the
    exchanges of any two neighbours come in the same order on both, and time only moves forward: no rank
    can wait on a neighbour that waits on it. A rank with nothing to run or exchange at t has no step."""
    orders = [order(pp, chunks, micro_batches, r) for r in range(pp)]
    position = [0] * pp
    arrived: list[set[tuple[int, int, bool]]] = [set() for _ in range(pp)]
    out: list[list[Step]] = [[] for _ in range(pp)]
    time = 0
    while any(position[r] < len(orders[r]) for r in range(pp)):
        running: list[Unit | None] = []
        for r in range(pp):
            u = orders[r][position[r]] if position[r] < len(orders[r]) else None
            running.append(u if u is not None and _ready(u, r, pp, chunks, arrived[r]) else None)
        if not any(running):
            raise RuntimeError(f"the {pp}-stage schedule with {chunks} chunks and {micro_batches} micro-batches "
                               f"deadlocks at time {time}")
        sends_next = [u is not None and u.forward and not (r == pp - 1 and u.chunk == chunks - 1)
                      for r, u in enumerate(running)]
        sends_prev = [u is not None and not u.forward and not (r == 0 and u.chunk == 0) for r, u in enumerate(running)]
        for r, u in enumerate(running):
            prev, nxt = (r - 1) % pp, (r + 1) % pp
            recv_prev = recv_next = None
            if sends_next[prev]:  # the previous rank's activation: the same chunk, or the next one across the ring
                sent = running[prev]
                recv_prev = (sent.micro_batch, sent.chunk + (1 if r == 0 else 0))
            if sends_prev[nxt]:  # the next rank's gradient: the same chunk, or the one before across the ring
                sent = running[nxt]
                recv_next = (sent.micro_batch, sent.chunk - (1 if r == pp - 1 else 0))
            if u is not None or recv_prev or recv_next:
                out[r].append(Step(time, u, sends_next[r], sends_prev[r], recv_prev, recv_next))
        for r, u in enumerate(running):
            if u is not None:
                position[r] += 1
            step = out[r][-1] if out[r] and out[r][-1].time == time else None
            if step is not None and step.recv_prev:
                arrived[r].add((*step.recv_prev, True))
            if step is not None and step.recv_next:
                arrived[r].add((*step.recv_next, False))
        time += 1
    return out
