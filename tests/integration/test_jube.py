"""jube/nlp_benchmark.yaml run by the real JUBE: its tags select the same points `bench run` does, and its
result table carries Tokens/sec and time_to_report_in_seconds."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, shorten

pytestmark = [pytest.mark.jube,
              pytest.mark.skipif(shutil.which("jube") is None, reason="JUBE is not installed (apt-get install jube)")]

DEFINITION = ROOT / "jube" / "nlp_benchmark.yaml"


def _jube(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    # bench from this interpreter's environment, whichever checkout the tests run in
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["jube", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _table(proc: subprocess.CompletedProcess) -> list[dict[str, str]]:
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in proc.stdout.splitlines() if line.startswith("|") and not line.startswith("|--")]
    return [dict(zip(rows[0], row, strict=False)) for row in rows[1:]]


@pytest.mark.parametrize("tag,golden,nodes", [("175", "jobscript_175B.sbatch", "96"),
                                              ("13", "jobscript_13B.sbatch", "8")])
def test_tags_write_the_reference_jobscripts(tmp_path, tag, golden, nodes):
    proc = _jube("run", str(DEFINITION), "--tag", tag, "dry_run", "-o", str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    scripts = list((tmp_path / "run").glob("*/*_execute/work/results/nlp/*/*/jobscript.sbatch"))
    assert len(scripts) == 1, proc.stdout
    assert scripts[0].read_text() == (ROOT / "slurm" / golden).read_text()
    rows = _table(_jube("result", "-a", str(tmp_path / "run"), cwd=tmp_path))
    assert len(rows) == 1 and rows[0]["Nodes"] == nodes and rows[0]["state"] == "TO_SUBMIT", rows
    assert rows[0]["system"] == "juwels-booster"


def test_without_a_tag_jube_runs_the_default_175(tmp_path):
    proc = _jube("run", str(DEFINITION), "--tag", "dry_run", "-o", str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [p.name for p in (tmp_path / "run").glob("*/*_execute/work/results/nlp/*/*/")] == [
        "gpt-175b_n96_tp8_pp8_mbs1_gas16"]


@pytest.mark.slow
def test_smoke_through_jube_reports_tokens_and_time(tmp_path, site):
    """The definition in a copy of the site (it runs bench on the checkout it lies in), whose smoke tag trains
    10 iterations: the table's figures need a finished run, not 40 iterations."""
    shutil.copytree(ROOT / "jube", site / "jube")
    shorten(site, "smoke", 10)
    proc = _jube("run", str(site / DEFINITION.relative_to(ROOT)), "--tag", "smoke", "-o", str(tmp_path / "run"),
                 cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _table(_jube("result", "-a", str(tmp_path / "run"), cwd=tmp_path))
    assert len(rows) == 1, rows
    row = rows[0]
    assert row["state"] == "COMPLETED" and row["system"] == "local" and row["Iterations"] == "10"
    tokens, report = float(row["Tokens/sec"]), float(row["time_to_report_in_seconds"])
    assert tokens > 0 and report == pytest.approx(20_000_000 / tokens, rel=1e-3)
