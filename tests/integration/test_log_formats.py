"""The formats of issue 32, each read from a fixture written in its exact format (our own values): the
numbers the lines print come out, detected among the others."""

import json
import subprocess
import sys

import pytest

from nlp_bench.analysis import parsers


def test_the_trainer_writes_an_mlperf_log_the_mlperf_package_reads(tmp_path):
    mlp_parser = pytest.importorskip("mlperf_logging.compliance_checker.mlp_parser")
    log = tmp_path / "runs" / "mlperf.log"
    proc = subprocess.run([sys.executable, "-m", "nlp_bench.train", "--num-layers", "2", "--hidden-size", "64",
                           "--num-attention-heads", "4", "--seq-length", "16", "--micro-batch-size", "2", "--lr",
                           "1e-3", "--train-iters", "6", "--mock-data", "--vocab-size", "100", "--distributed-backend",
                           "gloo", "--log-interval", "2", "--eval-interval", "3", "--eval-iters", "1",
                           "--mlperf-log", str(log)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines, errors = mlp_parser.parse_file(str(log), ruleset="4.1.0")
    assert errors == [] and len(lines) > 20
    keys = [line.key for line in lines]
    for key in ("init_start", "init_stop", "run_start", "block_start", "tracked_stats", "block_stop", "eval_accuracy",
                "run_stop", "global_batch_size", "max_sequence_length"):
        assert key in keys, key
    assert keys.index("init_stop") < keys.index("run_start") < keys.index("run_stop")
    stop = next(line for line in lines if line.key == "run_stop")
    assert stop.value["metadata"]["status"] == "success" and keys[0] == "cache_clear" and "eval_samples" in keys
    inside = False  # blocks hold training only: an evaluation falls between them, and none is left empty
    for line, following in zip(lines, lines[1:], strict=False):
        inside = {"block_start": True, "block_stop": False}.get(line.key, inside)
        assert not (inside and line.key.startswith("eval")), line.key
        if line.key == "block_start" and following.key == "block_stop":
            assert following.value["metadata"]["samples_count"] > line.value["metadata"]["samples_count"], "empty"
    # and our own parser reads it back: the step times the trainer's Megatron line printed
    ours = parsers.parse_log(log)
    megatron = parsers.parse(proc.stdout)
    assert ours.format == "mlperf" and [r.iteration for r in ours.records] == [2, 4, 6]
    stats = [json.loads(line.split(" ", 1)[1])["value"] for line in log.read_text().splitlines() if "tracked_stats" in line]
    assert [s["train_step_time"] for s in stats] == pytest.approx([r.iteration_time_s for r in megatron.records], abs=5.1e-5)

@pytest.mark.parametrize("name,why", [("a-file/m.log", "not a writable folder"), ("", "needs a file name"),
                                      ("full.log", "already holds a run's events"), (".", "is a folder")])
def test_an_mlperf_log_that_cannot_be_written_is_one_line_before_any_process_starts(tmp_path, name, why):
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "full.log").write_text(":::MLLOG {}\n")
    proc = subprocess.run([sys.executable, "-m", "nlp_bench.train", "--num-layers", "2", "--hidden-size", "64",
                           "--num-attention-heads", "4", "--seq-length", "16", "--micro-batch-size", "2", "--lr",
                           "1e-3", "--train-iters", "1", "--mock-data", "--vocab-size", "100", "--distributed-backend",
                           "gloo", "--mlperf-log", str(tmp_path / name) if name else ""], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and why in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
