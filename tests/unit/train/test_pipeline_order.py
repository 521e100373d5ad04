"""The pipeline schedule as a table, transfers included, checked against the invariants of 1F1B without
starting a process."""

import itertools

import pytest

from nlp_bench.train.pipeline_order import Unit, order, schedule, steps, warmup

LAYOUTS = [(pp, v, m) for pp, v in [(2, 1), (4, 1), (2, 2), (2, 3), (4, 2), (4, 3), (8, 2)]
           for m in (pp, 2 * pp, 3 * pp, 8 * pp) if v == 1 or m % pp == 0] + [(4, 1, 1), (4, 1, 3), (4, 1, 5)]


def simulate(pp: int, v: int, m: int) -> int:
    """Run every rank's table at once, one unit per rank per time step, a unit starting only when its
    input exists (the previous virtual stage's forward, the next one's backward). Returns the number of
    steps, or fails on a deadlock. Virtual stage of chunk c on rank r: c * pp + r."""
    tables = [order(pp, v, m, r) for r in range(pp)]
    done: set[tuple[int, int, bool]] = set()  # (micro-batch, virtual stage, forward)
    position = [0] * pp
    last = pp * v - 1
    steps = 0
    while any(position[r] < len(tables[r]) for r in range(pp)):
        ready = []
        for r in range(pp):
            if position[r] == len(tables[r]):
                continue
            u = tables[r][position[r]]
            stage = u.chunk * pp + r
            if u.forward:
                ok = stage == 0 or (u.micro_batch, stage - 1, True) in done
            else:
                ok = (u.micro_batch, stage, True) in done and (stage == last or (u.micro_batch, stage + 1, False) in done)
            if ok:
                ready.append((r, (u.micro_batch, stage, u.forward)))
        assert ready, f"deadlock at step {steps}: {[tables[r][position[r]] for r in range(pp) if position[r] < len(tables[r])]}"
        for r, key in ready:
            done.add(key)
            position[r] += 1
        steps += 1
    return steps


@pytest.mark.parametrize("pp,v,m", LAYOUTS)
def test_every_unit_once_forward_before_backward_in_order(pp, v, m):
    for rank in range(pp):
        table = order(pp, v, m, rank)
        expected = {(b, c) for b in range(m) for c in range(v)}
        forwards = [(u.micro_batch, u.chunk) for u in table if u.forward]
        backwards = [(u.micro_batch, u.chunk) for u in table if not u.forward]
        assert sorted(forwards) == sorted(backwards) == sorted(expected)
        seen = set()
        for u in table:
            if u.forward:
                seen.add((u.micro_batch, u.chunk))
            else:
                assert (u.micro_batch, u.chunk) in seen, f"backward before forward: {u}"
        for c in range(v):  # each chunk takes its micro-batches first in, first out
            assert [b for b, cc in forwards if cc == c] == list(range(m))
            assert [b for b, cc in backwards if cc == c] == list(range(m))


@pytest.mark.parametrize("pp,v,m", LAYOUTS)
def test_one_forward_one_backward_after_the_warm_up(pp, v, m):
    for rank in range(pp):
        table = order(pp, v, m, rank)
        w = warmup(pp, v, m, rank)
        assert all(u.forward for u in table[:w])
        steady = table[w:w + 2 * (m * v - w)]  # then F, B, F, B, ...; then the backwards left
        assert [u.forward for u in steady] == [True, False] * (m * v - w)


@pytest.mark.parametrize("pp,v,m", LAYOUTS)
def test_activations_held_at_once_are_bounded(pp, v, m):
    """1F1B's point: a stage holds at most pp - rank micro-batches' activations, whatever m (interleaved:
    the warm-up plus one)."""
    for rank in range(pp):
        held, most = 0, 0
        for u in order(pp, v, m, rank):
            held += 1 if u.forward else -1
            most = max(most, held)
        bound = min(pp - rank, m) if v == 1 else warmup(pp, v, m, rank) + 1
        assert most <= bound and held == 0


@pytest.mark.parametrize("pp,v,m", [lay for lay in LAYOUTS if lay[2] >= lay[0]])
def test_runs_without_deadlock_and_the_bubble_shrinks_with_chunks(pp, v, m):
    """With every unit one time step, the whole iteration takes the work (2·m·v units) plus the bubble:
    2·(pp − 1) units for 1F1B, i.e. (pp − 1)/v of a full stage's forward and backward when interleaved."""
    steps = simulate(pp, v, m)
    assert steps >= 2 * m * v
    bubble = steps - 2 * m * v
    if v == 1:
        assert bubble == 2 * (pp - 1)
    else:  # interleaved: no worse than 1F1B's bubble counted in chunk-sized units, and far below v times it
        assert bubble < 2 * (pp - 1) * v


