"""A submission to a Slurm whose controller does not answer (down, or hung) is refused in one line naming
the system, before a run is written or any point is marked SUBMITTING: sbatch to such a controller waits, and
the point would stay undecided for minutes. Slurm's commands here are stand-ins on PATH that answer as a
machine whose controller is down does."""

import os
import stat
import time

import pytest

from nlp_bench.launch import slurm
from nlp_bench.store import states
from nlp_bench.store.point_folder import PointDir

#: what Slurm's clients say where the controller does not answer
NO_CONTROLLER = "echo \"$(basename $0): error: Unable to contact slurm controller (connect failure)\" >&2; exit 1\n"


@pytest.fixture
def no_controller(tmp_path, monkeypatch):
    """Slurm's commands on PATH, the controller down; returns the file sbatch leaves where it was called."""
    tools = tmp_path / "bin"
    tools.mkdir()
    called = tmp_path / "sbatch-called"
    scripts = {"scontrol": "echo 'Slurmctld(primary) at ctl-host is DOWN'; exit 1\n",
               "sbatch": f"touch {called}\n{NO_CONTROLLER}",
               **{tool: NO_CONTROLLER for tool in ("squeue", "sacct", "scancel", "srun")}}
    for name, body in scripts.items():
        (tools / name).write_text("#!/bin/sh\n" + body)
        (tools / name).chmod((tools / name).stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(slurm, "RECONCILE_S", 1.0)  # bounds the wait of a submission whose answer was lost
    monkeypatch.setattr(slurm, "SETTLE_S", 0.5)
    return called


def _refused(out, *needles: str) -> str:
    lines = [line for line in out.output.strip().splitlines() if line.startswith("bench: ")]
    assert out.exit_code == 2 and len(lines) == 1 and lines[0].startswith("bench: error: "), out.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_a_new_run_on_a_silent_controller_is_refused_before_anything_is_written(bench, results, no_controller):
    began = time.monotonic()
    out = bench("run", "--tag", "smoke", "--system", "local-slurm")
    _refused(out, "system local-slurm: Slurm did not answer", "ctl-host is DOWN", "nothing was queued",
             "bench doctor --system local-slurm")
    assert time.monotonic() - began < 25  # a DOWN answer is at once; the bound leaves room for a busy machine
    assert not no_controller.exists() and not list(results.rglob("run.json")), "nothing submitted, nothing written"


def test_a_resume_on_a_silent_controller_marks_no_point(bench, results, no_controller):
    grid = results.parent / "g.yaml"
    grid.write_text("tag: smoke\nsystem: local-slurm\nmatrix: {gas: [1, 2]}\n")
    assert bench("sweep", str(grid), "--dry-run").exit_code == 0
    run = next(results.glob("nlp/*/run.json")).parent
    _refused(bench("sweep", "--resume", run.name), "system local-slurm: Slurm did not answer", "ctl-host is DOWN")
    folders = [p.parent for p in run.glob("*/point.json")]
    assert len(folders) == 2 and not no_controller.exists()
    assert all(PointDir(f).attempt() is None and PointDir(f).state().state == states.NOT_SUBMITTED for f in folders)


def test_a_hung_controller_is_refused_once_the_ping_times_out(bench, results, no_controller, monkeypatch):
    (no_controller.parent / "bin" / "scontrol").write_text("#!/bin/sh\nexec sleep 30\n")
    monkeypatch.setattr(slurm, "PING_TIMEOUT_S", 1.0, raising=False)
    began = time.monotonic()
    _refused(bench("run", "--tag", "smoke", "--system", "local-slurm"), "system local-slurm: Slurm did not answer",
             "scontrol did not answer within 1 s")
    # the stand-in scontrol sleeps 30 s: refused at the 1-s ping bound, not after it answers
    assert time.monotonic() - began < 25 and not list(results.rglob("run.json"))
