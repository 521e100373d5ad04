"""benchmark/perf/gpu_side_by_side.py as a GPU session runs it, on CPU at a tiny size: every peer trains
the same shape, a peer that cannot run (megatron-core where it is not installed) is reported, not hidden,
and no MFU is printed without a known peak."""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmark", "perf", "gpu_side_by_side.py")


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
