"""The planner's owed GPU measurements (benchmark/perf/gemm_sustained.py, layer_fixed_cost.py and the script
that runs them with gemm_rates.py in one device call) run here on CPU at toy sizes, and the planner's layer time
stays near the layers the H200 measured (benchmark/perf/measured/)."""


import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

PERF = ROOT / "benchmark" / "perf"

@pytest.mark.slow
@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils' timeout")
def test_the_owed_device_call_rehearses_every_stage_on_cpu(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "DEVICE": "cpu", "SMALL": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["bash", str(PERF / "gpu_planner_owed.sh")], cwd=PERF.parent.parent, env=env, check=True,
                   capture_output=True, timeout=300)
    summary = (tmp_path / "summary.txt").read_text()
    assert summary.count(": exit 0 after") == 4, summary
    for name in ("gemm_rates_tokens", "sustained_bf16", "layer_fixed_cost"):
        assert json.loads((tmp_path / f"{name}.json").read_text())
