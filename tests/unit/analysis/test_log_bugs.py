"""Each bug issue 32 found in reading real logs, as a test that failed before its fix."""

import pytest
from conftest import DATA

from nlp_bench.analysis import metrics, parsers
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
    # (a bar first seen at a late step starts the clock there: a resumed run's first redraw times nothing)
    assert [r.iteration for r in records] == list(range(34102, 34113))
    assert {r.iteration_time_s for r in records} == {60.0}


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


# --- found by reading 46 real logs against the parsers (the note lists them), each written here in our words


def test_the_batch_comes_from_consumed_samples_per_global_step_when_the_postfix_lags():
    """NxD Training DPO: the postfix is refreshed every other step, so per bar step consumed_samples moves
    by two batches at a time; per global_step (shown to the unit) it moves by one."""
    posts = {3: "global_step=1.000, consumed_samples=32.00", 4: "global_step=3.000, consumed_samples=64.00",
             5: "global_step=3.000, consumed_samples=64.00", 6: "global_step=5.000, consumed_samples=96.00"}
    redraws = [_bar("Epoch 0", n, 62, 150.0 + 25.0 * n, "0.02it/s", posts[n]) for n in posts]
    assert {r.global_batch_size for r in parsers.parse("\r".join(redraws) + "\n").records} == {16}


def test_steps_of_a_few_seconds_are_each_a_record_and_the_last_interval_is_kept():
    redraws = [_bar("Epoch 0", n, 18, 8.0 + 3.0 * (n - 1), "4.14s/it", f"loss={10 - n / 10}") for n in range(1, 6)]
    records = parsers.parse("\r".join(redraws) + "\n").records
    assert [(r.iteration, r.iteration_time_s) for r in records] == [(1, 8), (2, 3), (3, 3), (4, 3), (5, 3)]


def test_a_log_that_begins_inside_a_validation_times_no_step_with_it():
    redraws = [_bar("Validation DataLoader 0", 41, 120, 2.0, "20.00it/s"),
               _bar("Epoch 0", 700, 820, 29.0, "24.10it/s", "loss=1.9, v_num=3")]
    with pytest.raises(parsers.NoRecords):
        parsers.parse("\r".join(redraws) + "\n")


def test_redraws_glued_and_cut_before_their_bracket_keep_what_was_closed():
    first = _bar("Epoch 0", 5, 300, 98.0, "19.60s/it", "reduced_train_loss=9.5, train_step_timing in s=3.91")
    cut = _bar("Epoch 0", 6, 300, 130.0, "21.67s/it", "reduced_train_loss=9.5, train_step_timing in s=3.93")[:-1]
    glued = cut + _bar("Epoch 0", 7, 300, 134.0, "19.14s/it", "reduced_train_loss=9.4, train_step_timing in s=3.92")
    parsed = parsers.parse(first + "\n" + glued + "\n")
    assert [(r.iteration, r.iteration_time_s, r.loss) for r in parsed.records] == [(5, 3.91, 9.5), (7, 3.92, 9.4)]


def test_a_bar_without_its_bar_under_mpi_tagging_and_faster_than_its_clock():
    lines = ["[1,mpirank:0,algo-2]<stdout>:#015Epoch 0:  50% 1/2 [00:00<00:00,  5.10it/s, loss=1.87, v_num=4]",
             "[1,mpirank:0,algo-2]<stdout>:#015Epoch 0: 100% 2/2 [00:00<00:00,  9.80it/s, loss=1.87, v_num=4]"]
    parsed = parsers.parse("\n".join(lines) + "\n")
    assert [(r.iteration, r.iteration_time_s) for r in parsed.records] == [(2, pytest.approx(1 / 9.80))]
    assert any("rate" in reason for reason in parsed.warnings)


