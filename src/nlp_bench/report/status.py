"""`bench status`: where every point of a run stands: state, elapsed time, last iteration, tokens/s (JUBE's
figure over the intervals logged so far: the number the result table will show), ETA."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nlp_bench.analysis.metrics import jube_tokens_per_s
from nlp_bench.analysis.parsers import Parsed, parsed_file
from nlp_bench.analysis.results import doubts
from nlp_bench.report.figures import figure_text
from nlp_bench.store import states
from nlp_bench.store.names import JOB_OUT
from nlp_bench.store.point_folder import PointDir

STATUS_COLUMNS = ("point", "state", "job", "elapsed", "iteration", "tokens/s", "ETA", "failure")


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def point_status(point_dir: Path, notes: list[str] | None = None) -> dict[str, Any]:
    """Where the point's current attempt stands (an earlier attempt's failure is not this one's); `notes`
    hears what makes its figures less than they seem (lines of its log not read, a stepped clock)."""
    folder = PointDir(point_dir)
    point = folder.point()
    attempt = folder.attempt()
    parsed = parsed_file(point_dir / JOB_OUT) if (point_dir / JOB_OUT).is_file() else Parsed(None, [])
    records = parsed.records
    if notes is not None:
        notes.extend(doubts(point_dir, attempt, parsed.notes()))
    last = records[-1] if records else None
    tokens = eta = None
    if last is not None:
        tokens = jube_tokens_per_s(records, point.seq_length, point.global_batch_size)
        if attempt is not None and attempt.state == states.RUNNING and last.total_iterations:
            eta = (last.total_iterations - last.iteration) * last.iteration_time_s
    failure = ""
    if attempt is not None and attempt.failure_class:
        failure = f"{attempt.failure_class}: {attempt.failure_detail}"
    elif attempt is not None and attempt.state == states.NOT_SUBMITTED and attempt.failure_detail:
        failure = attempt.failure_detail
    return {
        "point": point.id, "state": attempt.state if attempt else states.NOT_SUBMITTED,
        "job": (attempt.job_id if attempt else None) or "-", "elapsed": _clock(attempt.elapsed_s() if attempt else None),
        "iteration": f"{last.iteration}/{last.total_iterations}" if last else "-",
        "tokens/s": figure_text("tokens_per_s", tokens or None), "ETA": _clock(eta), "failure": failure,
    }


def missing_status(point_id: str) -> dict[str, Any]:
    return {"point": point_id, "state": states.MISSING, "job": "-", "elapsed": "-", "iteration": "-",
            "tokens/s": "-", "ETA": "-", "failure": "the folder is gone (run.json lists it)"}


#: the columns kept first when the terminal is narrow
_PRIORITY = ("point", "state", "iteration", "tokens/s", "ETA", "elapsed", "job", "failure")


def _fit(rows: list[dict[str, Any]], columns: list[str], width: int | None) -> tuple[list[str], int]:
    """The columns that fit `width` whole, by _PRIORITY (the failure counts 7 characters: it takes what is
    left), and the width they take."""
    from nlp_bench.report.table import CELL_EXTRA, EDGE

    kept, used = [], EDGE
    for column in (c for c in _PRIORITY if c in columns):
        need = (7 if column == "failure" else _whole(rows, column)) + CELL_EXTRA
        if width is None or used + need <= width:
            kept.append(column)
            used += need
    return kept, used


def _whole(rows: list[dict[str, Any]], column: str) -> int:
    return max([len(column), *(len(str(row[column])) for row in rows)])


def status_table(rows: list[dict[str, Any]], title: str, width: int | None = None):
    """One line per point, with its state always (what the command is asked for). Another column alike on
    every row of two or more is said once in the caption instead;
    with a `width`, the columns that fit it whole, by _PRIORITY, the point ids shortened to what tells them
    apart where not all fit (the failure takes what is left, cut with an ellipsis: state.json and `bench
    result table --wide` keep it whole); the caption names the columns left out."""
    from rich import box
    from rich.table import Table

    from nlp_bench.report.condense import common_line, same_on_every_row, shorter_ids
    from nlp_bench.report.table import CELL_EXTRA

    common = same_on_every_row(STATUS_COLUMNS, [[str(row[c]) for c in STATUS_COLUMNS] for row in rows],
                                ("point", "state"))
    columns = [c for c in STATUS_COLUMNS if c not in common]
    kept, used = _fit(rows, columns, width)
    said = {c: common[c] for c in STATUS_COLUMNS if c in common}
    if len(kept) < len(columns):
        short, pattern = shorter_ids([row["point"] for row in rows])
        rows = [{**row, "point": short[row["point"]]} for row in rows]
        said = {"point": pattern, **said} if pattern else said
        kept, used = _fit(rows, columns, width)
    left_out = [c for c in columns if c not in kept and (c != "failure" or any(row[c] for row in rows))]
    captions = ["tokens/s: JUBE's figure, every interval logged so far" if "tokens/s" in kept else "",
                common_line(said, None).rstrip("\n"),
                f"left out for the width: {', '.join(left_out)}" if left_out else ""]
    table = Table(title=title, box=box.SIMPLE_HEAD, header_style="bold",
                  caption="\n".join(c for c in captions if c) or None)
    shown = [c for c in STATUS_COLUMNS if c in kept]
    for column in shown:
        whole = _whole(rows, column)
        if column == "failure":  # what the other columns leave, so that rich has nothing to squeeze
            room = whole if width is None else max(7, width - (used - 7 - CELL_EXTRA) - CELL_EXTRA)
            table.add_column(column, no_wrap=True, overflow="ellipsis", max_width=min(room, whole))
        else:
            table.add_column(column, no_wrap=True, min_width=whole)
    for row in rows:
        table.add_row(*(str(row[c]) for c in shown))
    return table
