import gc
import statistics

import pytest
from conftest import DATA

from nlp_bench.analysis import metrics, parsers
from nlp_bench.train.logline import iteration_line

SEED003 = DATA / "seed003_verification.log"


def test_seed003_verification_lines():
    records = parsers.parse_file(SEED003)
    assert [r.iteration for r in records] == [10, 20, 30, 40, 50]
    assert records[0].iteration_time_s == 7.2310 and records[0].total_iterations == 3125000
    assert records[0].global_batch_size == 96 and records[0].loss == pytest.approx(10.10967)
    assert records[3].tflops_per_gpu == 137.77 and records[3].samples_per_s == 18.014
    assert records[1].consumed_samples == 1920 and records[1].learning_rate == pytest.approx(8.876e-07)
    summary = metrics.summarise(records, seq_length=2048)
    mean = statistics.fmean([7.2310, 5.3551, 5.6192, 5.3291, 5.3247])
    assert summary.tokens_per_s == pytest.approx(96 * 2048 / mean)
    assert summary.time_to_report_s == pytest.approx(20e6 / (96 * 2048 / mean))
    assert summary.avg_tflops_per_gpu == pytest.approx(statistics.fmean([101.54, 137.10, 130.66, 137.77, 137.89]))
    assert summary.iterations == 50 and summary.intervals == 5


def test_noise_interleaving_duplicates_and_torn_line():
    good = SEED003.read_text().splitlines()
    text = "\n".join([
        "srun: job 123 queued and waiting for resources",
        "[default0]:jwb0001:123:456 [0] NCCL INFO Bootstrap : Using ib0:10.0.0.1<0>",
        good[0],
        good[0].replace("[default3]", "[default7]"),  # the same iteration from another rank
        "[default1]:/usr/lib/python3/site-packages/torch/warnings.py:12: UserWarning: something",
        good[1],
        "slurmstepd: error: *** JOB 123 ON jwb0001 CANCELLED AT 2026-01-01T00:00:00 DUE TO TIME LIMIT ***",
        good[2][: good[2].index("5.6192") + 4],  # killed in the middle of the elapsed time
    ])
    records = parsers.parse_text(text)
    assert [r.iteration for r in records] == [10, 20]
    torn_after = good[2][: good[2].index("learning rate")]
    assert parsers.parse_line(torn_after).iteration_time_s == 5.6192, "closed fields of a torn line still count"


def test_older_megatron_in_milliseconds_and_current_with_timestamp():
    old = (" iteration      100/    1000 | consumed samples:       102400 | elapsed time per iteration (ms): 8718.9 |"
           " learning rate: 1.000E-04 | global batch size:  1024 | lm loss: 6.5E+00 | loss scale: 1.0 |")
    rec = parsers.parse_line(old)
    assert rec.iteration_time_s == pytest.approx(8.7189) and rec.tflops_per_gpu is None
    new = (" [2026-01-02 03:04:05.678901] iteration       50/    1000 | consumed samples:        51200 |"
           " elapsed time per iteration (ms): 812.3 | throughput per GPU (TFLOP/s/GPU): 402.1 |"
           " learning rate: 1.000000E-04 | global batch size:  1024 | lm loss: 6.512345E+00 |")
    rec = parsers.parse_line(new)
    assert rec.iteration == 50 and rec.tflops_per_gpu == 402.1 and rec.iteration_time_s == pytest.approx(0.8123)


def test_trainer_line_round_trips_through_the_parser():
    line = iteration_line(iteration=7, total=40, consumed=28, seconds=0.25, lr=1e-3, global_batch=4, seq_length=8,
                          loss=10.5,
                          loss_scale=1.0, grad_norm=1.25, skipped=0, nan=1, tflops=0.0123)
    rec = parsers.parse_line("[default1]:" + line)
    assert (rec.iteration, rec.total_iterations, rec.consumed_samples, rec.global_batch_size) == (7, 40, 28, 4)
    assert rec.iteration_time_s == 0.25 and rec.samples_per_s == 16.0 and rec.nan_iterations == 1
    assert rec.tokens_per_s == 128.0
    assert rec.loss == pytest.approx(10.5) and rec.learning_rate == pytest.approx(1e-3)


def test_summary_without_logged_tflops_uses_the_jupiter_formula():
    from nlp_bench import flops

    records = [parsers.Record(10, 100, 2.0, global_batch_size=8), parsers.Record(20, 100, 4.0, global_batch_size=8)]
    shape = flops.Shape(8, 128, 2, 64, 1024, 256)
    s = metrics.summarise(records, 128, shape=shape, devices=2, peak_tflops=1.0)
    assert s.mean_iteration_time_s == 3.0 and s.tokens_per_s == pytest.approx(8 * 128 / 3.0)
    assert s.avg_tflops_per_gpu == pytest.approx(flops.jupiter_flops(shape) / (3.0 * 2 * 1e12))
    assert s.mfu == pytest.approx(flops.megatron_model_flops(shape) / (3.0 * 2 * 1e12))
    assert metrics.summarise([], 128) is None


