"""benchmark/perf's kernel scripts run as a GPU session runs them, each in a process of its own:
norm_registers.py compiling the norm kernels for an H100 without one, and norm_launch.py timing every launch
setting under Triton's interpreter on CPU (triton_interpreter.py) after checking it against the reference.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import PERF
from triton_interpreter import KERNEL_MARKS, interpreted

with interpreted():
    pytest.importorskip("triton")
    from nlp_bench.kernels import norm_settings

pytestmark = KERNEL_MARKS

def test_chunked_norm_kernels_hold_a_chunk_not_the_row_in_registers():
    """benchmark/perf/norm_registers.py compiles for an H100 without one: at width 12288 the whole-row forward
    needs every register ptxas allows a thread (or spills); the chunked kernels read the row twice so that
    they hold one chunk, which is what lets several rows be in flight per multiprocessor."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    command = [sys.executable, str(PERF / "norm_registers.py"), "--widths", "12288", "--warps", "8", "--rows", "1",
               "--prefetch", "0", "--chunks", "2048"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, check=True).stdout
    table = {}
    for line in out.splitlines()[1:]:
        *name, width, warps, rows, ahead, chunk, registers, spill, shared, programs, warps_per_sm = line.split()
        table[" ".join(name), chunk] = int(registers), int(spill), int(programs)
    whole, chunked, chunked_dx = table["forward", "-"], table["forward", "2048"], table["backward dx", "2048"]
    assert whole[0] == 255 or whole[1] > 0
    for registers, spill, programs in (chunked, chunked_dx):
        assert spill == 0 and registers <= 64 and programs >= 4

@pytest.mark.slow
def test_norm_launch_checks_every_setting_and_prints_one_the_trainer_takes(tmp_path):
    """benchmark/perf/norm_launch.py, run as a GPU session would but on CPU under the interpreter at a small
    shape: every setting it times must first match the fp32 reference, and its best per norm must be an
    NLP_BENCH_NORM_LAUNCH the trainer accepts, so that the GPU minutes are spent on timings only."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    chosen = tmp_path / "launch"
    command = [sys.executable, str(PERF / "norm_launch.py"), "--rows", "9", "--widths", "40,16", "--chunks", "16",
               "--warps", "0", "--per-processor", "0,1", "--norms", "layer_norm,rms_norm", "--param-tiles", "2x16",
               "--param-warps", "4", "--param-rows", "2,4", "--out", str(chosen)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "WRONG" not in out.stdout
    settings = [line.split("=", 1)[1].split()[0] for line in out.stdout.splitlines()
                if line.strip().startswith("NLP_BENCH_NORM_LAUNCH=")]
    assert len(settings) == 4 and out.stdout.count("best layer_norm") == out.stdout.count("best rms_norm") == 2
    for text, width in zip(settings, (40, 40, 16, 16), strict=False):
        assert {bound for bound, _, _ in norm_settings.parse_launch_settings(text)} == {width}
    assert chosen.read_text() == f"{settings[0]},{settings[2]}\n"  # LayerNorm's, both widths
    tested = [line for line in out.stdout.splitlines() if line.endswith("x eager)")]
    # per norm at width 40: forward and split backward each 6 whole-row settings (1- and 2-row tiles, per tile
    # or 1 per SM, loaded ahead only when persistent) and 2 chunked; the fused backward only the 4 persistent
    # whole-row ones; at width 16 the same without the chunks (a chunk as wide as the row is none); then the
    # parameter-gradient kernel's 2 settings over the best split backward
    assert len(tested) == 2 * (8 + 4 + 8 + 2) + 2 * (6 + 4 + 6 + 2)
    assert sum("parameter tiles 2x16 warps 4 rows 4" in line for line in tested) == 4
