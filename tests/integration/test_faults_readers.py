"""Readers of sites that cannot be written or asked: a results folder mounted read-only (a colleague reads a
shared folder) whose job ended after its bench died, and a Slurm whose authentication (munge) is down. What
must hold: every view shows the state a writer would record and says it was not kept; a Slurm that does not
authenticate is said, in one line, to be an outage, never shown as news nor taken for a refusal.

Jobs run the stand-in jobscript of tests/conftest.py (a gate file the test opens).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess

import pytest
from conftest import csv_rows, dry_points, job, one_line, run_bench, slurm_job_started, start, started, tmpfs, until

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]


def test_a_read_only_store_shows_the_end_a_writer_would_record(tmp_path, stub_site, gate):
    """bench is killed while its local job runs; the job then ends, and the folder is remounted read-only
    before anyone records it. status, the table and a submission bundle all show COMPLETED, and say the state
    was not kept."""
    with tmpfs(tmp_path / "ro", "8m") as mounted:
        results = mounted / "results"
        proc = start("--results-dir", str(results), "run", "--tag", "smoke", cwd=tmp_path)
        until(lambda: any(started(p.parent) for p in results.glob("nlp/*/*/point.json")), "the job to start")
        folder = next(p.parent for p in results.glob("nlp/*/*/ran.pids"))
        until(lambda: job(folder).state == "RUNNING", "the job to be recorded RUNNING")
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        gate.touch()
        until(lambda: "training exited with code 0" in (folder / "job.out").read_text(), "the job to end")
        remount = subprocess.run(["mount", "-o", "remount,ro", str(mounted)], capture_output=True, text=True)
        assert remount.returncode == 0, remount.stderr
        status = run_bench("--results-dir", str(results), "status", cwd=tmp_path, timeout=60)
        table = run_bench("--results-dir", str(results), "result", "table", "--format", "csv", cwd=tmp_path,
                          timeout=60)
        bundle = run_bench("--results-dir", str(results), "result", "export", "--format", "submission", "-o",
                           str(tmp_path / "bundle"), cwd=tmp_path, timeout=60)
        assert job(folder).state == "RUNNING", "nothing was written"
    said = "Read-only file system (the state COMPLETED is shown, not kept)"
    assert status.returncode == 0 and "COMPLETED" in status.stdout and "RUNNING" not in status.stdout, \
        status.stdout + status.stderr
    assert said in status.stderr, status.stderr
    assert table.returncode == 0 and csv_rows(table.stdout)[0]["state"] == "COMPLETED", table.stdout + table.stderr
    assert said in table.stderr, table.stderr
    assert bundle.returncode == 0 and said in bundle.stderr, bundle.stdout + bundle.stderr
    kept = json.loads((tmp_path / "bundle" / "points" / folder.name / "state.json").read_text())
    assert kept["state"] == "COMPLETED" and csv_rows((tmp_path / "bundle" / "results.csv").read_text())[0]["state"] \
        == "COMPLETED", "the bundle's records and its table agree"


#: how munge's own words begin, and what bench says of them
MUNGE_SAID = "authentication failed (Munge encode failed"


def _lines(err: str) -> list[str]:
    """stderr's lines, none of them one a Slurm command wrote (`scancel: error: ...`) run onto a line of its own."""
    lines = err.strip().splitlines()
    assert not any(re.match(r"(s[a-z]+|slurm_\w+):? error: ", line) for line in lines), err
    return lines


@pytest.mark.slurm
def test_slurm_that_cannot_authenticate_is_said_in_one_line(on_slurm, tmp_path, monkeypatch):
    """munged stopped while a job runs: status shows the state as last recorded and says, in one line, that
    Slurm did not answer and why; cancel is not confirmed, in one line."""
    monkeypatch.setenv("NLP_BENCH_SLURM_TIMEOUT", "15")  # munge's own retries take Slurm's clients 2-4 s
    proc = run_bench("run", "--tag", "smoke", "--system", "local-slurm", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    folder = slurm_job_started(tmp_path)
    until(lambda: "RUNNING" in run_bench("status", cwd=tmp_path).stdout, "the job to show RUNNING")
    with on_slurm.munge_stopped():
        status = run_bench("status", cwd=tmp_path, timeout=60)
        cancel = run_bench("cancel", folder.parent.name, cwd=tmp_path, timeout=60)
    assert status.returncode == 0 and "RUNNING" in status.stdout, status.stdout + status.stderr
    said = [line for line in _lines(status.stderr) if "did not answer" in line]
    assert len(said) == 1 and MUNGE_SAID in said[0], status.stderr
    assert cancel.returncode == 1, cancel.stdout + cancel.stderr
    (line,) = _lines(cancel.stderr)
    assert "cancel NOT confirmed" in line and MUNGE_SAID in line, line
    assert job(folder).state == "RUNNING"


@pytest.mark.slurm
def test_a_submission_slurm_cannot_authenticate_is_an_outage_not_a_refusal(on_slurm, tmp_path):
    run, (folder,) = dry_points(tmp_path, system="local-slurm")
    with on_slurm.munge_stopped():
        proc = run_bench("run", "--resume", run.name, cwd=tmp_path, timeout=60)
    line = one_line(proc, "Slurm did not answer", MUNGE_SAID, "nothing was queued")
    assert "refused" not in line, line
    assert job(folder) is None and not on_slurm.jobs_in(folder), "nothing marked, nothing queued"
