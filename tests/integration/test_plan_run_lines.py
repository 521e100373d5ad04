"""A row of `bench plan`, as a user copies it off an 80-column terminal into a shell: the printed `bench run`
line (continued over lines where it is long) runs, and its point is predicted exactly as the row (issue 53,
finding 1)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

#: the `bench` of the interpreter running the tests
BIN = Path(sys.executable).parent


def _bench(*args: str, cwd: Path, columns: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("NLP_BENCH_RESULTS", "COLUMNS")}
    if columns:
        env["COLUMNS"] = columns
    return subprocess.run([str(BIN / "bench"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_a_rows_line_copied_into_a_shell_makes_the_rows_point(tmp_path):
    plan = _bench("plan", "--tag", "13", "--system", "juwels-booster", "--nodes", "16", "--gas", "64",
                  "--recompute", "full", "--top", "2", cwd=tmp_path, columns="60")
    assert plan.returncode == 0, plan.stderr
    assert max(map(len, plan.stdout.splitlines())) <= 60
    block = re.search(r"^ *#1  (bench run .*?[^\\])$", plan.stdout, re.M | re.S).group(1)
    assert "\\\n" in block  # too long for 60 columns: continued as a shell reads it
    shell = subprocess.run(["bash", "-c", block + " --dry-run"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300, env={**{k: v for k, v in os.environ.items() if k != "NLP_BENCH_RESULTS"},
                                             "PATH": f"{BIN}:{os.environ['PATH']}"})
    assert shell.returncode == 0, shell.stderr
    (predicted,) = (json.loads(p.read_text()) for p in tmp_path.glob("results/nlp/*/*/prediction.json"))
    row = next(line for line in plan.stdout.splitlines() if re.match(r" *1  ", line))  # the table's row 1
    for figure in (f"{predicted['memory_gib']:.1f}", f"{predicted['tokens_per_s']:,.0f}",
                   f"{predicted['tokens_per_s_low']:,.0f}-{predicted['tokens_per_s_high']:,.0f}"):
        assert figure in row, (figure, row)