LOGS = DATA / "logs"


@pytest.mark.parametrize("name,fmt,iterations,times", [
    ("megatron_jupiter.log", "megatron-jupiter", [10, 20, 30, 40, 50, 60], [7.2310, 5.3551, 5.6192, 5.3291, 5.3247, 5.4012]),
    ("megatron_ms.log", "megatron", [100, 200, 300, 400], [9.0124, 8.7189, 8.7201, 8.7195]),
    ("megatron_current.log", "megatron-current", [50, 100, 150, 200, 250], [1.5, 0.8123, 0.8151, 0.8107, 0.8139]),
    ("megatron_deepspeed.log", "megatron-deepspeed", [10, 20, 30], [3.1, 2.5, 2.51]),
    ("neuron_megatron.log", "neuron-megatron", [4871, 4872, 4873, 4874], [9.5, 8.7189, 8.7002, 8.701]),
    ("nxdt.log", "progress-bar", [3, 4, 5, 6, 8], [965 / 3, 315, 316, 315, 315]),
])
def test_every_format_is_detected_and_read(name, fmt, iterations, times):
    parsed = parsers.parse(parsers.read_log(LOGS / name))
    assert parsed.format == fmt
    assert [r.iteration for r in parsed.records] == iterations
    assert [r.iteration_time_s for r in parsed.records] == pytest.approx(times)


def test_megatron_variants_keep_their_fields():
    jupiter = parsers.parse_file(LOGS / "megatron_jupiter.log")
    assert jupiter[0].tflops_per_gpu == 101.25 and jupiter[0].samples_per_s == 13.276
    assert jupiter[-1].iteration == 60, "the torn iteration 70 (its time cut) is not a record"
    current = parsers.parse_file(LOGS / "megatron_current.log")
    assert current[1].tflops_per_gpu == 402.1 and current[1].global_batch_size == 1024
    deepspeed = parsers.parse_file(LOGS / "megatron_deepspeed.log")
    assert deepspeed[1].samples_per_s == 204.8 and deepspeed[1].tflops_per_gpu == 150.0
    neuron = parsers.parse_file(LOGS / "neuron_megatron.log")
    assert [r.samples_per_s for r in neuron] == [6.1, 7.34, 7.356, None], "a torn last throughput is not trusted"


def test_nxdt_redraws_keep_the_last_update_of_each_step_and_derive_the_batch():
    records = parsers.parse_file(LOGS / "nxdt.log")
    assert [r.loss for r in records] == [7.7, 5.47, 4.3, 4.1, 3.9]  # reduced_train_loss of each step's last redraw
    assert {r.global_batch_size for r in records} == {1024}  # from consumed_samples per step
    assert records[1].samples_per_s == pytest.approx(1024 / 315)


def test_hf_bert_gives_sequences_per_second():
    parsed = parsers.parse(parsers.read_log(LOGS / "hf_bert.log"))
    assert parsed.format == "hf-bert"
    assert [(r.iteration, r.samples_per_s, r.loss) for r in parsed.records] == [
        (78, 1200.5, 9.1875), (79, 2878.09, 8.9375), (80, 2875.31, 9.0), (81, 2877.35, 9.0)]
    views, summary = metrics.steady_summary(parsed.records, seq_length=128)
    assert views[1]["tokens_per_s"] == pytest.approx(2878.09 * 128) and views[1]["iteration_time_s"] is None
    assert summary["warmup_excluded"] == 1
    assert summary["samples_per_s"] == pytest.approx(statistics.fmean([2878.09, 2875.31, 2877.35]))


def test_steady_summary_excludes_warmup_and_reports_spread():
    records = parsers.parse_file(SEED003)
    views, summary = metrics.steady_summary(records, seq_length=2048)
    times = (5.3551, 5.6192, 5.3291, 5.3247)
    steady = [96 * 2048 / t for t in times]
    assert summary["warmup_excluded"] == 1 and summary["iterations"] == 50
    # JUBE's formula over the steady intervals: one batch over their mean time
    assert summary["tokens_per_s"]["mean"] == pytest.approx(96 * 2048 / statistics.fmean(times))
    assert summary["tokens_per_s"]["median"] == pytest.approx(statistics.median(steady))
    assert summary["tokens_per_s"]["std"] == pytest.approx(statistics.stdev(steady))
    half = 3.182 * statistics.stdev(times) / 2  # t(0.975, 3 df) * s / sqrt(4), on the times
    low, high = 96 * 2048 / (statistics.fmean(times) + half), 96 * 2048 / (statistics.fmean(times) - half)
    assert summary["tokens_per_s"]["ci95"] == pytest.approx([low, high])
    mean_time = statistics.fmean([7.2310, *times])
    assert summary["tokens_per_s_all_intervals"] == pytest.approx(96 * 2048 / mean_time)  # as the JUBE table
    assert summary["time_to_report_s"] == pytest.approx(20e6 * statistics.fmean(times) / (96 * 2048))
    assert views[0] == {"iteration": 10, "iteration_time_s": 7.231, "global_batch_size": 96, "seq_length": 2048,
                        "tokens_per_s": pytest.approx(96 * 2048 / 7.231), "samples_per_s": pytest.approx(96 / 7.231),
                        "tflops_per_gpu": 101.54, "mfu_percent": None, "loss": pytest.approx(10.10967)}


