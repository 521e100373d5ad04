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
from datetime import datetime, timezone
from pathlib import Path

from nlp_bench.errors import LaunchError
from nlp_bench.launch.executor import Cancelled, job_environment, open_attempt, register_executor
from nlp_bench.launch.job_end import finish
from nlp_bench.store import locks, protocol, states
from nlp_bench.store.names import JOB_ERR, JOB_OUT, JOB_PID, JOBSCRIPT, OUTPUTS, SUBMITTED
from nlp_bench.store.point_folder import PointDir, sha256
from nlp_bench.store.records import now_iso

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
    """What tells the job's process from any later process given the same id: the host, the boot, and the
    process's start time (in clock ticks since boot)."""
    fields = _stat(pid)
    return {"pid": pid, "start_ticks": int(fields[19]) if fields else None, "boot_id": _boot_id(),
            "host": socket.gethostname()}


def _same_process(process: dict[str, object]) -> bool | None:
    """Is the recorded job's process still alive as that process? True: it is; False: it ended (or its id
    now belongs to another process); None: this machine cannot tell (the job runs on another host, or its
    record lacks the start time that tells it from a process that reused its id)."""
    if process.get("host") and process["host"] != socket.gethostname():
        return None
    if process.get("boot_id") and _boot_id() and process["boot_id"] != _boot_id():
        return False
    fields = _stat(int(process["pid"]))
    if fields is None:
        return False if Path("/proc/self/stat").is_file() else None
    if process.get("start_ticks") is None:
        return None if fields[0] != "Z" else False
    return int(fields[19]) == process["start_ticks"] and fields[0] != "Z"


