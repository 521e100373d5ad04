"""Forward and backward over one iteration's micro-batches: one interpreter of pipeline_order's table for
every layout (no pipelining, 1F1B and interleaved 1F1B are the same table for pp = 1, v = 1 and v > 1).

1F1B: stage r first runs (pp - r - 1) forward passes (warm-up), then alternates one forward and one
backward (steady state), then drains the remaining backwards (cool-down). A stage therefore never
holds the activations of more than pp micro-batches, whatever the number of micro-batches. Interleaved,
each rank holds v model chunks (virtual stages c * pp + rank), so the pipeline fills v times faster and
the bubble shrinks by a factor v; activations always travel to the next rank of the ring (the last rank
feeds chunk c + 1 of the first).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from nlp_bench.train import collectives, pipeline_order
from nlp_bench.train.process_groups import ProcessGroups


@dataclass
class IterationStats:
    #: per micro-batch, last stage only; on the device, as a host read would cut an xla step's graph in two
    losses: list[torch.Tensor] = field(default_factory=list)
    max_in_flight: int = 0  # most micro-batches whose activations this stage held at once


Batch = tuple[torch.Tensor, torch.Tensor]


def run(chunks, groups: ProcessGroups, batches: Sequence[Batch], scale: float, activation_shape: tuple[int, ...],
        dtype: torch.dtype, device: torch.device) -> IterationStats:
    """One iteration's forward and backward passes, step by step as the schedule table says: run the step's
    unit, then exchange with the neighbours what the table sends and receives at that step."""
    stats = IterationStats()
    v, m = len(chunks), len(batches)

    def first(c: int) -> bool:  # the first virtual stage reads data
        return groups.is_first_stage and c == 0

    def last(c: int) -> bool:  # the last one computes the loss
        return groups.is_last_stage and c == v - 1

    arrived: dict[tuple[int, int, bool], torch.Tensor] = {}  # (micro-batch, chunk, activation?) -> tensor
    held: dict[tuple[int, int], tuple[torch.Tensor | None, torch.Tensor]] = {}  # what backward needs

    def forward(mb: int, c: int) -> torch.Tensor:
        tokens, labels = batches[mb]
        received = None if first(c) else arrived.pop((mb, c, True)).requires_grad_()
        out = chunks[c](tokens if received is None else received, labels)
        if last(c):
            stats.losses.append(out.detach())
            out = out * (scale / m)
        held[(mb, c)] = (received, out)
        stats.max_in_flight = max(stats.max_in_flight, len(held))
        return out.detach()

    def backward(mb: int, c: int) -> torch.Tensor | None:
        received, out = held.pop((mb, c))
        torch.autograd.backward(out, grad_tensors=None if last(c) else arrived.pop((mb, c, False)))
        return None if received is None else received.grad

    for step in pipeline_order.steps(groups.pp, v, m, groups.pp_rank):
        out = grad = None
        if step.unit is not None:
            u = step.unit
            if u.forward:
                out = forward(u.micro_batch, u.chunk)
            else:
                grad = backward(u.micro_batch, u.chunk)
        recv_prev = None if step.recv_prev is None else torch.empty(activation_shape, dtype=dtype, device=device)
        recv_next = None if step.recv_next is None else torch.empty(activation_shape, dtype=dtype, device=device)
        collectives.send_recv(out if step.send_next else None, grad if step.send_prev else None, recv_next,
                              recv_prev, groups.next_rank, groups.prev_rank)
        if recv_prev is not None:
            arrived[(*step.recv_prev, True)] = recv_prev
        if recv_next is not None:
            arrived[(*step.recv_next, False)] = recv_next
    return stats


@torch.no_grad()
def forward_only(chunks, groups: ProcessGroups, batches: Sequence[Batch], activation_shape: tuple[int, ...],
                 dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    """Evaluation: every micro-batch through every virtual stage in order, no backward. Returns the
    per-micro-batch losses (on the device) on the rank that holds the last virtual stage."""
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
                losses.append(out)
            else:
                collectives.send_recv(out, None, None, None, groups.next_rank, groups.prev_rank)
    return losses
