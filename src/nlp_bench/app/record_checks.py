"""A point's records checked against what runs before a view shows them or a resume runs them: the folder its
job belongs to (a copy of a run folder is not the run) and the jobscript (a point.json edited by hand names a
layout the job never ran). What disagrees is one line naming both, and the row's state is marked with it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nlp_bench.errors import SpecError
from nlp_bench.launch.script_args import jobscript_layout
from nlp_bench.store.names import JOBSCRIPT
from nlp_bench.store.point_folder import PointDir, sha256

#: the words a marked row's state carries, "RUNNING (copy)"
COPY, MISMATCH = "copy", "mismatch"


@dataclass(frozen=True)
class Mark:
    word: str
    line: str


def layout_disagreement(point: PointDir, script: Path, layout: dict[str, Any] | None = None) -> str | None:
    """One line where point.json's layout (`layout`, where the caller read it already) is not what `script`
    runs; None where they agree, and where the script cannot be read (a view or a submission says that where
    it reads the script)."""
    try:
        stated = jobscript_layout(script.read_text(errors="replace"), str(script))
    except (OSError, SpecError):
        return None
    return point.layout_disagreement(stated, script, layout)


def ran_script(point: PointDir) -> Path:
    """The script a point's job ran: the copy frozen at its submission, or (never submitted) the one a run
    would submit."""
    frozen = point.submitted_script()
    return frozen if frozen.is_file() else point.file(JOBSCRIPT)


def marks(point: PointDir) -> list[Mark]:
    """What a view must say of the point besides its records: that it is a copy of a run whose job lives
    elsewhere, that its point.json names another layout than its jobscript runs, that the submitted script
    is not the one hashed at submission."""
    found = []
    original = point.copy_of()
    if original is not None:
        found.append(Mark(COPY, f"{point.path} is a copy of {original}, made while its job "
                                f"{point.attempt().job_id} ran: that job is followed there; the state shown is "
                                "as it was copied"))
    script = ran_script(point)
    attempt = point.attempt()
    kept = (attempt.scripts_sha256 or {}).get(JOBSCRIPT) if attempt else None
    if kept and script == point.submitted_script():
        try:
            body = script.read_bytes()
        except OSError:
            body = None
        if body is not None and sha256(body) != kept:
            found.append(Mark(MISMATCH, f"{script} is not the script submitted: its sha256 is not the one "
                                        f"kept at submission ({kept[:12]}...)"))
    line = layout_disagreement(point, script)
    if line:
        found.append(Mark(MISMATCH, line))
    return found


def marked(state: str, found: list[Mark]) -> str:
    """A row's state with the words of its marks, each once: "COMPLETED (mismatch)"."""
    words = list(dict.fromkeys(m.word for m in found))
    return f"{state} ({', '.join(words)})" if words else state


def unmarked(state: str) -> str:
    """The job state of a shown (maybe marked) state."""
    return state.split(" (", 1)[0]
