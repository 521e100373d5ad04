"""How a job ended: its terminal state recorded with a failure class read from its output. Every executor
calls this, so a job's end is judged the same way whichever scheduler ran it."""

from __future__ import annotations

from pathlib import Path

from nlp_bench.launch import failures, states
from nlp_bench.workspace import JOB_ERR, JOB_OUT


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


def finish(point_dir: Path, state: str, exit_code: int | None, **extra) -> dict:
    """Record a terminal state with its failure class (and what else the scheduler said of the job)."""
    failure, detail = failures.classify(state, exit_code, output_text(point_dir))
    if failure is not None and state == states.COMPLETED:
        state = states.FAILED
    return states.record(point_dir, state, exit_code=exit_code, failure_class=failure, failure_detail=detail,
                         finished=states.now_iso(), **extra)
