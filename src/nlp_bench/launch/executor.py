"""The executor interface (submit / poll / cancel / wait) and the registry that picks one per system."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

from nlp_bench.errors import LaunchError
from nlp_bench.launch import failures, states
from nlp_bench.sweep.workspace import JOB_ERR, JOB_OUT


class Executor(Protocol):
    """Runs a point's jobscript somewhere and reports its state in the common vocabulary.

    Every method takes the point folder, whose state.json carries the job id, so any process (a later
    `bench status`, a resumed run) can pick up a job another process submitted.
    """

    name: str

    def submit(self, point_dir: Path) -> str: ...

    def poll(self, point_dir: Path) -> str: ...

    def cancel(self, point_dir: Path) -> None: ...


def wait(executor: Executor, point_dir: Path, interval_s: float = 1.0, on_poll=None) -> str:
    """Poll until the job reaches a terminal state; on_poll(state) runs after every poll."""
    while True:
        state = executor.poll(point_dir)
        if on_poll is not None:
            on_poll(state)
        if state in states.TERMINAL:
            return state
        time.sleep(interval_s)


def output_text(point_dir: Path, tail_bytes: int = 200_000) -> str:
    """The end of job.out and job.err, which is where failures show."""
    parts = []
    for name in (JOB_OUT, JOB_ERR):
        path = Path(point_dir) / name
        if path.is_file():
            with path.open("rb") as fh:
                fh.seek(max(0, path.stat().st_size - tail_bytes))
                parts.append(fh.read().decode("utf-8", "replace"))
    return "\n".join(parts)


def finish(point_dir: Path, state: str, exit_code: int | None) -> dict:
    """Record a terminal state with its failure class."""
    failure, detail = failures.classify(state, exit_code, output_text(point_dir))
    if failure is not None and state == states.COMPLETED:
        state = states.FAILED
    return states.record(point_dir, state, exit_code=exit_code, failure_class=failure, failure_detail=detail,
                         finished=states.now_iso())


def refresh(point_dir: Path) -> str | None:
    """Bring state.json up to date for a job some earlier process submitted (None if never submitted)."""
    info = states.load(point_dir)
    if info is None or "executor" not in info:
        return None
    if info.get("state") in states.TERMINAL:
        return info["state"]
    return get_executor(info["executor"]).poll(point_dir)


def get_executor(name: str) -> Executor:
    if name == "local":
        from nlp_bench.launch.local import LocalExecutor

        return LocalExecutor()
    if name == "slurm":
        from nlp_bench.launch.slurm import SlurmExecutor

        return SlurmExecutor()
    raise LaunchError(f"unknown executor {name!r}; known: local, slurm")
