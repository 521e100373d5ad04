"""Each bug issue 32 found in reading real logs, as a test that failed before its fix."""

import pytest

from nlp_bench.analysis import parsers
from nlp_bench.analysis.formats import megatron


def _clock(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def _bar(name: str, n: int, total: int, elapsed: float | None, rate: str, post: str = "") -> str:
    clock = f"{_clock(int(elapsed))}<{_clock(max(0, total - n) * 7)}" if elapsed is not None else "?"
    return f"{name}: {100 * n // total:3d}%|##  | {n}/{total} [{clock}, {rate}{', ' + post if post else ''}]"


def test_a_bar_is_timed_by_its_clock_not_its_rate():
    """Steps of 25.5 s after a first step of 120 s: tqdm's rate (elapsed over steps since the bar began,
    printed to two digits) says 40 s/step at step 5; the clock says 25.5."""
    elapsed, redraws = 120.4, []
    for n in range(1, 13):
        if n > 1:
            elapsed += 25.5
        rate = f"{n / elapsed:.2f}it/s"
        redraws.append(_bar("Epoch 0", n, 500, elapsed, rate, f"loss=2.{n}, global_step={n - 1}.0"))
    records = parsers.parse("\r".join(redraws) + "\n").records
    assert records[0].iteration_time_s == pytest.approx(120)
    steady = [r.iteration_time_s for r in records[1:]]
    assert sum(steady) / len(steady) == pytest.approx(25.5, abs=0.15)
    assert all(25 <= t <= 26 for t in steady)


def test_a_rounded_global_step_does_not_collapse_steps():
    """tqdm shows global_step=3.1e+4 for four steps in a row: the bar's own counter keys the records."""
    redraws = [_bar("Epoch 2", n, 40000, 60.0 * (n - 34100), "60.00s/it", "loss=1.5, global_step=3.1e+4")
               for n in range(34101, 34113)]
    records = parsers.parse("\n".join(redraws) + "\n").records
    assert [r.iteration for r in records] == list(range(34101, 34113))
    assert records[-1].iteration_time_s == 60.0


def test_a_validation_bar_never_overwrites_a_training_step():
    train = [_bar("Epoch 0", n, 100, 30.0 * n, "30.00s/it", f"loss={10 - n}.0") for n in range(1, 5)]
    validation = [_bar("Validation DataLoader 0", n, 5, 2.0 * n, "2.00s/it", "loss=0.1") for n in range(1, 6)]
    after = [_bar("Epoch 0", n, 100, 30.0 * n + 10, "30.00s/it", f"loss={10 - n}.0") for n in range(5, 8)]
    records = parsers.parse("\r".join(train + validation + after) + "\n").records
    assert [r.iteration for r in records] == [1, 2, 3, 4, 6, 7], "step 5's interval spans the validation"
    assert [r.loss for r in records] == [9.0, 8.0, 7.0, 6.0, 4.0, 3.0]
    assert {r.iteration_time_s for r in records} == {30.0}


def test_lightning_1_counts_validation_batches_on_the_training_bar():
    """Lightning 1.x's training bar total holds the validation batches, and it advances through them."""
    train = [_bar("Epoch 0", n, 110, 30.0 * n, "30.00s/it", f"loss={n}.0") for n in range(1, 4)]
    mixed = []
    for k in range(1, 11):
        mixed.append(_bar("Validating", k, 10, 1.0 * k, "1.00it/s"))
        mixed.append(_bar("Epoch 0", 3 + k, 110, 90.0 + k, "25.00s/it", "loss=3.0"))
    after = [_bar("Epoch 0", n, 110, 100.0 + 30 * (n - 13), "30.00s/it", f"loss={n - 10}.0") for n in range(14, 17)]
    records = parsers.parse("\r".join(train + mixed + after) + "\n").records
    assert [r.iteration for r in records] == [1, 2, 3, 5, 6]
    assert [r.loss for r in records] == [1.0, 2.0, 3.0, 5.0, 6.0]


def test_a_second_epoch_continues_the_count_and_restarts_the_clock():
    first = [_bar("Epoch 0", n, 3, 40.0 * n, "40.00s/it", f"loss={n}.0") for n in range(1, 4)]
    second = [_bar("Epoch 1", n, 3, 50.0 * n, "50.00s/it", f"loss={n + 3}.0") for n in range(1, 4)]
    records = parsers.parse("\r".join(first + second) + "\n").records
    assert [(r.iteration, r.iteration_time_s) for r in records] == [
        (1, 40), (2, 40), (3, 40), (4, 50), (5, 50), (6, 50)]


def test_nemo_bars_use_nemo_s_own_step_timer_and_the_rate_only_without_a_clock():
    nemo = [_bar("Epoch 0", n, 9, 61.0 * n, "61.18s/it", f"reduced_train_loss=3.{n}, train_step_timing in s=118.43")
            for n in range(1, 4)]
    parsed = parsers.parse("\r".join(nemo) + "\n")
    assert parsed.format == "nemo1" and {r.iteration_time_s for r in parsed.records} == {118.43}
    no_clock = [_bar("Epoch 0", n, 9, None, "2.50s/it", "loss=1.0") for n in range(1, 4)]
    parsed = parsers.parse("\r".join(no_clock) + "\n")
    assert [r.iteration_time_s for r in parsed.records] == [2.5] * 3
    assert any("rate" in reason for reason in parsed.warnings)


def test_fast_steps_make_intervals_of_at_least_ten_clock_seconds():
    """At 0.4 s/step the whole-second clock moves by 0 or 1 between steps: intervals span 10 s or more."""
    redraws = [_bar("Epoch 0", n, 1000, 0.4 * n, "2.50it/s") for n in range(1, 201)]
    records = parsers.parse("\r".join(redraws) + "\n").records
    assert all(r.iteration_time_s == pytest.approx(0.4, rel=0.1) for r in records[1:])
    spans = [records[0].iteration] + [b.iteration - a.iteration for a, b in zip(records, records[1:], strict=False)]
    assert min(spans[1:]) >= 25, "an interval spans at least 10 s of the clock"
    total = sum(span * r.iteration_time_s for span, r in zip(spans, records, strict=True))
    assert total == pytest.approx(0.4 * records[-1].iteration, abs=1.0), "the intervals add up to the clock"


OLD = (" iteration      {:3d}/  320000 | elapsed time per iteration (ms): 512.3 | learning rate 1.500E-04 |"
       " lm loss 1.020020E+01 | loss scale 65536.0 |")


def test_megatron_2019_fields_without_a_colon_are_read():
    for text in (OLD.format(100), "\n".join(OLD.format(i) for i in range(100, 140)) + "\n"):
        records = parsers.parse(text + "\n").records
        assert records[0].loss == pytest.approx(10.2002) and records[0].learning_rate == pytest.approx(1.5e-4)
        assert records[0].loss_scale == 65536.0 and records[0].iteration_time_s == pytest.approx(0.5123)


def test_a_line_cut_in_its_last_field_is_dropped_and_counted():
    good = " iteration {:4d}/ 1000 | elapsed time per iteration (ms): 800.0 | lm loss: 8.123456E+00 |"
    cut = " iteration   30/ 1000 | elapsed time per iteration (ms): 800.0 | lm loss: 8."
    parsed = parsers.parse("\n".join([good.format(10), good.format(20), cut, good.format(40)]) + "\n")
    assert [r.iteration for r in parsed.records] == [10, 20, 40]
    assert parsed.warnings == {megatron.CUT: 1}
    assert megatron.parse_line(cut, terminated=True) is None
    cut_in_key = cut[: cut.index("lm loss") + 5]
    assert parsers.parse(good.format(10) + "\n" + cut_in_key + "\n").warnings == {megatron.CUT: 1}


def test_the_neuron_reference_ends_with_an_open_throughput_field():
    line = " iteration     4872/   10000 | elapsed time per iteration (ms): 8718.9 | lm loss: 6.5E+00 | throughput: 7.340"
    parsed = parsers.parse(line + "\n")
    assert parsed.records[0].samples_per_s == 7.34 and parsed.warnings == {}


def test_a_field_the_parser_knows_but_cannot_read_is_a_warning():
    line = " iteration   10/ 1000 | elapsed time per iteration (ms): 800.0 | lm loss: -- |"
    parsed = parsers.parse(line + "\n")
    assert parsed.records[0].loss is None and list(parsed.warnings) == ["unreadable 'lm loss' field (left empty)"]
