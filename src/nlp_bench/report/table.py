"""Render result rows as a terminal table or as CSV, JSON or Markdown files."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nlp_bench import flops
from nlp_bench.analysis.results import MOE_COLUMNS, RESULT_COLUMNS, rows_frame
from nlp_bench.errors import ResultError
from nlp_bench.fsio import dumps, write_text_atomic
from nlp_bench.report.condense import common_line, run_prefixes, same_on_every_row, shorter_ids
from nlp_bench.report.figures import DECIMALS
from nlp_bench.store.files import os_reason

#: Digits shown per column (a figure's as every view shows it); the files keep full precision except where
#: rounding is the published form.
_DIGITS = {"Avg_TFLOPs/GPU": DECIMALS["tflops_per_gpu"], "Tokens/sec": DECIMALS["tokens_per_s"],
           "time_to_report_in_seconds": DECIMALS["time_to_report_s"], "MFU": 4, "Job_Time": 0,
           "Predicted_Tokens/sec": 2, "Predicted/Measured": 3, "Joules/token": 4, "Report_kWh": 2}
#: The pretty table's default columns, most wanted first: when the terminal is too narrow for all of them,
#: the last ones go first. JUBE's core columns lead (what was measured and on which layout, then where and
#: when), then DP/MBS/GAS, MFU and state; the prediction follows only where some row has one. The figures,
#: the state and the columns that tell rows apart come before all of them (fit_columns). A model with experts
#: puts its EP and active and total parameters after the nodes (an 80-column row of one MoE point keeps them
#: before tp and pp); a table without one has no such columns.
PRIORITY = ("Model_Size", "Nodes", *MOE_COLUMNS, "Tensor_Parallel", "Pipeline_Parallel", "Tokens/sec", "time_to_report_in_seconds",
            "Avg_TFLOPs/GPU", "Batch_Size", "Iterations", "system", "JobID", "Job_Time", "queue", "version",
            "DP", "MBS", "GAS", "MFU", "state", "Predicted/Measured", "Predicted_Tokens/sec", "Extrapolated",
            "XLA_Graphs/step", "XLA_Compiles")
#: the benchmark's figures: every fitted table keeps them, however narrow
_FIGURES = ("Tokens/sec", "time_to_report_in_seconds")
_PREDICTED = ("Predicted_Tokens/sec", "Predicted/Measured", "Extrapolated")
#: what torch-xla's graphs cost (result.json's "xla"), shown where some row ran on xla
_XLA = ("XLA_Graphs/step", "XLA_Compiles")
#: the columns that tell rows apart: those whose values differ between the rows shown go before all others
_IDENTITY = ("system", "trainer", "Model_Size", "Nodes", "Tensor_Parallel", "Pipeline_Parallel", "EP", "DP", "MBS", "GAS",
             "Batch_Size", "state", "run")
#: what rich's SIMPLE_HEAD box adds around n columns of content: one space of padding on each side of every
#: cell and an edge of one character between and around them (measured: n columns take sum(widths) + 3n + 1)
CELL_EXTRA, EDGE = 3, 1


def format_cell(column: str, value: Any, empty: str = "-") -> str:
    """A value as a table shows it: the column's digits, and `empty` where there is none ("-" on a terminal;
    the files bench exports leave the cell empty, in every format)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return empty
    if column in _DIGITS and isinstance(value, (int, float)):
        return f"{value:.{_DIGITS[column]}f}"
    if column in _PARAMETERS and isinstance(value, (int, float)):
        return parameter_count(value)
    return str(value)


#: the columns that count parameters, written to three digits with a unit (46.7B, 4.43M)
_PARAMETERS = ("Active_Params", "Total_Params")


def parameter_count(value: float) -> str:
    """A parameter count to three significant digits in thousands, millions, billions or trillions: the cell
    stays narrow however large the model (the files keep the exact count)."""
    for unit, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if value >= unit * 0.9995:  # 999.6M rounds to 1B, not to 1e+03M
            return f"{value / unit:.3g}{suffix}"
    return f"{value:.0f}"


