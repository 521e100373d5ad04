"""The executor interface: what every scheduler offers the layers above (submit a chain of scripts after
other jobs, poll, cancel), waiting on it, and the registry that finds one by the name a system profile
gives (`executor:`). An executor is a class in any module of launch/, marked @register_executor (see
nlp_bench.registry for why). Nothing above launch/ asks which scheduler it is; it asks the executor what it
can do (Executor.queues, Executor.holds_jobs)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from nlp_bench.errors import LaunchError
from nlp_bench.registry import Registry
from nlp_bench.spec.systems import System
from nlp_bench.store import states
from nlp_bench.store.names import JOBSCRIPT
from nlp_bench.store.point_folder import PointDir
from nlp_bench.store.records import Attempt


def job_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a job bench starts begins with: this one (sbatch hands it on), with bench's own
    bin folder (torchrun, the trainer) first on PATH, so a job finds them even when the profile's set-up
    lines activate nothing."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


@dataclass(frozen=True)
class Cancelled:
    """What became of a cancel: `confirmed` only when the scheduler shows every job of the chain ended."""

    confirmed: bool
    detail: str


def open_attempt(point_dir: Path) -> tuple[PointDir, Attempt | None, str]:
    """The point, the attempt a poll must ask its scheduler about (None where no scheduler need be asked:
    never submitted, or ended) and the recorded state. StoreError where the point's folder is gone."""
    point = PointDir(point_dir)
    point.require()
    record = point.state()
    return point, (None if record.state in states.SETTLED else record.current), record.state


class Executor(Protocol):
    """Runs a point's scripts somewhere and reports its state in the store's vocabulary.

    Every method takes the point folder, whose state.json carries the jobs of each attempt, so any
    process (a later `bench status`, a resumed run) can pick up a job another process submitted.
    """

    name: str
    #: True where submitted jobs wait in a queue and run on their own (a batch scheduler): the caller may
    #: submit every point and leave. False where the caller must see each job to its end before the next.
    queues: bool
    #: True where a job can be held until other jobs (by id) have completed successfully (`after`)
    holds_jobs: bool
    #: why the scheduler did not answer the last question, for the views to say (None: it answered)
    silence: str | None

    def check_available(self) -> None:
        """Raise LaunchError, before anything is written, when this executor cannot submit here."""

    def check_answers(self, system: str) -> None:
        """Raise LaunchError, naming `system`, when the scheduler does not answer now: asked after every
        other check and before any point is handed to it, so that nothing is left waiting for its answer."""

    def submit(self, point_dir: Path, chain: Sequence[str] = (JOBSCRIPT,), after: Sequence[str] = ()) -> str:
        """Start a new attempt: the point's scripts in `chain` order, each only once the one before it
        completed successfully (a failure ends the chain), the first only once every job in `after`
        completed. Returns the id of the last script's job, which the point's state follows; the attempt
        in state.json keeps every id of the chain and the sha256 of every script as submitted."""

    def prefetch(self, job_ids: list[str]) -> None:
        """Ask the scheduler about many jobs at once, ahead of the polls that follow."""

    def poll(self, point_dir: Path) -> str: ...

    def cancel(self, point_dir: Path) -> Cancelled: ...


def wait(executor: Executor, point_dir: Path, interval_s: float = 1.0,
         on_poll: Callable[[str], None] | None = None) -> str:
    """Poll until the job reaches a terminal state; on_poll(state) runs after every poll."""
    while True:
        state = executor.poll(point_dir)
        if on_poll is not None:
            on_poll(state)
        if state in states.TERMINAL:
            return state
        time.sleep(interval_s)


#: every executor, by the name profiles and state.json give it
EXECUTORS: Registry[type] = Registry("executor", "nlp_bench.launch", LaunchError)


def register_executor(cls: type) -> type:
    """Class decorator: the executor answers to its `name` in system profiles."""
    return EXECUTORS.add(cls.name, cls)


def get_executor(name: str) -> Executor:
    """The executor a record names (state.json's attempt, point.json's system)."""
    return EXECUTORS.get(name)()


def executor_for(system: System) -> Executor:
    """The executor a system profile names; an unknown name is refused naming the profile's file."""
    return EXECUTORS.get(system.executor, system.profile_path or f"system {system.name}")()
