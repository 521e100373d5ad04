"""The local executor: run a jobscript on this machine as a one-node Slurm job would see it.

A job is known by its process id together with the process's start time and the boot it started in, so
that a later bench (or `bench cancel`) never mistakes, nor signals, an unrelated process that was given the
same process id after the job ended.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from nlp_bench.errors import LaunchError
from nlp_bench.launch.executor import Cancelled, job_environment, open_attempt, settled_state
from nlp_bench.launch.outcome import finish
from nlp_bench.store import locks, protocol, states
from nlp_bench.store.names import JOB_ERR, JOB_OUT, JOBSCRIPT, OUTPUTS, SUBMITTED
from nlp_bench.store.point_folder import PointDir, sha256

#: seconds a cancelled job gets to stop after SIGTERM (torchrun passes it on to its ranks), then SIGKILL
TERM_GRACE_S = 15.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slurm_environment(point_dir: Path) -> dict[str, str]:
    """The variables of a one-task, one-node allocation on this host (SLURM_JOB_ID is set by the shell)."""
    host = socket.gethostname().split(".")[0]
    return {
        "SLURM_JOB_NAME": point_dir.name, "SLURM_JOB_NODELIST": host, "SLURM_NODELIST": host,
        "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0", "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0", "SLURM_NTASKS": "1", "SLURM_CPUS_ON_NODE": str(os.cpu_count() or 1),
        "SLURM_SUBMIT_DIR": str(point_dir), "SLURM_JOB_PARTITION": "local", "SLURM_CLUSTER_NAME": "local",
    }


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (state is [0], start time [19]), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def identity(pid: int) -> dict[str, object]:
    fields = _stat(pid)
    return {"pid": pid, "start_ticks": int(fields[19]) if fields else None, "boot_id": _boot_id()}


def _same_process(process: dict[str, object]) -> bool | None:
    """Is the recorded job's process still this machine's process of that id? True: it is (alive or a
    zombie); False: it ended (or the id now belongs to another process); None: the machine cannot tell."""
    if process.get("boot_id") and _boot_id() and process["boot_id"] != _boot_id():
        return False
    fields = _stat(int(process["pid"]))
    if fields is None:
        return False if Path("/proc/self/stat").is_file() else None
    if process.get("start_ticks") is not None and int(fields[19]) != process["start_ticks"]:
        return False
    return fields[0] != "Z"


class LocalExecutor:
    """Runs one point at a time on this machine; a chain runs as one process, script after script."""

    name = "local"
    queues = False
    holds_jobs = False
    silence = None

    def __init__(self) -> None:
        self._children: dict[str, subprocess.Popen] = {}

    def check_available(self) -> None:
        """bash is all it needs, and every machine that runs bench has it."""

    def submit(self, point_dir: Path, chain: Sequence[str] = (JOBSCRIPT,), after: Sequence[str] = ()) -> str:
        if after:
            raise LaunchError("the local executor runs points one after another and cannot hold a job until "
                              "others end; --after needs a batch scheduler (a Slurm system)")
        point = PointDir(Path(point_dir).resolve())
        scripts = point.freeze_scripts(tuple(chain))
        *first, last = chain
        # every script but the last writes its own output files and stops the chain when it fails; each runs
        # from submitted/, the copy hashed here, so editing the originals cannot change a running job
        steps = "".join(f"bash ./{SUBMITTED}/{script} >{OUTPUTS[script][0]} 2>{OUTPUTS[script][1]} || exit $?; "
                        for script in first)
        env = job_environment({**os.environ, **slurm_environment(point.path), "MASTER_PORT": str(_free_port())})
        point.begin_attempt(self.name, scripts_sha256={name: sha256(body) for name, body in scripts.items()})
        try:
            with (point.path / JOB_OUT).open("wb") as out, (point.path / JOB_ERR).open("wb") as err:
                # `exec` keeps one process, so the job id (the shell's pid) is also the pid to watch and signal
                proc = subprocess.Popen(
                    ["bash", "-c", f"export SLURM_JOB_ID=$$ SLURM_JOBID=$$; {steps}exec bash ./{SUBMITTED}/{last}"],
                    cwd=point.path, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
        except OSError as exc:
            point.update(states.NOT_SUBMITTED, failure_detail=f"could not start bash: {exc.strerror}")
            raise LaunchError(f"cannot start the job of {point.path}: {exc.strerror}") from None
        job_id = str(proc.pid)
        self._children[job_id] = proc
        point.update(states.RUNNING, job_id=job_id, chain_job_ids=[job_id] * len(chain),
                     process=identity(proc.pid), started=point.attempt().submitted, times_from="bench")
        return job_id

    def poll(self, point_dir: Path) -> str:
        point, attempt = open_attempt(point_dir)
        if attempt is None:
            return settled_state(point)
        if attempt.job_id is None:
            return self._unstarted(point)
        proc = self._children.get(attempt.job_id)
        if proc is not None:
            code = proc.poll()
            if code is None:
                return states.RUNNING
            del self._children[attempt.job_id]
            if code < 0:  # killed by a signal
                return finish(point_dir, states.CANCELLED, 128 - code).state
            return finish(point_dir, states.COMPLETED if code == 0 else states.FAILED, code).state
        alive = _same_process(attempt.process or {"pid": int(attempt.job_id)})
        if alive or alive is None:
            return states.RUNNING
        ended = protocol.exit_of(point.path / JOB_OUT)
        if ended is None:
            return finish(point_dir, states.LOST, None).state
        return finish(point_dir, states.COMPLETED if ended.code == 0 else states.FAILED, ended.code).state

    def _unstarted(self, point: PointDir) -> str:
        """An attempt without a job id: its bench is still starting the job (it holds the point's lock), or
        died before it could record one; then no job of it can be followed, and the point may run again."""
        try:
            with point.locked():
                if point.attempt().job_id is None:
                    return finish(point.path, states.LOST, None).state
                return point.attempt().state
        except locks.Busy:
            return states.SUBMITTING

    def cancel(self, point_dir: Path) -> Cancelled:
        """SIGTERM to the whole job, SIGKILL to what outlives a grace period. The job's processes are its
        session's and their descendants, taken only while its process is the one recorded."""
        point = PointDir(point_dir)
        attempt = point.attempt()
        if attempt is None or attempt.state in states.TERMINAL or attempt.job_id is None:
            return Cancelled(True, "nothing to cancel")
        pid = int(attempt.job_id)
        if _same_process(attempt.process or {"pid": pid}) is False and (_stat(pid) is not None or not _session(pid)):
            # ended on its own; where the id now names another process, the job's session is gone too (an id
            # is not reused while its session lives), so nothing is signalled
            self.poll(point_dir)
            return Cancelled(True, f"job {pid} had already ended ({point.attempt().state})")
        tree = _process_tree(pid)
        for sig, grace in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, 5.0)):
            for target in tree:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(target, sig)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                child = self._children.get(attempt.job_id)
                if child is not None:
                    child.poll()  # reap the job's shell so it does not linger as a zombie
                tree = {p for p in tree | _process_tree(pid) if _alive(p)}
                if not tree:
                    break
                time.sleep(0.1)
            if not tree:
                break
        self._children.pop(attempt.job_id, None)
        finish(point_dir, states.CANCELLED, None)
        if tree:
            return Cancelled(False, f"processes {sorted(tree)} of job {pid} outlived SIGKILL")
        return Cancelled(True, f"job {pid} ended")


def _session(sid: int) -> set[int]:
    """The processes of session `sid` (the job's shell started it: start_new_session)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat(int(stat.parent.name))
        if fields and int(fields[3]) == sid:
            found.add(int(stat.parent.name))
    return found


def _process_tree(root: int) -> set[int]:
    """The job's session and every descendant of it (ranks may start sessions of their own). A session id
    cannot be given to a new process while any member of the old session lives, so the members found are
    the job's."""
    parents: dict[int, int] = {}
    tree = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        pid = int(stat.parent.name)
        fields = _stat(pid)
        if fields is None:
            continue
        parents[pid] = int(fields[1])
        if int(fields[3]) == root:
            tree.add(pid)
    grew = True
    while grew:
        more = {p for p, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return tree


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"
