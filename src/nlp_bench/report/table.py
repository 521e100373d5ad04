"""Render result rows as a terminal table or as CSV, JSON or Markdown files."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
from pathlib import Path
from typing import Any

from nlp_bench.analysis.results import COLUMNS, rows_frame
from nlp_bench.fsio import write_text_atomic

FORMATS = ("pretty", "csv", "json", "md")
#: Digits shown per column; the files keep full precision except where rounding is the published form.
_DIGITS = {"Avg_TFLOPs/GPU": 2, "Tokens/sec": 2, "time_to_report_in_seconds": 2, "MFU": 4, "Job_Time": 0,
           "Predicted_Tokens/sec": 2, "Predicted/Measured": 3}
#: shown in the pretty table only when some row has a prediction (most runs of a CPU system have none)
_PREDICTED = ("Predicted_Tokens/sec", "Predicted/Measured")


def format_cell(column: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if column in _DIGITS and isinstance(value, (int, float)):
        return f"{value:.{_DIGITS[column]}f}"
    return str(value)


def render(rows: list[dict[str, Any]], fmt: str) -> str:
    """The rows in one of FORMATS, as text."""
    if fmt == "pretty":
        from rich import box
        from rich.console import Console
        from rich.table import Table

        table = Table(box=box.SIMPLE_HEAD, header_style="bold")
        predicted = any(row.get(_PREDICTED[0]) is not None for row in rows)
        columns = [c for c in COLUMNS if predicted or c not in _PREDICTED]
        for column in columns:
            table.add_column(column, justify="right" if column in _DIGITS or column in ("Nodes", "DP") else "left",
                             overflow="fold")
        for row in rows:
            table.add_row(*(format_cell(c, row.get(c)) for c in columns))
        buffer = io.StringIO()
        # wide enough that no cell wraps: the table is read, copied and grepped, not just looked at
        Console(file=buffer, width=1000, force_terminal=False).print(table)
        return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"
    frame = rows_frame(rows)
    if fmt == "csv":
        return frame.to_csv(index=False)
    if fmt == "json":
        return json.dumps(json.loads(frame.to_json(orient="records", double_precision=15)), indent=2) + "\n"
    if fmt == "md":
        plain = frame.astype(object).where(frame.notna(), None)
        shown = plain.apply(lambda col: col.map(lambda v, c=col.name: format_cell(c, v)))
        return shown.to_markdown(index=False, disable_numparse=True) + "\n"
    raise ValueError(f"unknown format {fmt!r}")


def _identifier(column: str) -> str:
    """A column as a name a --filter expression can use: Tokens/sec -> Tokens_sec."""
    return re.sub(r"\W", "_", column)


def select(rows: list[dict[str, Any]], sort: str | None = None, where: str | None = None) -> list[dict[str, Any]]:
    """The rows that satisfy `where` (an expression over the columns, e.g. "Nodes >= 96 and Tokens_sec > 3e4";
    a row missing a value it reads does not match), sorted by a column (`-COLUMN`: descending; empty
    values last)."""
    from nlp_bench.errors import SpecError
    from nlp_bench.sweep.expr import EvaluationError, Expression

    names = {_identifier(c): c for c in COLUMNS}
    if where:
        expression = Expression(where, "--filter")
        unknown = expression.names - set(names)
        if unknown:
            raise SpecError(f"--filter: unknown column {', '.join(sorted(unknown))}; columns: {', '.join(names)}")
        kept = []
        for row in rows:
            try:
                if expression({n: row.get(c) for n, c in names.items()}):
                    kept.append(row)
            except EvaluationError:
                continue
        rows = kept
    if sort:
        column = sort.lstrip("-")
        column = names.get(_identifier(column), column)
        if column not in COLUMNS:
            raise SpecError(f"--sort: unknown column {column!r}; columns: {', '.join(COLUMNS)}")
        present = [r for r in rows if r.get(column) is not None]
        present.sort(key=lambda r: r[column], reverse=sort.startswith("-"))
        rows = present + [r for r in rows if r.get(column) is None]
    return rows


EXPORTS = ("csv", "json", "md", "html", "tex", "parquet", "sqlite")
SQL_TABLE = "results"


def export(rows: list[dict[str, Any]], fmt: str, path: Path) -> None:
    """Write the rows in one of EXPORTS; the file appears whole or not at all."""
    path = Path(path)
    if fmt in ("csv", "json", "md"):
        write_text_atomic(path, render(rows, fmt))
        return
    frame = rows_frame(rows)
    if fmt == "html":
        write_text_atomic(path, frame.to_html(index=False, na_rep="-"))
    elif fmt == "tex":
        write_text_atomic(path, frame.to_latex(index=False, na_rep="-"))
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
