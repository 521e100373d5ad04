"""A job run on this machine, watched to its end: the progress bar fed by the trainer's own iteration
lines, Ctrl-C that cancels the job, and the results folder's lock that keeps two local jobs apart."""

from __future__ import annotations

import codecs
import contextlib
from collections.abc import Iterator
from pathlib import Path

from nlp_bench.analysis import metrics, parsers
from nlp_bench.launch.executor import Executor, wait
from nlp_bench.report.console import progress_bar, say, warn
from nlp_bench.store import locks
from nlp_bench.store.files import StoreError
from nlp_bench.store.names import COMPILE_SCRIPT, JOB_OUT, JOBSCRIPT
from nlp_bench.store.point_folder import PointDir
from nlp_bench.store.records import PointRecord


class LogFollower:
    """Reads new complete lines of a growing job.out, a chunk at a time and cut as a parse cuts them (a hole
    of NULs in a log of gigabytes is neither held nor glued to the line after it), and keeps its iteration
    records."""

    def __init__(self, path: Path, figure: metrics.JubeFigure) -> None:
        self.path, self.offset, self.last = path, 0, None
        self.figure = figure
        self.lines = parsers.LineFeed()
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def update(self) -> parsers.Record | None:
        """The latest record (None before the first); every new one goes into the figure."""
        if self.path.is_file():
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                for chunk in iter(lambda: fh.read(parsers.CHUNK_BYTES), b""):
                    self.offset += len(chunk)
                    lines = self.lines.feed(self.decoder.decode(chunk))
                    for record in filter(None, (parsers.parse_line(line, terminated=True) for line in lines)):
                        self.figure.add(record)
                        self.last = record
        return self.last


class Interrupted(Exception):
    """Ctrl-C while a local job ran: the job was cancelled."""


def chain(folder: Path) -> tuple[str, ...]:
    """The point's scripts in the order they run: the compile job first where the system compiles ahead."""
    return (COMPILE_SCRIPT, JOBSCRIPT) if (folder / COMPILE_SCRIPT).is_file() else (JOBSCRIPT,)


def _watch(executor: Executor, folder: Path, point: PointRecord) -> str:
    """Wait for the job with a progress bar fed by the trainer's own iteration lines."""
    follower = LogFollower(folder / JOB_OUT, metrics.JubeFigure(point.seq_length, point.global_batch_size))
    with progress_bar(point.id, point.planned_iterations(), info=True) as bar:
        bar.update(info="starting")

        def on_poll(state: str) -> None:
            rec = follower.update()
            if rec is None:
                bar.update(info=state.lower())
                return
            tps = follower.figure.value
            loss = f", loss {rec.loss:.3f}" if rec.loss is not None else ""
            # the figures first: a narrow line cuts the explanation at its end
            info = (f"{tps:,.0f} tokens/s{loss} (tokens/s: JUBE's, every interval so far)" if tps
                    else f"tokens/s not known yet{loss}")
            bar.update(completed=rec.iteration, total=rec.total_iterations, info=info)

        return wait(executor, folder, interval_s=0.5, on_poll=on_poll)


def run_here(executor: Executor, folder: Path, point: PointRecord, after: tuple[str, ...]) -> str:
    """Start the job on this machine and watch it to its end; Ctrl-C cancels it (and raises Interrupted)."""
    job_id = None
    try:
        job_id = executor.submit(folder, chain(folder), after)
        return _watch(executor, folder, point)
    except KeyboardInterrupt:
        attempt = PointDir(folder).attempt()
        if attempt is not None and attempt.job_id is not None:
            executor.cancel(folder)
            warn(f"interrupted: job cancelled; its output is in {folder}")
        else:
            executor.poll(folder)  # interrupted before the job started: recorded as such
            warn(f"interrupted before the job of {folder.name} started")
        raise Interrupted from None
    except StoreError as exc:
        if job_id is None:
            raise
        raise StoreError(f"{exc}; job {job_id} was left as it is: once this is fixed, `bench status` (run from the "
                         "folder's results root) records how it ended") from None


@contextlib.contextmanager
def alone(lock: Path, name: str) -> Iterator[None]:
    """Hold the results folder's local-job lock, saying so when another job has it first. The job started in
    the block holds it too, to its end: a bench killed while its job runs leaves the lock with the job."""
    try:
        with locks.hold(lock, f"the local jobs of {lock.parent}", for_jobs=True):
            yield
            return
    except locks.Busy as exc:
        say(f"  {name}: waiting, {exc}")
    with locks.hold(lock, f"the local jobs of {lock.parent}", wait=True, for_jobs=True):
        yield
