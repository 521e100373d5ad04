"""Render result rows as a terminal table or as CSV, JSON or Markdown files."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
from pathlib import Path
from typing import Any

from nlp_bench.analysis.results import COLUMNS, rows_frame
from nlp_bench.fsio import write_text_atomic

FORMATS = ("pretty", "csv", "json", "md")
#: Digits shown per column; the files keep full precision except where rounding is the published form.
_DIGITS = {"Avg_TFLOPs/GPU": 2, "Tokens/sec": 2, "time_to_report_in_seconds": 2, "MFU": 4, "Job_Time": 0}


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
        for column in COLUMNS:
            table.add_column(column, justify="right" if column in _DIGITS or column in ("Nodes", "DP") else "left",
                             overflow="fold")
        for row in rows:
            table.add_row(*(format_cell(c, row.get(c)) for c in COLUMNS))
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