def _shown(frame):
    """The frame as the text files show it: every cell a string, formatted as the table formats it, empty
    where there is no value."""
    plain = frame.astype(object).where(frame.notna(), None)
    return plain.apply(lambda col: col.map(lambda v, c=col.name: format_cell(c, v, empty="")))


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }}
table {{ border-collapse: collapse; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: right; white-space: nowrap; }}
th {{ background: #f2f2f2; }}
</style>
</head>
<body>
<h1>{title}</h1>
{table}
</body>
</html>
"""


def terminal_width() -> int | None:
    """The width the pretty table must fit: COLUMNS where set (shells export it; scripts set it), else the
    terminal's when stdout is one, else None: output going to a file or a pipe is not cut to any width."""
    import shutil
    import sys

    value = os.environ.get("COLUMNS", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def resolve_columns(names: str) -> list[str]:
    """`--columns a,b,c` as result columns, in the order given (Tokens_sec may stand for Tokens/sec)."""
    from nlp_bench.errors import SpecError, unknown

    by_identifier = {_identifier(c): c for c in RESULT_COLUMNS}
    chosen = []
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        column = name if name in RESULT_COLUMNS else by_identifier.get(_identifier(name))
        if column is None:
            raise SpecError("--columns: " + unknown("column", name, RESULT_COLUMNS))
        if column not in chosen:
            chosen.append(column)
    if not chosen:
        raise SpecError("--columns: name at least one column")
    return chosen


@dataclass(frozen=True)
class ColumnChoice:
    """The columns a pretty table shows, the rows as it shows them (long ids shortened where that was needed
    to fit), the columns alike on every row (with their value, said once) and the default ones it left out."""

    shown: list[str]
    left_out: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    common: dict[str, str] = field(default_factory=dict)


def _content_width(rows: list[dict[str, Any]], column: str) -> int:
    """The narrowest a fitted column can be: its widest cell, or the longest word of its header (a fitted
    table writes a header's underscores as spaces, so Pipeline_Parallel takes two short lines)."""
    return max([*(len(w) for w in column.split("_")), *(len(format_cell(column, row.get(column))) for row in rows)])


def _fit(rows: list[dict[str, Any]], wanted: list[str], always: set[str], width: int | None) -> list[str]:
    """The columns of `wanted` that fit `width`, in its order; those in `always` whatever their width."""
    kept, used = [], EDGE
    for column in wanted:
        need = _content_width(rows, column) + CELL_EXTRA
        if width is None or column in always or used + need <= width or not kept:
            kept.append(column)
            used += need
    return kept


def _short_ids(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The rows with their run ids as unique prefixes and their point ids without the parts all share; the
    pattern of the point ids, where they were shortened."""
    runs = run_prefixes([row["run"] for row in rows if row.get("run")])
    points, pattern = shorter_ids([row["point"] for row in rows if row.get("point")])
    short = [{**row, "run": runs.get(row.get("run"), row.get("run")),
              "point": points.get(row.get("point"), row.get("point"))} for row in rows]
    return short, ({"point": pattern} if pattern else {})


def _no_experts(rows: list[dict[str, Any]]) -> tuple[str, ...]:
    """The experts' columns where no row has a model with experts: a table of dense rows neither shows nor
    names them, as before they were."""
    return () if any(row.get(MOE_COLUMNS[1]) is not None for row in rows) else MOE_COLUMNS


def fit_columns(rows: list[dict[str, Any]], width: int | None, keep: Sequence[str] = ()) -> ColumnChoice:
    """The default columns that fit `width` (None: no limit). The columns of `keep` (those --filter and
    --sort name) and the benchmark's figures always stay; then the state; then those of _IDENTITY whose
    values differ between the rows (else the point, where rows would look alike), then by PRIORITY (a
    column too wide for what is left gives way to narrower ones after it). A column alike on every row of
    two or more is said once instead (ColumnChoice.common); where not all fit, long ids are shortened
    before any column is left out. Shown in the published order."""
    hidden = {*(() if any(row.get(_PREDICTED[0]) is not None for row in rows) else _PREDICTED),
              *(() if any(row.get(_XLA[1]) is not None for row in rows) else _XLA), *_no_experts(rows)}
    candidates = list(dict.fromkeys(c for c in (*_IDENTITY, *PRIORITY) if c not in hidden))
    always = {*keep, *_FIGURES}
    common = same_on_every_row(candidates, [[format_cell(c, row.get(c)) for c in candidates] for row in rows],
                               keep=list(always))
    differ = [c for c in _IDENTITY if len({format_cell(c, row.get(c)) for row in rows}) > 1]
    if len(rows) > 1 and not differ:
        differ = ["point"]
    wanted = list(dict.fromkeys([*keep, *_FIGURES, *(["state"] if "state" not in common else []), *differ,
                                 *(c for c in PRIORITY if c not in hidden and c not in common)]))
    kept = _fit(rows, wanted, always, width)
    if width is not None and len(kept) < len(wanted):
        short, patterns = _short_ids(rows)
        rows, kept = short, _fit(short, wanted, always, width)
        common = {**common, **patterns} if "point" in kept else common
    left_out = [c for c in RESULT_COLUMNS if c not in kept and not common.get(c) and c not in _no_experts(rows)]
    return ColumnChoice([c for c in RESULT_COLUMNS if c in kept], left_out, rows, common)


def pretty(rows: list[dict[str, Any]], columns: list[str], width: int | None = None) -> str:
    """A terminal table of these columns. With a `width`, each column is as wide as its widest cell and its
    header wraps instead (underscores written as spaces); no row ever wraps, and a cell that still cannot fit
    is cut with an ellipsis. Without one, headers keep their exact names on one line."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, header_style="bold")
    for column in columns:
        justify = "right" if column in _DIGITS or column in ("Nodes", "DP") else "left"
        if width is None:
            table.add_column(column, justify=justify, no_wrap=True)
        else:
            fixed = _content_width(rows, column)
            table.add_column(column.replace("_", " "), justify=justify, min_width=fixed, max_width=fixed,
                             overflow="ellipsis")
    for row in rows:
        table.add_row(*(format_cell(c, row.get(c)) for c in columns))
    buffer = io.StringIO()
    Console(file=buffer, width=width or 100_000, force_terminal=False).print(table)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"


def render(rows: list[dict[str, Any]], fmt: str, columns: list[str] | None = None, width: int | None = None,
           wide: bool = False, keep: Sequence[str] = ()) -> str:
    """The rows in one of TABLE_FORMATS, as text. The pretty table fits `width` (see fit_columns; `keep`: the
    columns it must show) unless `wide` or `columns` say which to show, opens with a line of the values alike
    on every row and ends with one naming the columns it left out; csv, json and md keep every column
    unless `columns` picks some."""
    if fmt == "pretty":
        if columns is not None or wide:  # asked for: shown whole, however wide
            choice, width = ColumnChoice(columns or list(RESULT_COLUMNS), [], rows), None
        else:
            choice = fit_columns(rows, width, keep)
        common = {c: choice.common[c] for c in RESULT_COLUMNS if c in choice.common}
        text = common_line(common, width) + pretty(choice.rows, choice.shown, width) + _moe_basis(choice, width)
        if choice.left_out:
            note = f"left out: {', '.join(choice.left_out)} (--wide: every column; --columns A,B: these)"
            text += "\n".join(textwrap.wrap(note, width or 100_000)) + "\n"
        return text
    frame = rows_frame(rows)
    if columns is not None:
        frame = frame[columns]
    if fmt == "csv":
        return frame.to_csv(index=False)
    if fmt == "json":
        return dumps(json.loads(frame.to_json(orient="records", double_precision=15))) + "\n"
    if fmt == "md":
        return _shown(frame).to_markdown(index=False, disable_numparse=True) + "\n"
    raise ValueError(f"unknown format {fmt!r}")


def _moe_basis(choice: ColumnChoice, width: int | None) -> str:
    """Under a table that shows the MFU of a model with experts: what that MFU counts, which is not what a
    dense row's counts (every parameter); "" otherwise, so a table of dense rows reads as it always has."""
    mfu = "MFU" in choice.shown or choice.common.get("MFU")
    if not mfu or not any(row.get(MOE_COLUMNS[1]) is not None for row in choice.rows):
        return ""
    return "\n".join(textwrap.wrap(f"MFU of a row with experts (Active_Params): {flops.MOE_MFU_BASIS}",
                                   width or 100_000)) + "\n"


def _identifier(column: str) -> str:
    """A column as a name a --filter expression can use: Tokens/sec -> Tokens_sec."""
    return re.sub(r"\W", "_", column)


def select(rows: list[dict[str, Any]], sort: str | None = None, where: str | None = None) -> list[dict[str, Any]]:
    """The rows that satisfy `where` (an expression over the columns, e.g. "Nodes >= 96 and Tokens_sec > 3e4";
    a row missing a value it reads does not match), sorted by a column (`-COLUMN`: descending; empty
    values last)."""
    from nlp_bench.sweep.expr import EvaluationError

    names = {_identifier(c): c for c in RESULT_COLUMNS}
    if where:
        expression = _filter(where)
        kept = []
        for row in rows:
            try:
                if expression({n: row.get(c) for n, c in names.items()}):
                    kept.append(row)
            except EvaluationError:
                continue
        rows = kept
    if sort:
        column = _sort_column(sort)
        present = [r for r in rows if r.get(column) is not None]
        present.sort(key=lambda r: r[column], reverse=sort.startswith("-"))
        rows = present + [r for r in rows if r.get(column) is None]
    return rows


def _filter(where: str):
    """--filter's expression, its column names as identifiers (Tokens/sec as --sort and --columns take it)."""
    from nlp_bench.errors import SpecError
    from nlp_bench.sweep.expr import Expression

    names = {_identifier(c): c for c in RESULT_COLUMNS}
    for column in sorted(RESULT_COLUMNS, key=len, reverse=True):
        where = where.replace(column, _identifier(column))
    expression = Expression(where, "--filter")
    unknown = expression.names - set(names)
    if unknown:
        raise SpecError(f"--filter: unknown column {', '.join(sorted(unknown))}; columns: {', '.join(names)}")
    return expression


def _sort_column(sort: str) -> str:
    """The result column --sort names (-COLUMN: the same column, descending)."""
    from nlp_bench.errors import SpecError

    column = sort.lstrip("-")
    column = {_identifier(c): c for c in RESULT_COLUMNS}.get(_identifier(column), column)
    if column not in RESULT_COLUMNS:
        raise SpecError(f"--sort: unknown column {column!r}; columns: {', '.join(RESULT_COLUMNS)}")
    return column


def named_columns(sort: str | None, where: str | None) -> list[str]:
    """The columns --filter and --sort name, in the published order: a fitted table always shows them."""
    names = {_identifier(c): c for c in RESULT_COLUMNS}
    named = {names[n] for n in _filter(where).names} if where else set()
    if sort:
        named.add(_sort_column(sort))
    return [c for c in RESULT_COLUMNS if c in named]


EXPORTS = ("csv", "json", "md", "html", "tex", "parquet", "sqlite")
SQL_TABLE = "results"


def export(rows: list[dict[str, Any]], fmt: str, path: Path, columns: list[str] | None = None) -> None:
    """Write the rows in one of EXPORT_FORMATS but `submission`, with `columns` only where given (tex: a paper's
    columns where not); the file appears whole or not at all. What the disk or the database refuses (a full
    disk, a read-only folder) is one line naming the file: pyarrow's and sqlite's errors name none."""
    import sqlite3

    path = Path(path)
    try:
        _export(rows, fmt, path, columns)
    except (OSError, sqlite3.Error) as exc:
        reason = os_reason(exc) if isinstance(exc, OSError) else str(exc)
        raise ResultError(f"{path}: cannot write the {fmt} export: {reason}") from None


def _export(rows: list[dict[str, Any]], fmt: str, path: Path, columns: list[str] | None) -> None:
    if fmt in ("csv", "json", "md"):
        write_text_atomic(path, render(rows, fmt, columns))
        return
    frame = rows_frame(rows)
    if fmt == "tex":  # made for a paper (report.latex); every LaTeX special character escaped, headers too
        from nlp_bench.report.latex import latex_table, paper_columns, runs_of

        frame = frame[columns or paper_columns(frame)]
        write_text_atomic(path, latex_table(frame, _shown(frame), runs_of(rows)))
        return
    frame = frame if columns is None else frame[columns]
    if fmt == "html":  # a whole page a browser opens as it is
        import html

        table = _shown(frame).to_html(index=False, escape=True, border=0)
        write_text_atomic(path, _PAGE.format(title=html.escape(f"nlp-bench results: {path.stem}"), table=table))
    elif fmt in ("parquet", "sqlite"):
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            if fmt == "parquet":
                frame.to_parquet(tmp, index=False)
            else:
                import sqlite3

                with contextlib.closing(sqlite3.connect(tmp)) as db:
                    frame.to_sql(SQL_TABLE, db, index=False)
                    db.commit()
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    else:
        raise ValueError(f"unknown export format {fmt!r}")


def read_export(path: Path, fmt: str):
    """An exported table read back into the DataFrame it was written from (csv, json, parquet, sqlite)."""
    import pandas as pd

    from nlp_bench.analysis.results import typed

    path = Path(path)
    if fmt == "csv":
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
    elif fmt == "json":
        frame = pd.DataFrame(json.loads(path.read_text()))
    elif fmt == "parquet":
        frame = pd.read_parquet(path)
    elif fmt == "sqlite":
        import sqlite3

        with contextlib.closing(sqlite3.connect(path)) as db:
            frame = pd.read_sql(f"SELECT * FROM {SQL_TABLE}", db)
    else:
        raise ValueError(f"cannot read {fmt!r} back")
    return typed(frame)
