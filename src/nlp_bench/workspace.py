"""The run workspace: results/<benchmark>/<run-id>/<point-id>/ with run.json, point.json, the jobscript,
the job's output, state.json and result.json (DESIGN.md). Every JSON file is written atomically."""

from __future__ import annotations

import collections
import csv
import gzip
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

from nlp_bench import __version__
from nlp_bench.errors import ResultError
from nlp_bench.fsio import read_json, write_json_atomic, write_text_atomic


class StoredPoint(Protocol):
    """What the workspace needs of a point (spec.benchmark.Point is one): the workspace sits below every
    layer, so it stores points without knowing how they are made."""

    @property
    def id(self) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...

RUN_JSON, POINT_JSON, STATE_JSON, RESULT_JSON = "run.json", "point.json", "state.json", "result.json"
#: what the planner predicted for a point before it ran (written at submission where the system can be timed)
PREDICTION_JSON = "prediction.json"
JOBSCRIPT, JOB_OUT, JOB_ERR = "jobscript.sbatch", "job.out", "job.err"
#: the compile job of systems that compile ahead of the run (Neuron): its script and output
COMPILE_SCRIPT, COMPILE_OUT, COMPILE_ERR = "compile.sbatch", "compile.out", "compile.err"
#: where each script's output goes when no scheduler directive says so (the local executor)
OUTPUTS = {JOBSCRIPT: (JOB_OUT, JOB_ERR), COMPILE_SCRIPT: (COMPILE_OUT, COMPILE_ERR)}
PROVENANCE_ENV = "provenance.env"
#: the trainer's arguments as the job ran them (after the shell expanded them), one per line
TRAIN_ARGS_FILE = "train.args"
#: the points a sweep dropped, one CSV row each (its parameters, the reason, the rule counted by)
DROPPED_CSV = "dropped.csv.gz"  # written by the jobscript at start: the environment that shapes performance


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_run_id() -> str:
    """Sortable by creation time to the microsecond (local time, as a person reads it), so "the newest run"
    is the last one made even when several start in the same second (a dry run beside a real one); the
    hash keeps two runs of the same microsecond, from two processes, apart."""
    now = time.time_ns()
    seconds, micros = divmod(now // 1000, 1_000_000)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(seconds))
    salt = f"{now}-{os.getpid()}-{os.urandom(4).hex()}"
    return f"{stamp}.{micros:06d}-{hashlib.sha1(salt.encode()).hexdigest()[:6]}"


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, Any]:
    """Software versions, read from package metadata so that the CLI never imports torch for them."""
    return {"nlp-bench": __version__, "python": platform.python_version(), "torch": _version("torch"),
            "platform": platform.platform(), "git_commit": git_commit()}


def git_commit() -> str | None:
    """The commit of the checkout that rendered the jobscripts, "+dirty" when it holds changes; None
    outside a git checkout."""
    from nlp_bench.paths import project_root

    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(["git", *args], cwd=project_root(), capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


@dataclass(frozen=True)
class Run:
    path: Path

    @property
    def id(self) -> str:
        return self.path.name

    @property
    def benchmark(self) -> str:
        return self.path.parent.name

    def meta(self) -> dict[str, Any]:
        return read_json(self.path / RUN_JSON)

    def point_dirs(self) -> list[Path]:
        return sorted(p.parent for p in self.path.glob(f"*/{POINT_JSON}"))


def create_run(root: Path, benchmark: str, tag: str, system: str, points: list[StoredPoint], argv: list[str],
               **extra: Any) -> Run:
    """A new run folder with run.json describing what was asked (`extra`: the grid and what it dropped)."""
    run = Run(Path(root) / benchmark / new_run_id())
    run.path.mkdir(parents=True, exist_ok=False)
    write_json_atomic(run.path / RUN_JSON, {
        "id": run.id, "benchmark": benchmark, "tags": [tag], "system": system, "created": now_iso(),
        "command": argv, "points": [p.id for p in points], "versions": versions(), **extra,
    })
    return run


def write_point(run: Run, point: StoredPoint, jobscript: str, compile_script: str | None = None) -> Path:
    """The point's folder with point.json and its jobscript (executable, so it also runs by hand), and the
    compile job's script where the system compiles ahead."""
    folder = run.path / point.id
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / POINT_JSON, point.to_dict(), durable=False)
    write_text_atomic(folder / JOBSCRIPT, jobscript, mode=0o755, durable=False)
    if compile_script is not None:
        write_text_atomic(folder / COMPILE_SCRIPT, compile_script, mode=0o755, durable=False)
    return folder


def list_runs(root: Path) -> list[Run]:
    """All runs under root, oldest first (run ids sort by time)."""
    runs = [Run(p.parent) for p in Path(root).glob(f"*/*/{RUN_JSON}")]
    return sorted(runs, key=lambda r: r.id)


def find_run(root: Path, ref: str | None) -> Run:
    """A run by path, by id, or (ref None) the newest one."""
    if ref is not None and (Path(ref) / RUN_JSON).is_file():
        return Run(Path(ref))
    runs = list_runs(root)
    if not runs:
        raise ResultError(f"no runs under {root}/ (start one with `bench run`, or pass --results-dir)")
    if ref is None:
        return runs[-1]
    matches = [r for r in runs if r.id == ref or r.id.startswith(ref)]
    if len(matches) != 1:
        what = "no run" if not matches else f"{len(matches)} runs"
        recent = ", ".join(r.id for r in runs[-3:])
        raise ResultError(f"{what} under {root}/ match {ref!r}; the newest are: {recent}")
    return matches[0]


def read_optional(path: Path) -> dict[str, Any] | None:
    return read_json(path) if path.is_file() else None


def argv() -> list[str]:
    return [Path(sys.argv[0]).name, *sys.argv[1:]]


class DroppedLog:
    """The points a sweep drops, streamed to a compressed CSV and counted by rule: a grid of millions of
    combinations is never held in memory. The file waits in a temporary folder until the run exists
    (keep) or the sweep is refused (discard), so a refused sweep writes nothing."""

    def __init__(self, columns: Sequence[str]) -> None:
        self.columns = list(columns)
        self.counts: collections.Counter[str] = collections.Counter()
        self._folder = tempfile.mkdtemp(prefix="nlp-bench-dropped-")
        self._path = Path(self._folder) / DROPPED_CSV
        # level 1: most of the time goes to writing rows, and dropped rows compress well at any level
        self._file = gzip.open(self._path, "wt", compresslevel=1, newline="")
        self._writer = csv.writer(self._file)
        self._writer.writerow([*self.columns, "reason", "rule"])

    def add(self, params: dict[str, Any], reason: str, rule: str) -> None:
        self.counts[rule] += 1
        self._writer.writerow([*(params.get(c) for c in self.columns), reason, rule])

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def keep(self, run: Run) -> Path:
        self._file.close()
        target = run.path / DROPPED_CSV
        shutil.move(str(self._path), target)
        shutil.rmtree(self._folder, ignore_errors=True)
        return target

    def discard(self) -> None:
        self._file.close()
        shutil.rmtree(self._folder, ignore_errors=True)


def dropped_rows(run: Run) -> Iterator[dict[str, str]]:
    """The run's dropped points, one dict per CSV row, read as a stream."""
    path = run.path / DROPPED_CSV
    if not path.is_file():
        return
    with gzip.open(path, "rt", newline="") as fh:
        yield from csv.DictReader(fh)
