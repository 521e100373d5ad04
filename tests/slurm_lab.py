"""The emulated Slurm cluster of slurm/local_cluster.py, as the tests marked `slurm` use it: started and stopped
by the `slurm_cluster` fixture, and the faults the failure tests inject into it (a node whose slurmd dies, a
controller that hangs, accounting or munge that stop).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path


def _cluster():
    """slurm/local_cluster.py, a script of the site layer rather than a module of a package."""
    path = Path(__file__).resolve().parents[1] / "slurm" / "local_cluster.py"
    spec = importlib.util.spec_from_file_location("local_cluster", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


_lab = _cluster()
RUN, NODES, PARTITION = _lab.RUN, _lab.NODES, _lab.PARTITION
unavailable, accounting, start, stop, start_slurmd = _lab.unavailable, _lab.accounting, _lab.start, _lab.stop, \
    _lab.start_slurmd
_sh, _wait, _alive, _start_munge = _lab._sh, _lab._wait, _lab._alive, _lab._start_munge


def kill_slurmd(node: str) -> None:
    """What a crashed node looks like to the controller: its slurmd is gone (the job's steps are not)."""
    pidfile = RUN / f"slurmd-{node}.pid"
    os.kill(int(pidfile.read_text()), signal.SIGKILL)
    pidfile.unlink(missing_ok=True)


def controller_pid() -> int:
    return int((RUN / "slurmctld.pid").read_text())


@contextlib.contextmanager
def controller_paused() -> Iterator[int]:
    """slurmctld stopped (SIGSTOP) for the block: a controller that hangs, or is too busy to answer; every
    client's request waits for it, and is served once it goes on (SIGCONT)."""
    pid = controller_pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        os.kill(pid, signal.SIGCONT)


@contextlib.contextmanager
def accounting_stopped() -> Iterator[None]:
    """slurmdbd stopped for the block, as on a site whose accounting database is down: sacct fails."""
    pidfile = RUN / "slurmdbd.pid"
    if not accounting() or not _alive(pidfile):
        yield
        return
    pid = int(pidfile.read_text())
    os.kill(pid, signal.SIGTERM)
    _wait(lambda: not _alive(pidfile) or not Path(f"/proc/{pid}").exists(), "slurmdbd to stop")
    try:
        yield
    finally:
        pidfile.unlink(missing_ok=True)
        _sh("slurmdbd")
        _wait(lambda: _sh("sacct", "-n", "-X", "-j", "1", check=False).returncode == 0, "slurmdbd to answer")


@contextlib.contextmanager
def munge_stopped() -> Iterator[None]:
    """munged stopped for the block, as on a machine whose authentication service died: every Slurm command
    fails to make a credential (`Munge encode failed ... Protocol authentication error`). Started again after
    it, and waited for until the controller answers and every node is usable again (a node the controller
    could not reach meanwhile may have been set down)."""
    pidfile = Path("/run/munge/munged.pid")
    pid = int(pidfile.read_text())
    os.kill(pid, signal.SIGTERM)
    _wait(lambda: not Path(f"/proc/{pid}").exists(), "munged to stop")
    try:
        yield
    finally:
        _start_munge()
        _wait(lambda: _sh("scontrol", "ping", check=False).returncode == 0, "slurmctld")
        for node in NODES:
            start_slurmd(node)


def jobs_in(folder: Path) -> list[tuple[str, str]]:
    """(job id, state) of every job the controller knows whose working directory lies in `folder`."""
    out = _sh("squeue", "-h", "-t", "all", "-o", "%i|%T|%Z", check=False).stdout
    root = str(Path(folder).resolve())
    found = []
    for line in out.splitlines():
        job_id, state, workdir = line.split("|", 2)
        if workdir == root or workdir.startswith(root + "/"):
            found.append((job_id, state))
    return found
