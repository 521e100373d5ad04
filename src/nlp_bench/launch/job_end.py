"""How a job ended: its terminal state recorded with a failure class read from its output. Every executor
calls this, so a job's end is judged the same way whichever scheduler ran it."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from nlp_bench.launch import failures
from nlp_bench.store import protocol, states
from nlp_bench.store.names import JOB_ERR, JOB_OUT
from nlp_bench.store.point_folder import PointDir
from nlp_bench.store.records import Attempt


def output_text(point_dir: Path, tail_bytes: int = 200_000) -> str:
    """The end of job.out and job.err, which is where failures show."""
    parts = []
    for name in (JOB_OUT, JOB_ERR):
        path = Path(point_dir) / name
        try:
            with path.open("rb") as fh:
                fh.seek(0, 2)
                fh.seek(max(0, fh.tell() - tail_bytes))
                parts.append(fh.read().decode("utf-8", "replace"))
        except OSError:
            continue
    return "\n".join(parts)


def finish(point_dir: Path, state: str, exit_code: int | None, *, number: int | None = None,
           started: datetime | None = None, finished: datetime | None = None, times_from: str | None = None,
           **extra: Any) -> Attempt:
    """Record a terminal state with its failure class, for attempt `number` (default: the current one) and
    only while it has not ended: a second process that saw the same end, or a poll of an earlier attempt,
    changes nothing. The times are the scheduler's where it gave them, else the job's own log's (its first
    and last lines); where neither knows when the job ended, the end is left unknown rather than guessed.
    Where the end is the log's, the run time is also kept by the boot clock the job's lines stamp: a wall
    clock stepped while the job ran then changes no Job_Time."""
    point = PointDir(point_dir)
    current = point.attempt()
    if current is None or current.state in states.TERMINAL:
        return current
    if current.cancel_requested and state != states.COMPLETED:  # the job's own end, seen first, of a cancel
        state = states.CANCELLED
    failure, detail = failures.classify(state, exit_code, output_text(point_dir))
    if failure is not None and state == states.COMPLETED:
        state = states.FAILED
    log = Path(point_dir) / JOB_OUT
    ended, begun = protocol.exit_of(log), protocol.start_of(log)
    ran_s = None
    if finished is None and ended is not None and ended.at is not None:
        finished, times_from, ran_s = ended.at, times_from or "log", protocol.ran_s(begun, ended)
    if started is None and not current.started and begun is not None:
        started = begun.at
    times: dict[str, Any] = {"finished": finished.isoformat() if finished else None, "times_from": times_from,
                             "monotonic_s": ran_s}
    if started is not None:
        times["started"] = started.isoformat()
    return point.update(state, number=current.number if number is None else number, exit_code=exit_code,
                        failure_class=failure, failure_detail=detail, **times, **extra)
