"""torchtitan's mixture-of-experts runs and the first step of an excerpt. An MoE run prints the dense
run's step line (its load-balancing figures go to TensorBoard and W&B only) and a device mesh that names
ep and etp, which are drawn from dp_shard and cp and so are no devices of their own. The first `step:` line
of an excerpt has no earlier step to time it against: it is a record of its loss, TFLOP/s and MFU with no
time, and the figures that need a time leave it out. The fixture torchtitan_moe.log is written with
torchtitan's format strings (MetricsProcessor.log's step line, ParallelDims' mesh line)."""

import pytest
from conftest import DATA

from nlp_bench.analysis import metrics, parsers

MOE_LOG = DATA / "logs" / "torchtitan_moe.log"
PREFIX = "[titan] 2026-05-02 09:{:02d}:{:02d},000 - root - INFO - "


def _step(step: int, loss: float, tps: int, tflops: float, mfu: float) -> str:
    return (f"step: {step:2}  loss: {loss:8.5f}  grad_norm: {1.5:7.4f}  memory: {70.5:5.2f}GiB({88.01:.2f}%)  "
            f"tps: {round(tps):,}  tflops: {tflops:,.2f}  mfu: {mfu:.2f}%")


def test_the_first_step_of_an_excerpt_is_a_record_without_time():
    """An excerpt without start-up lines: the first step has no line before it (fails on 8111d26, which
    gave it no record at all)."""
    text = "".join(PREFIX.format(1, 10 * k) + _step(step, 9.0 - k, 5000, 110.5 + k, 11.2 + k) + "\n"
                   for k, step in enumerate((40, 50, 60)))
    parsed = parsers.parse(text)
    assert parsed.format == "torchtitan"
    first = parsed.records[0]
    assert (first.iteration, first.iteration_time_s, first.tokens_per_s) == (40, None, None)
    assert (first.loss, first.tflops_per_gpu, first.mfu_percent) == (9.0, 110.5, 11.2)
    assert [r.iteration_time_s for r in parsed.records[1:]] == [1.0, 1.0]  # 10 s over 10 steps


def test_figures_leave_the_untimed_first_step_out():
    """With the batch and sequence length known (no mesh line): steps timed by the timestamps, the first
    untimed; the figures are those of the timed steps, and no figure divides by a missing time."""
    init = PREFIX.format(0, 0) + ("Trainer is initialized with local batch size 4, global batch size 32, "
                                  "gradient accumulation steps 1, sequence length 4096, total steps 50\n")
    text = init + "".join(PREFIX.format(minute, second) + _step(step, 9.0, 5000, 110.5, 11.2) + "\n"
                          for step, minute, second in ((10, 1, 0), (20, 1, 30), (30, 1, 50), (40, 2, 10)))
    records = parsers.parse(text).records
    assert [r.iteration_time_s for r in records] == [None, 3.0, 2.0, 2.0]
    views, summary = metrics.steady_summary(records, None)
    assert views[0]["iteration_time_s"] is None and views[0]["tokens_per_s"] is None and views[0]["loss"] == 9.0
    assert summary["warmup_excluded"] == 1, "warm-up decided among the timed steps: the 3 s one"
    assert summary["tokens_per_s"]["mean"] == pytest.approx(32 * 4096 / 2.0)
    assert summary["tokens_per_s_all_intervals"] == pytest.approx(32 * 4096 / (7 / 3))
    assert summary["avg_tflops_per_gpu_all_intervals"] == 110.5
    table = metrics.summarise(records, 4096)
    assert table.intervals == 3 and table.mean_iteration_time_s == pytest.approx(7 / 3)
    assert metrics.jube_tokens_per_s(records, 4096) == pytest.approx(32 * 4096 / (7 / 3))
    assert metrics.summarise(records[:1], 4096, 32) is None, "one untimed step: no figure, no division"


def test_an_moe_run_counts_its_devices_without_ep():
    """`ep=8` is carved out of dp_shard=8: the job has 8 devices, so tokens/s is tps x 8."""
    parsed = parsers.parse_log(MOE_LOG)
    assert parsed.format == "torchtitan" and parsed.warnings == {}
    records = parsed.records
    assert [r.iteration for r in records] == [1, 10, 20, 30]
    assert [r.tokens_per_s for r in records] == [900 * 8, 5210 * 8, 5230 * 8, 5224 * 8]
    assert records[1].iteration_time_s == pytest.approx(32 * 4096 / (5210 * 8))
    assert {(r.global_batch_size, r.seq_length) for r in records} == {(32, 4096)}
    assert (records[2].loss, records[2].tflops_per_gpu, records[2].mfu_percent) == (9.5, 112.44, 11.35)


def test_an_n_d_mesh_that_names_the_expert_dimensions():
    """torchtitan's mesh with ep splits dp_shard into named dimensions: their product is the world."""
    mesh = PREFIX.format(0, 0) + "Building 4-D device mesh with ['dp_shard_mod_ep', 'dp_shard_in_ep', 'cp', 'tp'], [2, 4, 1, 2]\n"
    text = mesh + PREFIX.format(1, 0) + _step(10, 9.0, 5000, 110.5, 11.2) + "\n"
    assert parsers.parse(text).records[0].tokens_per_s == 5000 * 16
