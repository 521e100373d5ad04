"""The formats of issue 32, each read from a fixture written in its exact format (our own values): the
numbers the lines print come out, detected among the others."""




import pytest
from conftest import DATA

from nlp_bench.analysis import metrics, parsers
from nlp_bench.analysis.formats import FORMATS

LOGS = DATA / "logs"

def test_torchtitan_colours_ranks_and_start_up_lines():
    parsed = parsers.parse_log(LOGS / "torchtitan.log")
    assert parsed.format == "torchtitan" and parsed.warnings == {}
    records = parsed.records
    assert [r.iteration for r in records] == [1, 10, 20, 30], "rank 1's copy of step 1 counts once"
    assert [r.loss for r in records] == [12.25104, 9.87342, 8.12078, 7.30011]
    # tps is per device: the job's tokens/s is tps x the mesh's 8 x 2 devices; a step, one batch's tokens over it
    assert [r.tokens_per_s for r in records] == [512 * 16, 3567 * 16, 3571 * 16, 3570 * 16]
    assert records[1].iteration_time_s == pytest.approx(16 * 8192 / (3567 * 16))
    assert (records[1].tflops_per_gpu, records[1].mfu_percent, records[1].grad_norm) == (164.48, 16.63, 3.1012)
    assert {(r.global_batch_size, r.seq_length) for r in records} == {(16, 8192)}
    views, summary = metrics.steady_summary(records, None)
    assert views[2]["tokens_per_s"] == pytest.approx(3571 * 16, rel=1e-9) and summary["warmup_excluded"] == 1

def test_torchtitan_without_start_up_lines_times_steps_by_its_timestamps():
    lines = [line for line in (LOGS / "torchtitan.log").read_text().splitlines() if "step:" in line]
    parsed = parsers.parse("\n".join(lines) + "\n")
    assert [r.iteration for r in parsed.records] == [1, 10, 20, 30]
    assert parsed.records[0].iteration_time_s is None, "step 1 has no line before it to time it by"
    assert parsed.records[1].tokens_per_s is None
    assert [r.iteration_time_s for r in parsed.records[1:]] == pytest.approx([18.362 / 9, 18.352 / 10, 18.358 / 10])
    assert any("device mesh" in reason for reason in parsed.warnings)

@pytest.mark.parametrize("name,times,gbs,seq,tokens", [
    ("nanotron.log", [31.2, 4.81, 4.79], 256, 4096, [33.6e3, 218e3, 219e3]),
    ("nanotron_2025.log", [17.9, 0.612], 128, 2048, [14.6e3, 428e3]),
])
def test_nanotron_human_formatted_numbers_in_both_releases(name, times, gbs, seq, tokens):
    parsed = parsers.parse_log(LOGS / name)
    assert parsed.format == "nanotron"
    assert [r.iteration_time_s for r in parsed.records] == pytest.approx(times)
    assert [r.tokens_per_s for r in parsed.records] == pytest.approx(tokens)
    assert {(r.global_batch_size, r.seq_length) for r in parsed.records} == {(gbs, seq)}
    views, _ = metrics.steady_summary(parsed.records, None)
    # one batch's tokens over the printed time (both rounded to three digits by nanotron): the printed rate's
    assert views[-1]["tokens_per_s"] == pytest.approx(tokens[-1], rel=5e-3)

def test_nemo2_progress_printer_keys_by_global_step():
    lines = [f"Training epoch {e}, iteration {i}/2 | lr: 1.5e-05 | global_batch_size: 128 | global_step: {g} | "
             f"reduced_train_loss: {9 - g / 10:.4} | train_step_timing in s: {t} | consumed_samples: {128 * (g + 1)}"
             + (" | TFLOPS_per_GPU: 402.1" if g else "")
             for g, (e, i, t) in enumerate([(0, 0, 95.31), (0, 1, 47.12), (0, 2, 47.08), (1, 0, 47.1)])]
    parsed = parsers.parse("\n".join(["Validation: iteration 1/2", *lines]) + "\n")
    assert parsed.format == "nemo2"
    assert [(r.iteration, r.iteration_time_s) for r in parsed.records] == [(0, 95.31), (1, 47.12), (2, 47.08), (3, 47.1)]
    assert parsed.records[1].tflops_per_gpu == 402.1 and parsed.records[1].global_batch_size == 128
    assert parsed.records[2].consumed_samples == 384 and parsed.records[2].loss == pytest.approx(8.8)

