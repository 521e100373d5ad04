"""Readers of sites that cannot be written or asked: a results folder mounted read-only (a colleague reads a
shared folder) whose job ended after its bench died, and a Slurm whose authentication (munge) is down. What
must hold: every view shows the state a writer would record and says it was not kept; a Slurm that does not
authenticate is said, in one line, to be an outage, never shown as news nor taken for a refusal.

Jobs run the stand-in jobscript of test_faults.py (a gate file the test opens).
"""

from __future__ import annotations

import signal
import subprocess

import pytest
from conftest import job, run_bench
from integration import test_faults
from integration.test_faults import csv_rows, start, started, tmpfs, until

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]

gate = test_faults.gate
stub_site = test_faults.stub_site


def test_a_read_only_store_shows_the_end_a_writer_would_record(tmp_path, stub_site, gate):
    """bench is killed while its local job runs; the job then ends, and the folder is remounted read-only
    before anyone records it. status and the table both show COMPLETED, and say the state was not kept."""
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
        assert job(folder).state == "RUNNING", "nothing was written"
    said = "Read-only file system (the state COMPLETED is shown, not kept)"
    assert status.returncode == 0 and "COMPLETED" in status.stdout and "RUNNING" not in status.stdout, \
        status.stdout + status.stderr
    assert said in status.stderr, status.stderr
    assert table.returncode == 0 and csv_rows(table.stdout)[0]["state"] == "COMPLETED", table.stdout + table.stderr
    assert said in table.stderr, table.stderr