def test_a_bar_of_unknown_total_and_empty_values():
    line = "Epoch 0: :   0%|          | 388/? [14:02<00:00, v_num=, reduced_train_loss=, train_step_timing in s=]"
    record = parsers.parse(line + "\n").records[0]
    assert (record.iteration, record.total_iterations) == (388, None)
    assert record.iteration_time_s == pytest.approx((14 * 60 + 2) / 388)


def test_a_resumed_bar_starts_its_clock_at_its_first_step():
    redraws = [_bar("Epoch 0", 0, 9000, 0.0, "?it/s"), _bar("Epoch 0", 5001, 9000, 50.0, "50.00s/it")]
    redraws += [_bar("Epoch 0", n, 9000, 50.0 + 25 * (n - 5001), "25.00s/it") for n in range(5002, 5006)]
    records = parsers.parse("\r".join(redraws) + "\n").records
    assert [(r.iteration, r.iteration_time_s) for r in records] == [(n, 25.0) for n in range(5002, 5006)]


def test_lightning_1_refreshing_every_ten_steps_redraws_its_bar_once_after_validation():
    redraws, clock = [], 0.0
    for n in range(1, 201):
        clock += 30
        shown = n if n <= 100 else n + 5  # the bar counts the five validation batches
        if shown % 10 == 0:
            redraws.append(_bar("Epoch 0", shown, 205, clock, "30.00s/it", f"loss={n}.0"))
        if n == 100:
            redraws.append(_bar("Validating", 5, 5, 5.0, "1.00it/s"))
            redraws.append(_bar("Epoch 0", 105, 205, clock + 5, "30.00s/it", f"loss={n}.0"))
    records = parsers.parse("\r".join(redraws) + "\n").records
    assert all(r.loss == r.iteration for r in records), [(r.iteration, r.loss) for r in records if r.loss != r.iteration]
    assert records[-1].iteration == 195 and {r.iteration_time_s for r in records} == {30.0}


def test_megatron_reads_the_sequence_length_its_arguments_print():
    text = ("------------------------ arguments ------------------------\n"
            "  micro_batch_size ................ 4\n  seq_length ...................... 2048\n"
            " iteration      10/     100 | consumed samples:          640 | elapsed time per iteration (ms): 1000.0 |"
            " global batch size:    64 | lm loss: 9.1E+00 |\n")
    views, summary = metrics.steady_summary(parsers.parse(text).records, None)
    assert views[0]["seq_length"] == 2048 and views[0]["tokens_per_s"] == pytest.approx(64 * 2048)
    deepspeed = (" iteration      10/     100 | consumed samples:          640 | consumed tokens:      2621440 |"
                 " elapsed time per iteration (ms): 1000.0 | global batch size:    64 | actual seqlen:  4096 |\n")
    assert parsers.parse(deepspeed).records[0].seq_length == 4096


def test_nanotron_takes_no_batch_from_its_rounded_display():
    line = ("iteration: 5 / 100 | consumed_tokens: 7.86M | elapsed_time_per_iteration_ms: 812 | tokens_per_sec: 1.94M"
            " | global_batch_size: 1.54K | lm_loss: 9.1 | lr: 1e-05 | model_tflops_per_gpu: 400")
    parsed = parsers.parse(line + "\n")
    assert parsed.records[0].global_batch_size is None and parsed.warnings


def test_torchtitan_on_one_device_names_an_empty_mesh():
    text = ("[titan] 2026-01-01 10:00:00,000 - root - INFO - Building 0-D device mesh with [], []\n"
            "[titan] 2026-01-01 10:00:09,000 - root - INFO - step:  1  loss: 10.00000  memory: 1.00GiB(1.00%)"
            "  tps: 2,048  tflops: 1.00  mfu: 0.10%\n")
    assert parsers.parse(text).records[0].tokens_per_s == 2048


