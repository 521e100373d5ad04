"""The lines a jobscript prints about its own life, and reading them back: how a later process learns when
a job started and how it ended when no scheduler remembers it (the local executor, a purged Slurm job).

Each line stamps the wall clock and the node's boot clock (/proc/uptime, which no wall-clock step moves):
the two stamps of one job give its run time even where the wall clock was stepped while it ran."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

#: the jobscript's first and last lines begin so
STARTED = "nlp-bench: job "
EXITED = "nlp-bench: training exited with code "
#: the two lines as the jobscript prints them (slurm/templates/jobscript.sbatch.j2 is rendered with these; the
#: shell fills in the job id, the nodes, the time and the training's exit code `$rc`), and as read back below
_UPTIME = " uptime $(cut -d' ' -f1 /proc/uptime 2>/dev/null)"
START_LINE = (STARTED + "${SLURM_JOB_ID:-none} on ${SLURM_JOB_NODELIST:-$(hostname)} started $(date -Iseconds)"
              + _UPTIME)
EXIT_LINE = EXITED + "$rc at $(date -Iseconds)" + _UPTIME

_STARTED = re.compile(rb"^" + re.escape(STARTED.encode()) + rb"(\S+) on \S+ started (\S+)(?: uptime (\d+\.?\d*))?",
                      re.M)
_EXITED = re.compile(rb"^" + re.escape(EXITED.encode()) + rb"(\d+)(?: at (\S+))?(?: uptime (\d+\.?\d*))?", re.M)
#: how much of the log's end is read: the exit line is the script's very last
TAIL_BYTES = 16_384


class Exit(NamedTuple):
    code: int
    at: datetime | None
    uptime: float | None = None  # the node's boot clock, in seconds (None in a line of an older jobscript)


class Start(NamedTuple):
    job_id: str | None  # the scheduler's id, as the job saw it (None where it ran without one)
    at: datetime | None
    uptime: float | None = None


def ran_s(begun: Start | None, ended: Exit | None) -> float | None:
    """The job's run time by its node's boot clock, from its first line to its exit line; None where either
    line lacks the stamp (or the clock went back: the job's lines do not come from one boot)."""
    if begun is None or ended is None or begun.uptime is None or ended.uptime is None:
        return None
    return ended.uptime - begun.uptime if ended.uptime >= begun.uptime else None


def _time(raw: bytes | None) -> datetime | None:
    try:
        return datetime.fromisoformat(raw.decode()) if raw else None
    except ValueError:
        return None


def _read(path: Path, from_end: bool) -> bytes:
    try:
        with Path(path).open("rb") as fh:
            if from_end:
                fh.seek(0, 2)
                fh.seek(max(0, fh.tell() - TAIL_BYTES))
            return fh.read(TAIL_BYTES)
    except OSError:
        return b""


def exit_of(log: Path) -> Exit | None:
    """The exit code (and time) the jobscript wrote last, or None when it never got there."""
    found = _EXITED.findall(_read(log, from_end=True))
    if not found:
        return None
    code, at, uptime = found[-1]
    return Exit(int(code), _time(at), float(uptime) if uptime else None)


def start_of(log: Path) -> Start | None:
    """The job id and start time the jobscript wrote first, or None when it never started."""
    found = _STARTED.search(_read(log, from_end=False))
    if not found:
        return None
    job_id = found.group(1).decode(errors="replace")
    uptime = found.group(3)
    return Start(None if job_id == "none" else job_id, _time(found.group(2)), float(uptime) if uptime else None)
