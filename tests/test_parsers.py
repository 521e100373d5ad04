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