@pytest.mark.parametrize("event", ['[' * 50000, '{"time_ms": 1, "key": ["x"]}',
                                   '{"time_ms": Infinity, "key": "block_stop", "metadata": {}}',
                                   '{"time_ms": 1, "key": "block_stop", "metadata": {"samples_count": 1e400}}',
                                   '{"time_ms": 1, "key": "tracked_stats", "value": {"train_step_time": NaN},'
                                   ' "metadata": {"step": ' + "9" * 400 + '}}'])
def test_mllog_events_of_any_json_are_read_or_refused_never_a_crash(event):
    good = (DATA / "logs" / "mlperf_steps.log").read_text()
    parsed = parsers.parse(":::MLLOG " + event + "\n" + good)
    assert [r.iteration for r in parsed.records] == [1, 2, 3, 4, 5]


# --- found by a second, independent set of 30 real logs


def test_amd_primus_fields_give_the_interval_before_the_runs_mean():
    line = (" iteration     4210/   20000 | consumed samples:      1077760 | elapsed time per iteration (ms): 1850.2/1861.9 |"
            " throughput per GPU (TFLOP/s/GPU): 188.4/190.1 | global batch size:   256 | lm loss: 2.918004E+00 |")
    parsed = parsers.parse(line + "\n")
    record = parsed.records[0]
    assert (record.iteration_time_s, record.tflops_per_gpu) == (pytest.approx(1.8502), 188.4) and parsed.warnings == {}


def _mllog(time_ms: int, key: str, value=None, **metadata) -> str:
    import json

    return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": time_ms, "event_type": "POINT_IN_TIME", "key": key,
                                     "value": value, "metadata": {"file": "x.py", "lineno": 1, **metadata}})


def test_mlperf_training_between_evaluations_where_no_block_measures_it():
    """One block over the whole run with the evaluations inside it (Habana's GPT-3), or no block at all
    (tinygrad's BERT): the training between two evaluations, sized by the counts their starts carry."""
    for block in (True, False):
        lines = [_mllog(0, "global_batch_size", 64), _mllog(1000, "run_start")]
        if block:
            lines.append(_mllog(1000, "block_start", first_epoch_num=0, epoch_count=640))
        now = 1000
        for k, seconds in enumerate([70.0, 50.0, 50.5], 1):
            now += int(seconds * 1000)
            lines += [_mllog(now, "eval_start", epoch_num=640 * k), _mllog(now + 9000, "eval_stop", epoch_num=640 * k)]
            now += 9000
        if block:
            lines.append(_mllog(now, "block_stop", first_epoch_num=0))
        records = parsers.parse("\n".join(lines) + "\n").records
        assert [(r.iteration, r.iteration_time_s) for r in records] == [(10, 7.0), (20, 5.0), (30, 5.05)], block


def test_a_bar_whose_last_interval_is_too_short_to_time_is_not_guessed():
    redraws = [_bar("Epoch 0", n, 5005, 3.0 * n, "3.00s/it", "loss=1.0") for n in (1, 2)]
    redraws.append(_bar("Epoch 0", 6, 5005, 7.0, "1.17s/it", "loss=1.0"))  # four steps in one clock second
    records = parsers.parse("\r".join(redraws) + "\n").records
    assert [(r.iteration, r.iteration_time_s) for r in records] == [(1, 3.0), (2, 3.0)]


def test_a_restarted_nemo_run_logs_its_steps_again_and_says_so():
    line = ("Training epoch 0, iteration {i}/20 | lr: 1e-05 | global_batch_size: 8 | global_step: {i} |"
            " reduced_train_loss: 5.0 | train_step_timing in s: {t}")
    first = [line.format(i=i, t=2.0) for i in range(6)]
    again = [line.format(i=i, t=10.26 if i == 3 else 2.1) for i in range(3, 8)]
    parsed = parsers.parse("\n".join(first + again) + "\n")
    assert [r.iteration for r in parsed.records] == list(range(8))
    assert parsed.records[3].iteration_time_s == 2.0 and sum(parsed.warnings.values()) == 3
