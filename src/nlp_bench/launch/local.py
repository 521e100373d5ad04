"""The local executor: run a jobscript on this machine as a one-node Slurm job would see it."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from nlp_bench.errors import LaunchError
from nlp_bench.launch import states
from nlp_bench.launch.executor import job_environment
from nlp_bench.launch.outcome import finish
from nlp_bench.workspace import JOB_ERR, JOB_OUT, JOBSCRIPT, OUTPUTS

#: The jobscript's last line; lets a later process learn the exit code of a job it did not start.
_EXIT_LINE = re.compile(r"^nlp-bench: training exited with code (\d+)", re.M)


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


class LocalExecutor:
    """Runs one point at a time on this machine; a chain runs as one process, script after script."""

    name = "local"
    queues = False
    holds_jobs = False

    def __init__(self) -> None:
        self._children: dict[str, subprocess.Popen] = {}

    def check_available(self) -> None:
        """bash is all it needs, and every machine that runs bench has it."""

    def submit(self, point_dir: Path, chain: Sequence[str] = (JOBSCRIPT,), after: Sequence[str] = ()) -> str:
        if after:
            raise LaunchError("the local executor runs points one after another and cannot hold a job until "
                              "others end; --after needs a batch scheduler (a Slurm system)")
        point_dir = Path(point_dir).resolve()
        *first, last = chain
        # every script but the last writes its own output files and stops the chain when it fails
        steps = "".join(f"bash ./{script} >{OUTPUTS[script][0]} 2>{OUTPUTS[script][1]} || exit $?; "
                        for script in first)
        env = job_environment({**os.environ, **slurm_environment(point_dir), "MASTER_PORT": str(_free_port())})
        with (point_dir / JOB_OUT).open("wb") as out, (point_dir / JOB_ERR).open("wb") as err:
            # `exec` keeps one process, so the job id (the shell's pid) is also the pid to watch and signal
            proc = subprocess.Popen(
                ["bash", "-c", f"export SLURM_JOB_ID=$$ SLURM_JOBID=$$; {steps}exec bash ./{last}"],
                cwd=point_dir, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        job_id = str(proc.pid)
        self._children[job_id] = proc
        states.record(point_dir, states.RUNNING, executor=self.name, job_id=job_id, chain_job_ids=[job_id] * len(chain),
                      submitted=states.now_iso(), started=states.now_iso())
        return job_id

    def poll(self, point_dir: Path) -> str:
        info = states.load(point_dir) or {}
        state = info.get("state", states.UNKNOWN)
        if state in states.TERMINAL:
            return state
        job_id = info["job_id"]
        proc = self._children.get(job_id)
        if proc is not None:
            code = proc.poll()
            if code is None:
                return states.RUNNING
            del self._children[job_id]
        else:
            if _alive(int(job_id)):
                return states.RUNNING
            code = _exit_code_from_log(Path(point_dir))
        if code is not None and code < 0:  # killed by a signal
            return finish(point_dir, states.CANCELLED, 128 - code)["state"]
        return finish(point_dir, states.COMPLETED if code == 0 else states.FAILED, code)["state"]

    def cancel(self, point_dir: Path) -> None:
        """SIGTERM to the whole job (torchrun passes it on to its ranks), SIGKILL to what outlives a grace
        period. The job's process tree is taken first: ranks may sit in sessions of their own."""
        info = states.load(point_dir) or {}
        if info.get("state") in states.TERMINAL or "job_id" not in info:
            return
        pid = int(info["job_id"])
        tree = _process_tree(pid)
        for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            for target in tree:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(target, sig)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                child = self._children.get(info["job_id"])
                if child is not None:
                    child.poll()  # reap the job's shell so it does not linger as a zombie
                tree = {p for p in tree | _process_tree(pid) if _alive(p)}
                if not tree:
                    break
                time.sleep(0.1)
            if not tree:
                break
        self._children.pop(info["job_id"], None)
        finish(point_dir, states.CANCELLED, None)


def _process_tree(root: int) -> set[int]:
    """root and all its descendants, plus every process of its session (read from /proc)."""
    parents: dict[int, int] = {}
    sessions: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid = int(stat.parent.name)
        parents[pid], sessions[pid] = int(fields[1]), int(fields[3])
    tree = {p for p, sid in sessions.items() if sid == root}
    if root in parents:
        tree.add(root)
    grew = True
    while grew:
        more = {p for p, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return tree


def _alive(pid: int, proc: subprocess.Popen | None = None) -> bool:
    if proc is not None:
        return proc.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.is_file() and stat.read_text().split(")")[-1].split()[0] == "Z")


def _exit_code_from_log(point_dir: Path) -> int | None:
    out = point_dir / JOB_OUT
    if not out.is_file():
        return None
    codes = _EXIT_LINE.findall(out.read_text(errors="replace"))
    return int(codes[-1]) if codes else None