def test_t_quantiles():
    assert metrics.t95(1) == 12.706 and metrics.t95(30) == 2.042
    assert metrics.t95(40) == pytest.approx(2.021, abs=1e-3) and metrics.t95(120) == pytest.approx(1.980, abs=1e-3)


def test_a_log_without_records_is_a_parse_error():
    with pytest.raises(parsers.ParseError, match="no iteration records"):
        parsers.parse("NCCL INFO nothing to see\n")
    with pytest.raises(parsers.ParseError, match="unknown log format 'csv'"):
        parsers.parse("", "csv")
    with pytest.raises(parsers.ParseError, match="no nxdt iteration records"):
        parsers.parse_text and parsers.parse(SEED003.read_text(), "nxdt")


def test_zero_and_non_finite_values_are_not_measurements():
    line = (" iteration 10/ 100 | elapsed time per iteration (ms): 100.0 | global batch size: 0 |"
            " samples per second: 0.000 | TFLOPs: nan | lm loss: inf |\n")
    rec = parsers.parse_text(line)[0]
    assert (rec.global_batch_size, rec.samples_per_s, rec.tflops_per_gpu, rec.loss) == (None, None, None, None)
    _, summary = metrics.steady_summary([rec], seq_length=2048)
    assert summary["tokens_per_s"] is None and summary["time_to_report_s"] is None



def test_parsing_pauses_the_garbage_collector_and_gives_it_back(monkeypatch):
    """The collector is off while a log is parsed (speed) and back as it was afterwards, error or not."""
    seen = []
    real = parsers._scan
    monkeypatch.setattr(parsers, "_scan", lambda *args: seen.append(gc.isenabled()) or real(*args))
    assert gc.isenabled()
    parsers.parse(SEED003.read_text())
    assert seen == [False] and gc.isenabled()
    with pytest.raises(parsers.ParseError):
        parsers.parse("no records here\n")
    assert gc.isenabled()
    gc.disable()
    try:
        parsers.parse(SEED003.read_text())
        assert not gc.isenabled(), "a caller that had turned it off keeps it off"
    finally:
        gc.enable()


def test_large_files_are_parsed_in_parallel_ranges_with_the_same_result(tmp_path, monkeypatch):
    """A big log is read and parsed in byte ranges by forked workers; the records must be the one-pass
    ones, also when a range boundary falls between two ranks' copies of an iteration, next to a line
    of another shape, and with a torn last line."""
    jupiter = (LOGS / "megatron_jupiter.log").read_text().splitlines()
    line = next(text for text in jupiter if "iteration       10/" in text)
    body = []
    for i in range(1, 400):
        copy = line.replace("iteration       10/", f"iteration {10 * i:8d}/").replace("7.2310", f"{5 + i / 1000:.4f}")
        body += [copy, copy.replace("[default3]", "[default7]"), "NCCL INFO noise é"]
        if i == 200:
            body.append(" iteration     9999/   10000 | elapsed time per iteration (ms): 812.5 | global batch size: 96 |")
    log = tmp_path / "job.out"
    log.write_text("\n".join(body) + "\n" + line.replace("iteration       10/", "iteration    99999/")[:80])
    serial = parsers.parse(log.read_text())
    monkeypatch.setattr(parsers, "PARALLEL_BYTES", log.stat().st_size // 3)
    monkeypatch.setattr(parsers.os, "cpu_count", lambda: 3)  # three ranges even on a 2-core machine
    assert parsers._parallel(log, ["megatron"], parsers.CHUNK_BYTES) is not None, "the parallel path must be tested"
    parallel = parsers.parse_log(log)
    assert parallel.format == serial.format == "megatron-jupiter"
    assert parallel.records == serial.records and len(serial.records) == 400
    assert serial.records[-1].iteration == 9999 and serial.records[-1].iteration_time_s == 0.8125
    assert parsers.parse_log(log, "megatron-jupiter").records == serial.records