def test_pp4_vp3_table():
    """The first rank of pp 4 with 3 chunks and 8 micro-batches, written out: 14 forward units of warm-up
    (2 per later stage, pp per extra chunk), micro-batches in blocks of pp through the chunks, then one
    forward and one backward (the last chunk's first)."""
    table = order(4, 3, 8, 0)
    head = [(u.micro_batch, u.chunk, "F" if u.forward else "B") for u in table[:18]]
    assert head == [(0, 0, "F"), (1, 0, "F"), (2, 0, "F"), (3, 0, "F"),
                    (0, 1, "F"), (1, 1, "F"), (2, 1, "F"), (3, 1, "F"),
                    (0, 2, "F"), (1, 2, "F"), (2, 2, "F"), (3, 2, "F"),
                    (4, 0, "F"), (5, 0, "F"), (6, 0, "F"), (0, 2, "B"), (7, 0, "F"), (1, 2, "B")]
    assert warmup(4, 3, 8, 3) == 8 and order(4, 3, 8, 3)[8:10] == [Unit(0, 2, True), Unit(0, 2, False)]
    tail = [(u.micro_batch, u.chunk) for u in table[-4:]]
    assert tail == [(4, 0), (5, 0), (6, 0), (7, 0)] and not any(u.forward for u in table[-4:])


@pytest.mark.parametrize("pp,v,m", LAYOUTS + [(1, 1, 1), (1, 1, 4)])
def test_each_rank_runs_its_order_in_the_time_an_independent_simulation_takes(pp, v, m):
    table = schedule(pp, v, m)
    for rank in range(pp):
        assert [s.unit for s in table[rank] if s.unit is not None] == order(pp, v, m, rank)
        assert [s.time for s in table[rank]] == sorted({s.time for s in table[rank]}), "one step per time"
        assert steps(pp, v, m, rank) == table[rank]
    assert max(s.time for rank in table for s in rank) + 1 == simulate(pp, v, m)


def _at(table, rank: int, time: int):
    return next((s for s in table[rank] if s.time == time), None)


@pytest.mark.parametrize("pp,v,m", LAYOUTS + [(1, 1, 4)])
def test_every_send_meets_its_receive_in_the_same_exchange(pp, v, m):
    """An activation of virtual stage c·pp + r goes to stage c·pp + r + 1 (rank r + 1, or chunk c + 1 of rank
    0 across the ring), a gradient to stage c·pp + r − 1; the neighbour receives it at the same time. Nothing
    is received that was not sent, and the first and last virtual stages send nothing outward."""
    table = schedule(pp, v, m)
    received = 0
    for rank in range(pp):
        for step in table[rank]:
            u = step.unit
            first, last = u is not None and rank == 0 and u.chunk == 0, u is not None and rank == pp - 1 and u.chunk == v - 1
            assert step.send_next == (u is not None and u.forward and not last)
            assert step.send_prev == (u is not None and not u.forward and not first)
            if step.send_next:
                there = _at(table, (rank + 1) % pp, step.time)
                assert there is not None and there.recv_prev == (u.micro_batch, u.chunk + (rank == pp - 1)), (rank, step)
            if step.send_prev:
                there = _at(table, (rank - 1) % pp, step.time)
                assert there is not None and there.recv_next == (u.micro_batch, u.chunk - (rank == 0)), (rank, step)
            if step.recv_prev is not None:
                sender = _at(table, (rank - 1) % pp, step.time)
                assert sender is not None and sender.send_next
                received += 1
            if step.recv_next is not None:
                sender = _at(table, (rank + 1) % pp, step.time)
                assert sender is not None and sender.send_prev
                received += 1
    # every virtual stage but the first receives m activations, every one but the last m gradients
    assert received == 2 * m * (pp * v - 1)


@pytest.mark.parametrize("pp,v,m", LAYOUTS)
def test_a_unit_runs_only_on_what_arrived_before_it(pp, v, m):
    table = schedule(pp, v, m)
    for rank in range(pp):
        arrived: dict[tuple[int, int, bool], int] = {}
        for step in table[rank]:
            u = step.unit
            if u is not None and not (rank == 0 and u.chunk == 0 and u.forward) \
                    and not (rank == pp - 1 and u.chunk == v - 1 and not u.forward):
                assert arrived.pop((u.micro_batch, u.chunk, u.forward)) < step.time, (rank, step)
            for got, forward in ((step.recv_prev, True), (step.recv_next, False)):
                if got is not None:
                    assert (*got, forward) not in arrived, "received twice"
                    arrived[(*got, forward)] = step.time
        assert arrived == {}, f"received but never used: {arrived}"


def test_micro_batches_fewer_than_stages_still_run():
    assert simulate(4, 1, 2) == 2 * 2 + 2 * 3


def test_refuses_what_the_schedule_cannot_run():
    with pytest.raises(ValueError, match="multiple of pp"):
        order(4, 2, 6, 0)
    with pytest.raises(ValueError, match="not a stage"):
        order(4, 2, 8, 4)


def test_layouts_cover_the_issue_cases():
    assert {(pp, v) for pp, v, _ in LAYOUTS} >= set(itertools.product((2, 4), (2, 3)))
