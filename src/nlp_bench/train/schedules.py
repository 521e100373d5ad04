"""Forward/backward over one iteration's micro-batches: without pipelining, or Megatron's 1F1B.

1F1B: stage r first runs (pp - r - 1) forward passes (warm-up), then alternates one forward and one
backward (steady state), then drains the remaining backwards (cool-down). A stage therefore never
holds the activations of more than pp micro-batches, whatever the number of micro-batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from nlp_bench.train import collectives
from nlp_bench.train.grid import Grid


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


def one_f_one_b(stage, grid: Grid, batches: Sequence[Batch], scale: float, activation_shape: tuple[int, ...],
                dtype: torch.dtype, device: torch.device) -> IterationStats:
    stats = IterationStats()
    m = len(batches)
    warmup = min(grid.pp - grid.pp_rank - 1, m)
    in_flight: list[tuple[torch.Tensor | None, torch.Tensor]] = []

    def empty() -> torch.Tensor:
        return torch.empty(activation_shape, dtype=dtype, device=device)

    def p2p(send_next=None, send_prev=None, want_next=False, want_prev=False):
        recv_next = empty() if want_next and not grid.is_last_stage else None
        recv_prev = empty() if want_prev and not grid.is_first_stage else None
        collectives.send_recv(send_next if not grid.is_last_stage else None,
                              send_prev if not grid.is_first_stage else None,
                              recv_next, recv_prev, grid.next_rank, grid.prev_rank)
        return recv_next, recv_prev

    def forward(index: int, received: torch.Tensor | None) -> torch.Tensor:
        tokens, labels = batches[index]
        if grid.is_first_stage:
            out = stage(tokens, labels)
        else:
            received.requires_grad_()
            out = stage(received, labels)
        if grid.is_last_stage:
            stats.losses.append(out.item())
            out = out * (scale / m)
        in_flight.append((received, out))
        stats.max_in_flight = max(stats.max_in_flight, len(in_flight))
        return out

    def backward(grad_out: torch.Tensor | None) -> torch.Tensor | None:
        received, out = in_flight.pop(0)
        torch.autograd.backward(out, grad_tensors=None if grid.is_last_stage else grad_out)
        return None if grid.is_first_stage else received.grad

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


def run(stage, grid: Grid, batches: Sequence[Batch], scale: float, activation_shape: tuple[int, ...],
        dtype: torch.dtype, device: torch.device) -> IterationStats:
    if grid.pp == 1:
        return no_pipelining(stage, batches, scale)
    return one_f_one_b(stage, grid, batches, scale, activation_shape, dtype, device)