def test_nemo_1_21_bars_draw_no_rate_and_a_double_colon():
    redraws = [f"Epoch 0: :  {n * 6}%|#   | {n}/15 [{n:02d}:{n * 7 % 60:02d}<07:13, reduced_train_loss=11.5{n}, "
               f"global_step={n - 1}.000, consumed_samples={n * 2048}.0, train_step_timing in s=49.5{n}]" for n in range(1, 5)]
    parsed = parsers.parse("\r".join(redraws) + "\n")
    assert parsed.format == "nemo1"
    assert [(r.iteration, r.iteration_time_s, r.global_batch_size) for r in parsed.records] == [
        (n, float(f"49.5{n}"), 2048) for n in range(1, 5)]

def test_nxd_core_step_lines():
    timed = "\n".join(f"step {s} step_time {t}s throughput {r} seq/s step loss {9.1 - s / 10} grad norm 1.25"
                      for s, t, r in [(1, 30.5, 33.5), (2, 8.51, 71.9), (3, 8.49, 96.2)])
    parsed = parsers.parse(timed + "\n")
    assert parsed.format == "nxd-core"
    assert [(r.iteration, r.iteration_time_s, r.samples_per_s) for r in parsed.records] == [
        (1, 30.5, 33.5), (2, 8.51, 71.9), (3, 8.49, 96.2)]
    older = "step 4 step_time 8.5s throughput 120.5 seq/s loss 7.5"
    assert parsers.parse(older + "\n").records[0].loss == 7.5
    lightning = "step 7 loss is 6.25, lr is 1.5e-05, throughput 113.4 seq/s,  input_ids 12, norm 1.1, global rank 0"
    record = parsers.parse(lightning + "\n").records[0]
    assert (record.iteration, record.samples_per_s, record.iteration_time_s) == (7, 113.4, None)
    zero1 = "LOG Thu Jan  8 10:00:01 2026 - (0, 12) step_loss : 6.2500 learning_rate : 1.50e-05 throughput : 113.40 seq/s "
    assert parsers.parse(zero1 + "\n").records[0].samples_per_s == 113.4

def test_mlperf_per_step_timer_and_prefixes():
    parsed = parsers.parse_log(LOGS / "mlperf_steps.log")
    assert parsed.format == "mlperf"
    assert [(r.iteration, r.iteration_time_s) for r in parsed.records] == [
        (1, 2.431), (2, 1.012), (3, 1.009), (4, 1.011), (5, 1.010)], "the block summary does not repeat a step"
    assert {(r.global_batch_size, r.seq_length) for r in parsed.records} == {(32, 8192)}
    views, summary = metrics.steady_summary(parsed.records, None)
    assert views[1]["tokens_per_s"] == pytest.approx(32 * 8192 / 1.012) and summary["warmup_excluded"] == 1

def test_mlperf_blocks_timed_by_their_events_and_gpt3_counting_tokens():
    parsed = parsers.parse_log(LOGS / "mlperf_blocks.log")
    assert [r.iteration for r in parsed.records] == [12, 24, 36]
    assert [r.iteration_time_s for r in parsed.records] == pytest.approx([40 / 12, 37.5 / 12, 37.6 / 12])
    assert parsed.records[1].samples_per_s == pytest.approx(12 * 1536 / 37.5)

def test_a_cut_mllog_line_is_counted():
    text = (LOGS / "mlperf_steps.log").read_text().splitlines()
    text.insert(12, text[12][:60])
    parsed = parsers.parse("\n".join(text) + "\n")
    assert len(parsed.records) == 5 and sum(parsed.warnings.values()) == 1

NEMO2 = "".join(f"Training epoch 0, iteration {i}/99 | lr: 1.5e-05 | global_batch_size: 128 | global_step: {i} | "
                f"reduced_train_loss: {9 - i / 50:.4} | train_step_timing in s: {4.7 + i % 3 / 100} | "
                f"consumed_samples: {128 * (i + 1)}\n[NeMo I] noise between steps\n" for i in range(40))

@pytest.mark.parametrize("name,fmt", [("torchtitan.log", "torchtitan"), ("nanotron.log", "nanotron"),
                                      ("mlperf_steps.log", "mlperf"), ("nxdt.log", "nxdt"), (None, "nemo2")])
def test_each_format_read_alone_and_in_parallel_ranges_alike(name, fmt, tmp_path, monkeypatch):
    """A large log is read in byte ranges by forked workers: the scans' parts must join as one pass (NeMo 2's
    records are made in the workers)."""
    text = (LOGS / name).read_text() if name else NEMO2
    big = tmp_path / "job.out"
    big.write_text(text * 3)
    monkeypatch.setattr(parsers, "PARALLEL_BYTES", len(text))
    monkeypatch.setattr(parsers.os, "cpu_count", lambda: 3)
    assert parsers._parallel(big, [FORMATS.resolve(fmt)], 1 << 20) is not None
    whole = parsers.parse(text * 3, fmt)
    ranged = parsers.parse_log(big, fmt)
    assert ranged.records == whole.records and ranged.format == fmt