@contextlib.contextmanager
def _uninterrupted():
    """Ctrl-C and SIGTERM wait until the block ends: a job is never started without its id being recorded.
    Yields what a child started in the block must run first: a child inherits the blocked signals, and a job
    deaf to SIGTERM could not be stopped (its watchdog, a cancel)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield lambda: signal.pthread_sigmask(signal.SIG_SETMASK, old)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@register_executor
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

    def check_answers(self, system: str) -> None:
        """No scheduler to ask: this process runs the jobs."""

    def prefetch(self, job_ids: list[str]) -> None:
        """Nothing to ask ahead: a local job is looked at in /proc."""

    def submit(self, point_dir: Path, chain: Sequence[str] = (JOBSCRIPT,), after: Sequence[str] = ()) -> str:
        if after:
            raise LaunchError("the local executor runs points one after another and cannot hold a job until "
                              "others end; --after needs a batch scheduler (a Slurm system)")
        point = PointDir(Path(point_dir).resolve())
        scripts = point.freeze_scripts(tuple(chain))
        *first, last = chain
        # every script but the last writes its own output files and stops the chain when it fails; each runs
        # from submitted/, the copy hashed here, so editing the originals cannot change a running job. The
        # shell writes its pid first: a bench killed before it recorded the job can still be followed.
        steps = "".join(f"bash ./{SUBMITTED}/{script} >{OUTPUTS[script][0]} 2>{OUTPUTS[script][1]} || exit $?; "
                        for script in first)
        command = (f"echo $$ > {SUBMITTED}/{JOB_PID}; export SLURM_JOB_ID=$$ SLURM_JOBID=$$; "
                   f"{steps}exec bash ./{SUBMITTED}/{last}")
        env = job_environment({**os.environ, **slurm_environment(point.path), "MASTER_PORT": str(_free_port())})
        begun = point.begin_attempt(self.name, scripts_sha256={name: sha256(body) for name, body in scripts.items()})
        with _uninterrupted() as hearing:
            try:
                with (point.path / JOB_OUT).open("wb") as out, (point.path / JOB_ERR).open("wb") as err:
                    # `exec` keeps one process: the job id (the shell's pid) is also the pid to watch and signal
                    # and it inherits the locks held for it (the results folder's): they end with it, not with bench
                    proc = subprocess.Popen(["bash", "-c", command], cwd=point.path, env=env, stdout=out, stderr=err,
                                            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=hearing,
                                            pass_fds=locks.for_jobs())
            except OSError as exc:
                point.update(states.NOT_SUBMITTED, failure_detail=f"could not start bash: {exc.strerror}")
                raise LaunchError(f"cannot start the job of {point.path}: {exc.strerror}") from None
            job_id = str(proc.pid)
            self._children[job_id] = proc
            locks.passed_on(f"local job {job_id} in {point.path}")
            point.update(states.RUNNING, job_id=job_id, chain_job_ids=[job_id] * len(chain),
                         process=identity(proc.pid), started=begun.submitted, times_from="bench")
        return job_id

    def poll(self, point_dir: Path) -> str:
        point, attempt, recorded = open_attempt(point_dir)
        if attempt is None:
            return recorded
        if attempt.job_id is None:
            return self._unstarted(point)
        proc = self._children.get(attempt.job_id)
        if proc is not None:
            code = proc.poll()
            if code is None:
                return states.RUNNING
            del self._children[attempt.job_id]
            if code < 0:  # killed by a signal bench did not send (its own cancel records the end first)
                return finish(point_dir, states.FAILED, 128 - code, number=attempt.number).state
            return finish(point_dir, states.COMPLETED if code == 0 else states.FAILED, code,
                          number=attempt.number).state
        alive = _same_process(attempt.process or {"pid": int(attempt.job_id)})
        ended = protocol.exit_of(point.path / JOB_OUT)
        if alive or (alive is None and ended is None):
            return states.RUNNING
        if ended is None:
            return finish(point_dir, states.LOST, None, number=attempt.number).state
        return finish(point_dir, states.COMPLETED if ended.code == 0 else states.FAILED, ended.code,
                      number=attempt.number).state

    def _unstarted(self, point: PointDir) -> str:
        """An attempt without a job id: its bench is still starting the job (it holds the point's lock), or
        died before it recorded the id. Then the pid the job's shell wrote, if it names a live process in the
        point's folder, is the job; else the job never started (or has ended: its log says how)."""
        try:
            with point.locked():
                attempt = point.attempt()
                if attempt.job_id is not None:
                    return attempt.state
                pid = _written_pid(point)
                if pid is not None and _runs_in(pid, point.path):
                    point.update(states.RUNNING, number=attempt.number, job_id=str(pid), chain_job_ids=[str(pid)],
                                 process=identity(pid), times_from="bench")
                    return states.RUNNING
                ended = protocol.exit_of(point.path / JOB_OUT)
                if ended is not None:
                    return finish(point.path, states.COMPLETED if ended.code == 0 else states.FAILED, ended.code,
                                  number=attempt.number).state
                return finish(point.path, states.LOST, None, number=attempt.number).state
        except locks.Busy:
            return states.SUBMITTING

    def cancel(self, point_dir: Path) -> Cancelled:
        """SIGTERM to the whole job, SIGKILL to what outlives a grace period. The job's processes are its
        session's and their descendants, each known by its id and start time, and only while the job's own
        process is the one recorded: nothing is signalled that could be another process. Whether the job
        still runs is its own process's answer alone: a job that ended is recorded as its exit line says,
        never as cancelled, whatever it left behind in its session."""
        point = PointDir(point_dir)
        attempt = point.attempt()
        if attempt is None or attempt.state in states.SETTLED:
            return Cancelled(True, "nothing to cancel")
        if attempt.job_id is None:
            return Cancelled(False, "its job is being started right now; cancel again in a moment")
        pid = int(attempt.job_id)
        process = attempt.process or {"pid": pid}
        alive = _same_process(process)
        if alive is None:
            where = process.get("host")
            if where and where != socket.gethostname():
                return Cancelled(False, f"job {pid} runs on {where}: cancel it there")
            return Cancelled(False, f"job {pid} was recorded without its start time (by an older bench), so it "
                                    "cannot be told from a process that reused its id; stop it by hand")
        if alive is False:
            return self._ended(point_dir, pid, process)
        # recorded first: the bench that waits for this job may see it end before this cancel can say why
        point.update(number=attempt.number, cancel_requested=now_iso())
        tree = self._stop(pid, attempt.job_id)
        finish(point_dir, states.CANCELLED, None, number=attempt.number, finished=datetime.now(timezone.utc),
               times_from="bench")
        if tree:
            return Cancelled(False, f"processes {sorted(tree)} of job {pid} outlived SIGKILL")
        return Cancelled(True, f"job {pid} ended")

    def _ended(self, point_dir: Path, pid: int, process: dict[str, object]) -> Cancelled:
        """A job that ended on its own: its end recorded (from its exit line), and what it left in its session
        (a stray child of its shell) stopped, as long as its id is free or its own zombie in this boot: an id
        is not given again while its session lives, so the session's members are then the job's."""
        state = self.poll(point_dir)
        said = f"job {pid} had already ended ({state})"
        same_boot = process.get("boot_id") in (None, _boot_id())
        if not same_boot or _start_ticks(pid) not in (None, process.get("start_ticks")):
            return Cancelled(True, said)
        left = sorted(p for p, start in _process_tree(pid).items() if _alive(p, start))
        if not left:
            return Cancelled(True, said)
        outlived = self._stop(pid, str(pid))
        if outlived:
            return Cancelled(False, f"{said}; processes {sorted(outlived)} it left behind outlived SIGKILL")
        return Cancelled(True, f"{said}; stopped what it left running in its session (processes {left})")

    def _stop(self, pid: int, job_id: str) -> dict[int, int]:
        """SIGTERM, then SIGKILL after the grace period, to job `pid`'s session and descendants; those that
        outlived both."""
        tree = _process_tree(pid)
        for sig, grace in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, 5.0)):
            for target, start in tree.items():
                if _start_ticks(target) == start:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(target, sig)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                child = self._children.get(job_id)
                if child is not None:
                    child.poll()  # reap the job's shell so it does not linger as a zombie
                tree = {p: t for p, t in {**tree, **_process_tree(pid)}.items() if _alive(p, t)}
                if not tree:
                    break
                time.sleep(0.1)
            if not tree:
                break
        self._children.pop(job_id, None)
        return tree


def _written_pid(point: PointDir) -> int | None:
    try:
        return int((point.path / SUBMITTED / JOB_PID).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _runs_in(pid: int, folder: Path) -> bool:
    """Is process `pid` alive with `folder` as its working directory (a job's shell starts in its point)?"""
    fields = _stat(pid)
    try:
        return fields is not None and fields[0] != "Z" and Path(os.readlink(f"/proc/{pid}/cwd")) == folder.resolve()
    except OSError:
        return False


def _start_ticks(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def _process_tree(root: int) -> dict[int, int]:
    """The job's session and every descendant of it (ranks may start sessions of their own), each with its
    start time. A session id cannot be given to a new process while any member of the old session lives,
    so the members found are the job's."""
    parents: dict[int, int] = {}
    starts: dict[int, int] = {}
    tree = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        pid = int(stat.parent.name)
        fields = _stat(pid)
        if fields is None:
            continue
        parents[pid], starts[pid] = int(fields[1]), int(fields[19])
        if int(fields[3]) == root:
            tree.add(pid)
    grew = True
    while grew:
        more = {p for p, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return {pid: starts[pid] for pid in tree}


def _alive(pid: int, start: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z" and int(fields[19]) == start
