"""Bringing the recorded states of many points up to date with their schedulers."""

from __future__ import annotations

import contextlib
from pathlib import Path

from nlp_bench.errors import BenchError
from nlp_bench.launch.executor import Executor, get_executor
from nlp_bench.store import states
from nlp_bench.store.point_folder import PointDir


class Refresher:
    """Brings state.json up to date for jobs earlier processes submitted, one executor of each kind for
    the whole view, so that a scheduler that did not answer is asked once, not once per point, and the
    view can say so (`silences`)."""

    def __init__(self, *known: Executor) -> None:
        """`known`: executors already at work in this process (the local one holds its jobs' handles)."""
        self._executors: dict[str, Executor] = {ex.name: ex for ex in known}

    def executor(self, name: str) -> Executor:
        if name not in self._executors:
            self._executors[name] = get_executor(name)
        return self._executors[name]

    def prefetch(self, point_dirs: list[Path]) -> None:
        """Before refreshing many points: each executor is asked about all their jobs at once."""
        wanted: dict[str, list[str]] = {}
        for point_dir in point_dirs:
            with contextlib.suppress(BenchError):  # a damaged record is said when the point is refreshed
                record = PointDir(point_dir).state()
                if record.state not in states.SETTLED and record.current.job_id \
                        and PointDir(point_dir).copy_of() is None:
                    wanted.setdefault(record.current.executor, []).append(record.current.job_id)
        for name, job_ids in wanted.items():
            with contextlib.suppress(BenchError):
                self.executor(name).prefetch(job_ids)

    def refresh(self, point_dir: Path) -> str:
        """The point's state, its job asked of its executor where it may still run; a copy of a run folder
        made while its job ran keeps the state as copied: the job is the original's, and what it does is
        recorded there (asked from here, a job that ended would look lost: the copy's log stops where it was
        copied)."""
        point = PointDir(point_dir)
        record = point.state()
        if record.state in states.SETTLED or point.copy_of() is not None:
            return record.state
        with contextlib.suppress(BenchError):  # a store that cannot be written follows the job all the same
            point.follow_move()
        return self.executor(record.current.executor).poll(point_dir)

    @property
    def silences(self) -> list[str]:
        """One line per scheduler that did not answer: the states shown for its jobs are the last recorded."""
        return [f"{name} did not answer ({ex.silence}): the states of its jobs are as last recorded"
                for name, ex in self._executors.items() if ex.silence]

