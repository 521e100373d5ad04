"""The registry of executors: a system profile names one (`executor:`), and this picks its class. Nothing
above launch/ asks which scheduler it is; it asks the executor what it can do (Executor.queues,
Executor.holds_jobs)."""

from __future__ import annotations

from pathlib import Path

from nlp_bench.errors import LaunchError
from nlp_bench.launch import states
from nlp_bench.launch.executor import Executor
from nlp_bench.launch.local import LocalExecutor
from nlp_bench.launch.slurm import SlurmExecutor

REGISTRY: dict[str, type] = {cls.name: cls for cls in (LocalExecutor, SlurmExecutor)}


def get_executor(name: str) -> Executor:
    if name not in REGISTRY:
        raise LaunchError(f"unknown executor {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]()


def refresh(point_dir: Path) -> str | None:
    """Bring state.json up to date for a job some earlier process submitted (None if never submitted)."""
    info = states.load(point_dir)
    if info is None or "executor" not in info:
        return None
    if info.get("state") in states.TERMINAL:
        return info["state"]
    return get_executor(info["executor"]).poll(point_dir)
