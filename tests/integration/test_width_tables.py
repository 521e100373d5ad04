"""The figures kept at 80 columns, by the real bench: `bench result table --all` keeps Tokens/sec,
time_to_report and the state (and the columns --filter and --sort name) where it used to keep layout
columns alike on every row and 30-character run ids; and the progress line of a local job keeps its bar,
its count and its elapsed time at 80 columns written to a file. Result folders are made by dry runs whose
logs are then written (tests/measured_runs.py); the job is the stand-in jobscript, no training."""

from __future__ import annotations

import csv
import io
import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import BENCH, STUB, record_job, run_bench
from measured_runs import fake_sweep

from nlp_bench.store import states

pytestmark = pytest.mark.timeout(120)


def _data_lines(text: str) -> list[str]:
    """The rows of a pretty table: the lines after its header rule, to the first blank one."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if set(line.strip()) == {"─"}) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


def _two_runs(bench, results: Path, tmp_path: Path) -> None:
    """Two runs of the same eight 13B points (the first's run ids, model and batch alike on every row), one
    point of the second failed after its intervals."""
    fake_sweep(bench, results, tmp_path)
    fake_sweep(bench, results, tmp_path)
    newest = sorted((results / "nlp").iterdir())[-1]
    failed = sorted(newest.glob("gpt-13b_n16_*"))[0]
    record_job(failed, states.FAILED, failure_class="python_exception", failure_detail="ValueError: x")


@pytest.mark.parametrize("named", [(), ("--filter", "Iterations >= 1", "--sort", "-Avg_TFLOPs/GPU")],
                         ids=["all", "filtered-sorted"])
def test_at_80_columns_the_table_keeps_the_figures_and_the_state(bench, results, tmp_path, monkeypatch, named):
    _two_runs(bench, results, tmp_path)
    expected = list(csv.DictReader(io.StringIO(bench("result", "table", "--all", *named, "--format", "csv").output)))
    assert len(expected) == 16 and {r["state"] for r in expected} == {states.COMPLETED, states.FAILED}
    monkeypatch.setenv("COLUMNS", "80")
    out = run_bench("result", "table", "--all", *named, cwd=tmp_path, timeout=60)
    assert out.returncode == 0, out.stderr
    assert max(len(line) for line in out.stdout.splitlines()) <= 80, out.stdout
    lines = _data_lines(out.stdout)
    assert len(lines) == len(expected), out.stdout
    columns = ["Tokens/sec", "time_to_report_in_seconds", *(["Iterations", "Avg_TFLOPs/GPU"] if named else [])]
    for line, row in zip(lines, expected, strict=True):
        cells = line.split()
        assert row["state"] in cells, (line, row)
        for column in columns:
            assert f"{float(row[column]):.{0 if column == 'Iterations' else 2}f}" in cells, (column, line, row)
    said = " ".join(out.stdout.split("─")[0].split())
    assert said.startswith("same on every row:") and "Model_Size=" in said, out.stdout


def test_the_progress_line_of_a_local_job_keeps_bar_count_and_time_at_80_columns_in_a_file(tmp_path, stub_site):
    """The stand-in job logs iterations 4, 8 and 12 of 40; bench's stderr goes to a file, COLUMNS=80: the
    line kept `… 631 tokens/s (JUBE: every interval so far), loss 10…` and lost the bar, 12/40 and the time."""
    template = stub_site / "slurm" / "templates" / "jobscript.sbatch.j2"
    text = STUB.read_text()
    line = next(x for x in text.splitlines() if "iteration        1/       1" in x)
    lines = [line.replace("iteration        1/       1", f"iteration {i:8d}/      40") for i in (4, 8, 12)]
    template.write_text(text.replace(line, "\n".join(lines)))
    err = tmp_path / "stderr.txt"
    env = {**{k: v for k, v in os.environ.items() if k != "NLP_BENCH_RESULTS"}, "COLUMNS": "80"}
    with err.open("w") as fh:
        proc = subprocess.run([str(BENCH), "run", "--tag", "smoke"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=fh, text=True, timeout=90)
    said = err.read_text()
    assert proc.returncode == 0, proc.stdout + said
    assert max(len(x) for x in said.splitlines()) <= 80, said
    (bar,) = [x for x in said.splitlines() if "/40" in x]
    assert "━" in bar and "12/40" in bar and re.search(r"\b0:00:\d\d\b", bar) and "tokens/s" in bar, bar
