"""A Slurm whose controller does not answer, for real: the emulated cluster's slurmctld paused (SIGSTOP). A
submission is refused in one line naming the system within the ping's bound (10 s by default, Slurm's own
MessageTimeout; 3 s here), before any point is marked SUBMITTING, and the points run once the controller
answers again. Jobs run the stand-in jobscript of tests/conftest.py."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from conftest import ROOT, dry_points, job, one_line, run_bench

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]


@pytest.mark.slurm
def test_a_submission_to_a_silent_controller_is_refused_in_one_line_within_seconds(on_slurm, tmp_path, monkeypatch):
    monkeypatch.setenv("NLP_BENCH_SLURM_PING_TIMEOUT", "3")
    run, points = dry_points(tmp_path, [1, 2], system="local-slurm")
    with on_slurm.controller_paused():
        began = time.monotonic()
        proc = run_bench("sweep", "--resume", run.name, cwd=tmp_path, timeout=60)
        took = time.monotonic() - began
    one_line(proc, "system local-slurm: Slurm did not answer", "nothing was queued")
    # within the ping's 3 s plus bench's start, with room for a busy machine; unchecked, it waited 60 s and more
    assert took < 30, f"refused after {took:.0f} s"
    assert all(job(folder) is None for folder in points), "no point marked SUBMITTING, nor any attempt begun"
    again = run_bench("sweep", "--resume", run.name, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert all(len(on_slurm.jobs_in(folder)) == 1 for folder in points), "each point queued once it answers"


@pytest.mark.slurm
def test_the_emulated_cluster_starts_and_answers_with_its_documented_command(slurm_cluster):
    """`sudo python3 slurm/local_cluster.py start` (docs/running.md), here on the cluster the tests started:
    it finds it running and says so; `status` shows the controller up and both nodes."""
    script = ROOT / "slurm" / "local_cluster.py"
    started = subprocess.run([sys.executable, str(script), "start"], capture_output=True, text=True, timeout=90)
    assert started.returncode == 0 and "local Slurm cluster up: partition debug, nodes node1, node2" in started.stdout, \
        started.stdout + started.stderr
    status = subprocess.run([sys.executable, str(script), "status"], capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and "is UP" in status.stdout, status.stdout + status.stderr
    assert {"node1", "node2"} <= {line.split()[0] for line in status.stdout.splitlines()[1:]}, status.stdout
