"""A discrete-event replay of Megatron-LM's 1F1B pipeline schedules, for checking the time model's closed forms.

Each rank runs its forward and backward chunk-steps in the order Megatron-core's schedule (core_r0.9.0, as
MLPerf's and NeMo's runs of 2024 used it) issues them: interleaved when vp > 1, warm-up forwards, then one
forward and one backward in turn, then the cool-down backwards; every step is a warm-up forward when the
micro-batches number pp. A step starts when its rank is free and its input has arrived: the activation of the
previous chunk (from the previous rank, or from the last rank for the next model chunk), or the gradient of
the next. A send takes `send` seconds after the step that makes it. With `waited_sends` the sending rank is
busy for it too, every step (Megatron's blocking sends without --overlap-p2p-communication, the forward's and
the backward's of a 1F1B pair one after the other, as they are when both go through the same network card);
without, only in the warm-up and the cool-down, where Megatron waits for each send before the next step.
"""

from __future__ import annotations


def _order(pp: int, vp: int, micro_batches: int, rank: int) -> list[tuple[str, int, int, bool]]:
    """(kind, micro-batch, model chunk, in the steady state) of each step `rank` runs, in Megatron's order."""
    total = micro_batches * vp

    def chunk(k: int) -> int:
        return (k % (pp * vp)) // pp

    def micro_batch(k: int) -> int:
        return (k // (pp * vp)) * pp + k % pp

    if vp == 1:
        warm = min(pp - rank - 1, micro_batches)
    else:
        warm = total if micro_batches == pp else min((pp - rank - 1) * 2 + (vp - 1) * pp, total)
    steps, forwards, backwards = [], 0, 0
    for _ in range(warm):
        steps.append(("F", micro_batch(forwards), chunk(forwards), False))
        forwards += 1
    while forwards < total:
        steps.append(("F", micro_batch(forwards), chunk(forwards), True))
        forwards += 1
        steps.append(("B", micro_batch(backwards), vp - 1 - chunk(backwards), True))
        backwards += 1
    while backwards < total:
        steps.append(("B", micro_batch(backwards), vp - 1 - chunk(backwards), False))
        backwards += 1
    return steps


def makespan(pp: int, vp: int, micro_batches: int, forward: float, backward: float, send: float,
             waited_sends: bool = False) -> float:
    """Seconds from the first forward to the last backward; `forward` and `backward` are one chunk's step."""
    orders = [_order(pp, vp, micro_batches, r) for r in range(pp)]
    done: dict[tuple[int, str, int, int], float] = {}  # when each step's output is sent (or has arrived)
    in_flight: dict[tuple[int, str, int, int], float] = {}  # what of its send is still to come then
    position, free = [0] * pp, [0.0] * pp
    moved = True
    while moved:
        moved = False
        for rank in range(pp):
            while position[rank] < len(orders[rank]):
                kind, mb, chunk, steady = orders[rank][position[rank]]
                # the last chunk's forward feeds its own backward, the first chunk's backward ends the pass
                sends = not (kind == "F" and rank == pp - 1 and chunk == vp - 1 or kind == "B" and rank == 0 and chunk == 0)
                waited = sends and (waited_sends or not steady)
                if kind == "F":
                    needs = (rank - 1, "F", mb, chunk) if rank else ((pp - 1, "F", mb, chunk - 1) if chunk else None)
                elif rank < pp - 1:
                    needs = (rank + 1, "B", mb, chunk)
                else:
                    needs = (0, "B", mb, chunk + 1) if chunk < vp - 1 else (rank, "F", mb, chunk)
                if needs is not None and needs not in done:
                    break
                arrives = 0.0 if needs is None else done[needs] + (in_flight[needs] if needs[0] != rank else 0.0)
                start = max(free[rank], arrives)
                free[rank] = start + (forward if kind == "F" else backward) + (send if waited else 0.0)
                done[(rank, kind, mb, chunk)] = free[rank]
                in_flight[(rank, kind, mb, chunk)] = 0.0 if waited else send
                position[rank] += 1
                moved = True
    assert all(position[r] == len(orders[r]) for r in range(pp)), "the schedule deadlocked"
    return max(free)
