"""Runs: results/<benchmark>/<run-id>/ with run.json and one folder per point.

A run is created whole or not at all: it is written in a hidden folder and renamed into place once run.json
(its point list, the truth about what the run holds) is written. Runs are ordered by the store's own
counter, not by a clock: "the newest run" is the last one created, whatever the time zone or an NTP step
says.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from nlp_bench import __version__
from nlp_bench.store import locks
from nlp_bench.store.files import StoreError, os_reason, read_object, write_object, write_text
from nlp_bench.store.names import CREATING, CREATING_LOCK, RUN_JSON, SEQUENCE
from nlp_bench.store.point_folder import PointDir
from nlp_bench.store.records import RunRecord, now_iso


@dataclass(frozen=True)
class Run:
    path: Path

    @property
    def id(self) -> str:
        return self.path.name

    @property
    def benchmark(self) -> str:
        return self.path.parent.name

    def record(self) -> RunRecord:
        path = self.path / RUN_JSON
        return RunRecord.read(read_object(path), path)

    def points(self) -> list[PointDir]:
        """Every point run.json lists, in its order, whether or not its folder is still there."""
        return [PointDir(self.path / name) for name in self.record().points]

    def point_dirs(self) -> list[Path]:
        """The folders of the points that are there."""
        return [p.path for p in self.points() if p.exists()]


def check_root(root: Path) -> Path:
    """The results folder, refused in one line where it cannot be one (a file, /dev/null)."""
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise StoreError(f"results folder {root} is not a folder (--results-dir or NLP_BENCH_RESULTS)")
    return root


def new_run_id() -> str:
    """UTC to the microsecond, readable and sortable, with a hash that keeps apart two runs of the same
    microsecond from two processes (the order between runs is the counter's, not the id's)."""
    now = time.time_ns()
    seconds, micros = divmod(now // 1000, 1_000_000)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(seconds))
    salt = f"{now}-{os.getpid()}-{os.urandom(4).hex()}"
    return f"{stamp}.{micros:06d}Z-{hashlib.sha1(salt.encode()).hexdigest()[:6]}"


def _next_sequence(root: Path) -> int:
    """The next value of the results folder's run counter, taken under its lock. A counter that is gone or
    unreadable starts again after the largest value any run holds."""
    counter = root / SEQUENCE
    with locks.hold(root / f"{SEQUENCE}.lock", f"the run counter of {root}", wait=True):
        try:
            value = int(counter.read_text()) + 1
        except (OSError, ValueError):
            value = 1 + max((run.record().sequence or 0 for run in _readable(root)), default=0)
        write_text(counter, f"{value}\n")
    return value


def _readable(root: Path) -> Iterator[Run]:
    for path in _run_files(root):
        run = Run(path.parent)
        with contextlib.suppress(StoreError):
            run.record()
            yield run


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


def argv() -> list[str]:
    return [Path(sys.argv[0]).name, *sys.argv[1:]]


#: a half-written run is cleared only when untouched this long: its creator takes its lock at once, and a
#: folder this young may be one whose creator has not yet
ABANDONED_AFTER_S = 60.0


def _clear_abandoned(folder: Path) -> None:
    """Remove what creators that were killed left half-written (their lock is free)."""
    for stale in folder.glob(f"{CREATING}*"):
        with contextlib.suppress(locks.Busy, StoreError, OSError):
            if time.time() - stale.stat().st_mtime < ABANDONED_AFTER_S:
                continue
            with locks.hold(stale / CREATING_LOCK, f"{stale}"):
                shutil.rmtree(stale)


def create_run(root: Path, benchmark: str, tag: str, system: str, point_ids: list[str],
               write: Callable[[Path], None], command: list[str] | None = None, **extra: Any) -> Run:
    """A new run, complete or not at all: `write(folder)` writes the points into a hidden folder, run.json
    is written last, and the folder is renamed into place. An interrupt, a full disk or a read-only folder
    leaves no run behind (and says why, naming the path)."""
    root = check_root(root)
    parent = root / benchmark
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot make {parent}: {os_reason(exc)}") from None
    _clear_abandoned(parent)
    run_id = new_run_id()
    building = parent / f"{CREATING}{run_id}"
    try:
        building.mkdir()
    except OSError as exc:
        raise StoreError(f"cannot make {building}: {os_reason(exc)}") from None
    try:
        with locks.hold(building / CREATING_LOCK, f"run {run_id} while it is written"):
            write(building)
            record = RunRecord(run_id, benchmark, system, now_iso(), tuple(point_ids), _next_sequence(root), (tag,),
                               tuple(command if command is not None else argv()), versions(), extra)
            write_object(building / RUN_JSON, record.to_dict())
            os.rename(building, parent / run_id)  # the lock goes with it: no cleaner takes a run being renamed
        (parent / run_id / CREATING_LOCK).unlink(missing_ok=True)
    except OSError as exc:
        shutil.rmtree(building, ignore_errors=True)
        raise StoreError(f"cannot write run {parent / run_id}: {os_reason(exc)}; nothing was written") from None
    except StoreError as exc:
        shutil.rmtree(building, ignore_errors=True)
        raise StoreError(f"{exc} (while writing run {run_id}: nothing was written)") from None
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return Run(parent / run_id)


@dataclass
class Listing:
    """The runs under a results folder, oldest first, and the run folders whose run.json is damaged."""

    runs: list[Run] = field(default_factory=list)
    #: run folder -> what is wrong with its run.json
    broken: dict[Path, str] = field(default_factory=dict)


def _order(run: Run, record: RunRecord) -> tuple:
    """Runs with the store's counter after those made before it existed, each group in its own order."""
    return (record.sequence is not None, record.sequence or 0, record.created, run.id)


def list_runs(root: Path) -> Listing:
    found = Listing()
    keyed = []
    for path in _run_files(check_root(root)):
        run = Run(path.parent)
        try:
            keyed.append((_order(run, run.record()), run))
        except StoreError as exc:
            found.broken[run.path] = str(exc)
    found.runs = [run for _, run in sorted(keyed, key=lambda pair: pair[0])]
    return found


def _run_files(root: Path) -> Iterator[Path]:
    for path in sorted(root.glob(f"*/*/{RUN_JSON}")):
        if not any(part.startswith(".") for part in path.relative_to(root).parts[:-1]):
            yield path


def find_run(root: Path, ref: str | None) -> Run:
    """A run by folder, by id or unique id prefix, or (ref None) the newest."""
    root = check_root(root)
    if ref is not None and (Path(ref) / RUN_JSON).is_file():
        run = Run(Path(ref))
        run.record()  # refuses a damaged run.json in one line
        return run
    listing = list_runs(root)
    runs = listing.runs
    damaged = [why for path, why in listing.broken.items() if ref is not None and path.name.startswith(ref)]
    if not runs:
        damaged = damaged or list(listing.broken.values())
        raise StoreError(damaged[0] if damaged else
                         f"no runs under {root}/ (start one with `bench run`, or pass --results-dir)")
    if ref is None:
        return runs[-1]
    matches = [r for r in runs if r.id == ref or r.id.startswith(ref)]
    if not matches and damaged:
        raise StoreError(damaged[0])
    if len(matches) != 1:
        what = "no run" if not matches else f"{len(matches)} runs"
        recent = ", ".join(r.id for r in runs[-3:])
        raise StoreError(f"{what} under {root}/ match {ref!r}; the newest are: {recent}")
    return matches[0]
