"""benchmark/perf/gpu_side_by_side.py run as a GPU session runs it, in a process of its own on CPU at a tiny
size: every peer trains the same shape, a peer that cannot run (megatron-core where it is not installed) is
reported, not hidden, no MFU is printed without a known peak, and a peer past the time budget is skipped."""

import json
import subprocess
import sys

import pytest
from side_by_side_script import SCRIPT, side_by_side


@pytest.mark.slow
def test_side_by_side_on_cpu(tmp_path):
    out = tmp_path / "sbs.json"
    proc = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--size", "tiny", "--repeats", "1",
                           "--iters", "6", "--peers", "builtin,torch-eager,megatron-core", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = {row["peer"]: row for row in json.loads(out.read_text())["rows"]}
    assert found["builtin"]["tokens_per_s"] > 0 and found["torch-eager"]["tokens_per_s"] > 0
    assert found["builtin"]["ratio_to_best_peer"] == pytest.approx(
        found["builtin"]["tokens_per_s"] / found["torch-eager"]["tokens_per_s"])
    assert all(row["mfu"] is None for row in found.values()) and "no MFU on CPU" in proc.stdout
    if found["megatron-core"]["tokens_per_s"] is None:
        assert "megatron" in found["megatron-core"]["note"].lower()

@pytest.mark.slow
def test_a_run_past_the_budget_is_skipped_and_said_and_each_log_is_kept(tmp_path):
    """A device lease is short: after the first run, a peer whose run would end past --budget-s is skipped
    with the reason in its row; the builtin's log (energy figures, kernels) is kept under --logs. The plain
    GPT refuses a Llama shape instead of training another model."""
    out, logs = tmp_path / "sbs.json", tmp_path / "logs"
    proc = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--size", "llama-tiny", "--repeats", "2",
                           "--iters", "4", "--peers", "builtin,torch-eager", "--budget-s", "1", "--json", str(out),
                           "--logs", str(logs)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = {row["peer"]: row for row in json.loads(out.read_text())["rows"]}
    assert found["builtin"]["tokens_per_s"] > 0 and len(found["builtin"]["runs"]) == 1
    assert found["torch-eager"]["tokens_per_s"] is None
    assert "over the 1 s budget" in found["torch-eager"]["note"]
    log = (logs / "llama-tiny-builtin-1.log").read_text()
    assert "4 heads in 2 query groups" in log and " iteration " in log
    with pytest.raises(RuntimeError, match="the plain GPT has no"):
        side_by_side()._worker("torch-eager", "llama-tiny", 2, "cpu")
