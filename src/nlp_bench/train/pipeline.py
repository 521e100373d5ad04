"""Forward/backward over one iteration's micro-batches: without pipelining, or Megatron's 1F1B.

1F1B: stage r first runs (pp - r - 1) forward passes (warm-up), then alternates one forward and one
backward (steady state), then drains the remaining backwards (cool-down). A stage therefore never
holds the activations of more than pp micro-batches, whatever the number of micro-batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from nlp_bench.train import collectives, pipeline_order
from nlp_bench.train.process_groups import ProcessGroups


@dataclass
class IterationStats:
    losses: list[float] = field(default_factory=list)  # per micro-batch, last stage only
    max_in_flight: int = 0  # most micro-batches whose activations this stage held at once


Batch = tuple[torch.Tensor, torch.Tensor]


def no_pipelining(stage, batches: Sequence[Batch], scale: float) -> IterationStats:
    stats = IterationStats()
    for tokens, labels in batches:
        loss = stage(tokens, labels)
        (loss * (scale / len(batches))).backward()
        stats.losses.append(loss.item())
        stats.max_in_flight = 1
    return stats


def one_f_one_b(stage, groups: ProcessGroups, batches: Sequence[Batch], scale: float, activation_shape: tuple[int, ...],
                dtype: torch.dtype, device: torch.device) -> IterationStats:
    stats = IterationStats()
    m = len(batches)
    warmup = min(groups.pp - groups.pp_rank - 1, m)
    in_flight: list[tuple[torch.Tensor | None, torch.Tensor]] = []

    def empty() -> torch.Tensor:
        return torch.empty(activation_shape, dtype=dtype, device=device)

    def p2p(send_next=None, send_prev=None, want_next=False, want_prev=False):
        recv_next = empty() if want_next and not groups.is_last_stage else None
        recv_prev = empty() if want_prev and not groups.is_first_stage else None
        collectives.send_recv(send_next if not groups.is_last_stage else None,
                              send_prev if not groups.is_first_stage else None,
                              recv_next, recv_prev, groups.next_rank, groups.prev_rank)
        return recv_next, recv_prev

    def forward(index: int, received: torch.Tensor | None) -> torch.Tensor:
        tokens, labels = batches[index]
        if groups.is_first_stage:
            out = stage(tokens, labels)
        else:
            received.requires_grad_()
            out = stage(received, labels)
        if groups.is_last_stage:
            stats.losses.append(out.item())
            out = out * (scale / m)
        in_flight.append((received, out))
        stats.max_in_flight = max(stats.max_in_flight, len(in_flight))
        return out

    def backward(grad_out: torch.Tensor | None) -> torch.Tensor | None:
        received, out = in_flight.pop(0)
        torch.autograd.backward(out, grad_tensors=None if groups.is_last_stage else grad_out)
        return None if groups.is_first_stage else received.grad

    for i in range(warmup):
        _, received = p2p(want_prev=True)
        out = forward(i, received)
        p2p(send_next=out.detach())
    received = p2p(want_prev=True)[1] if m > warmup else None
    for i in range(m - warmup):
        out = forward(warmup + i, received)
        grad_out, _ = p2p(send_next=out.detach(), want_next=True)
        grad_in = backward(grad_out)
        last = i == m - warmup - 1
        _, received = p2p(send_prev=grad_in, want_prev=not last)
    for _ in range(warmup):
        grad_out, _ = p2p(want_next=True)
        p2p(send_prev=backward(grad_out))
    return stats


def run(chunks, groups: ProcessGroups, batches: Sequence[Batch], scale: float, activation_shape: tuple[int, ...],
        dtype: torch.dtype, device: torch.device) -> IterationStats:
    """One iteration's forward and backward passes with the schedule the layout calls for."""
    if groups.pp == 1:
        return no_pipelining(chunks[0], batches, scale)
    if len(chunks) == 1:
        return one_f_one_b(chunks[0], groups, batches, scale, activation_shape, dtype, device)
    return interleaved_1f1b(chunks, groups, batches, scale, activation_shape, dtype, device)


