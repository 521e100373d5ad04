"""The records a run hands from stage to stage (app.stages). Each stage takes one and gives the next, so a
stage is a function of what the stage before it found; a record carries what its stage read or made (a
point's point.json among it), and no later stage opens that file again for the same thing."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nlp_bench.errors import SpecError
from nlp_bench.launch.executor import Executor
from nlp_bench.spec.benchmark import Point
from nlp_bench.store.records import PointRecord
from nlp_bench.store.runs import Run


@dataclass(frozen=True)
class LaunchOptions:
    """How a run's jobs are launched and watched (the CLI's --wait, --hang-timeout and --after)."""

    wait: bool = False
    hang_timeout_s: int | None = None  # None: the jobscript's default
    #: Slurm job ids the new jobs wait for (afterok): they start only if those completed
    after: str | None = None
    #: #SBATCH options over the profile's and the tag's (--account, --partition, ..., --sbatch KEY=VALUE)
    sbatch: tuple[tuple[str, str], ...] = ()
    #: submit points the planner predicts not to fit in device memory
    force: bool = False

    def check(self, executor: Executor) -> None:
        if self.after is not None:
            if not executor.holds_jobs:
                raise SpecError(f"--after needs an executor that holds jobs until others end; {executor.name} "
                                "runs points one after another anyway")
            if not re.fullmatch(r"\d+(_\d+)?(:\d+(_\d+)?)*", self.after):
                raise SpecError(f"--after takes job ids joined by ':' (e.g. 1234:1240), got {self.after!r}")

    @property
    def after_ids(self) -> tuple[str, ...]:
        return tuple(self.after.split(":")) if self.after else ()


@dataclass(frozen=True)
class Order:
    """A run as asked and checked, before anything is written: the points as they will be written (sbatch
    overrides and Megatron-LM's flags applied), the planner's predictions by point id, the executor that will
    run them, and the results folder the run goes under."""

    root: Path
    benchmark: str
    tag: str
    points: tuple[Point, ...]
    executor: Executor
    options: LaunchOptions
    dry_run: bool
    predicted: Mapping[str, dict] = field(default_factory=dict)
    #: what run.json keeps beside the points (a sweep's grid and its dropped counts)
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: a sweep's hooks: called with the run's folder before its points are written (the dropped log goes
    #: in), and with the run once it exists
    on_write: Callable[[Path], object] | None = None
    on_run: Callable[[Run], None] | None = None


@dataclass(frozen=True)
class RenderedPoint:
    """One point as its folder will hold it, in memory: point.json's record, the scripts, the prediction."""

    record: PointRecord
    jobscript: str
    compile_script: str | None
    prediction: dict | None


@dataclass(frozen=True)
class Rendered:
    order: Order
    points: tuple[RenderedPoint, ...]


@dataclass(frozen=True)
class PointOnDisk:
    """A point folder of a run with its point.json record, as written or as read once."""

    folder: Path
    record: PointRecord


@dataclass(frozen=True)
class Written:
    """A run on disk whose points are to be launched: what a new run's write gives, and where a resume
    starts."""

    run: Run
    #: the results folder the run is in: where the lock that keeps local jobs one at a time lives
    root: Path
    executor: Executor
    options: LaunchOptions
    points: tuple[PointOnDisk, ...]
    #: a resume: points that ended without completing may run again
    again: bool = False


@dataclass(frozen=True)
class Launched:
    written: Written
    #: each point's state once its launch returned, in the order of written.points (None: it was skipped)
    states: tuple[str | None, ...]


@dataclass(frozen=True)
class Finished:
    """A run whose jobs have all ended, with the exit code it ends with."""

    written: Written
    code: int


@dataclass(frozen=True)
class Done:
    """The last record of a run's stages: the exit code for the command line."""

    code: int
