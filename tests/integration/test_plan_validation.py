"""The planner's validation corpus, its leave-one-source-out errors, and the trust every prediction carries."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import ROOT


def test_the_sweeps_outside_the_corpus_are_predicted_per_context_parallel_size():
    """benchmark/perf/planner_sweeps.py: the memory file's sweeps, their figures in Megatron-LM core 0.9's count."""
    root = ROOT
    out = subprocess.run([sys.executable, str(root / "benchmark" / "perf" / "planner_sweeps.py"), "--system",
                          "fujii-a100-40gb-8k=" + str(root / "benchmark" / "perf" / "profiles" / "abci-a.yaml")],
                         capture_output=True, text=True, check=True).stdout
    lines = [line for line in out.splitlines() if line.startswith("fujii-a100-40gb-8k on abci-a")]
    assert [re.search(r"cp (\d+):", line).group(1) for line in lines] == ["1", "2", "4"]
    assert "11 layouts" in lines[0]