def interleaved_1f1b(chunks, groups: ProcessGroups, batches: Sequence[Batch], scale: float, activation_shape: tuple[int, ...],
                     dtype: torch.dtype, device: torch.device) -> IterationStats:
    """Megatron's interleaved 1F1B: each rank holds v model chunks (virtual stages c * pp + rank), so
    the pipeline fills v times faster and the bubble shrinks by a factor v.

    The order of the units is pipeline_order's table; this runs it and moves the tensors. Activations
    always travel to the next rank of the ring (the last rank feeds chunk c + 1 of the first).
    """
    stats = IterationStats()
    pp, v, rank, m = groups.pp, len(chunks), groups.pp_rank, len(batches)
    table = pipeline_order.order(pp, v, m, rank)
    forwards = [u for u in table if u.forward]
    backwards = [u for u in table if not u.forward]
    total = m * v
    warmup = next((i for i, u in enumerate(table) if not u.forward), total)
    all_warmup = warmup == total
    first_rank, last_rank = rank == 0, rank == pp - 1

    def chunk_of(k: int, forward: bool) -> int:
        """The chunk of unit k on any rank: where a neighbour's activation or gradient is headed."""
        return pipeline_order.unit(k, pp, v, forward)[1]

    def is_first_virtual(c: int) -> bool:
        return first_rank and c == 0

    def is_last_virtual(c: int) -> bool:
        return last_rank and c == v - 1

    inputs: list[list] = [[] for _ in range(v)]
    outputs: list[list] = [[] for _ in range(v)]
    grads: list[list] = [[] for _ in range(v)]
    in_flight = 0

    def empty() -> torch.Tensor:
        return torch.empty(activation_shape, dtype=dtype, device=device)

    def exchange(send_next, send_prev, want_prev: bool, want_next: bool):
        recv_prev = empty() if want_prev else None
        recv_next = empty() if want_next else None
        collectives.send_recv(send_next, send_prev, recv_next, recv_prev, groups.next_rank, groups.prev_rank)
        return recv_prev, recv_next

    def forward(k: int) -> torch.Tensor | None:
        nonlocal in_flight
        c, (tokens, labels) = forwards[k].chunk, batches[forwards[k].micro_batch]
        received = inputs[c][-1] if inputs[c] else None
        if is_first_virtual(c):
            out = chunks[c](tokens, labels)
            inputs[c].append(None)
        else:
            received = inputs[c][-1]
            received.requires_grad_()
            out = chunks[c](received, labels)
        if is_last_virtual(c):
            stats.losses.append(out.item())
            out = out * (scale / m)
        outputs[c].append(out)
        in_flight += 1
        stats.max_in_flight = max(stats.max_in_flight, in_flight)
        return None if is_last_virtual(c) else out.detach()

    def backward(k: int) -> torch.Tensor | None:
        nonlocal in_flight
        c = backwards[k].chunk
        received, out = inputs[c].pop(0), outputs[c].pop(0)
        grad = grads[c].pop(0) if not is_last_virtual(c) else None
        torch.autograd.backward(out, grad_tensors=grad)
        in_flight -= 1
        return None if is_first_virtual(c) else received.grad

    # the first rank's chunk 0 reads data; every other (rank, chunk 0) first waits for activations
    if not first_rank:
        inputs[0].append(exchange(None, None, True, False)[0])
    for k in range(warmup):
        out = forward(k)
        nxt = chunk_of(k + 1, True)
        want_prev = not (first_rank and nxt == 0) and k != total - 1
        want_next = k == warmup - 1 and not all_warmup and not last_rank
        got_prev, got_next = exchange(out, None, want_prev, want_next)
        if want_prev:
            inputs[nxt].append(got_prev)
        if want_next:
            grads[v - 1].append(got_next)
        elif k == warmup - 1 and not all_warmup and last_rank:
            pass  # the last virtual stage starts its backward from the loss
    for k in range(total - warmup):
        fk = k + warmup
        out = forward(fk)
        grad_in = backward(k)
        if first_rank:  # the first rank runs pp - 1 units ahead of the last one
            nxt_f = chunk_of(fk - (pp - 1), True)
            want_prev = nxt_f != v - 1
            nxt_f += 1
        else:
            nxt_f = chunk_of(fk + 1, True)
            want_prev = True
        if last_rank:
            nxt_b = chunk_of(k - (pp - 1), False)
            want_next = nxt_b != 0
            nxt_b -= 1
        else:
            nxt_b = chunk_of(k + 1, False)
            want_next = True
        if k == total - warmup - 1:
            want_prev = False
        got_prev, got_next = exchange(out, grad_in, want_prev, want_next)
        if want_prev:
            inputs[nxt_f].append(got_prev)
        if want_next:
            grads[nxt_b].append(got_next)
    if all_warmup and not last_rank:
        grads[v - 1].append(exchange(None, None, False, True)[1])
    for k in range(total - warmup, total):
        grad_in = backward(k)
        nxt = chunk_of(k + 1, False)
        want_next = not (last_rank and nxt == v - 1) and k != total - 1
        _, got_next = exchange(None, grad_in, False, want_next)
        if want_next:
            grads[nxt].append(got_next)
    return stats


@torch.no_grad()
def forward_only(chunks, groups: ProcessGroups, batches: Sequence[Batch], activation_shape: tuple[int, ...],
                 dtype: torch.dtype, device: torch.device) -> list[float]:
    """Evaluation: every micro-batch through every virtual stage in order, no backward. Returns the
    per-micro-batch losses on the rank that holds the last virtual stage."""
    v = len(chunks)
    losses = []
    for tokens, labels in batches:
        for c, chunk in enumerate(chunks):
            first = groups.is_first_stage and c == 0
            last = groups.is_last_stage and c == v - 1
            x = tokens
            if not first:
                x = torch.empty(activation_shape, dtype=dtype, device=device)
                collectives.send_recv(None, None, None, x, groups.next_rank, groups.prev_rank)
            out = chunk(x, labels)
            if last:
                losses.append(out.item())
            else:
                collectives.send_recv(out, None, None, None, groups.next_rank, groups.prev_rank)
    return losses
