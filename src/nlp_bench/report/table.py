"""Render result rows as a terminal table or as CSV, JSON or Markdown files."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

from nlp_bench.analysis.results import COLUMNS, rows_frame
from nlp_bench.fsio import write_text_atomic

FORMATS = ("pretty", "csv", "json", "md")
#: Digits shown per column; the files keep full precision except where rounding is the published form.
_DIGITS = {"Avg_TFLOPs/GPU": 2, "Tokens/sec": 2, "time_to_report_in_seconds": 2, "MFU": 4, "Job_Time": 0}


def _shown(column: str, value: Any) -> str:
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
            table.add_row(*(_shown(c, row.get(c)) for c in COLUMNS))
        buffer = io.StringIO()
        # wide enough that no cell wraps: the table is read, copied and grepped, not just looked at
        Console(file=buffer, width=1000, force_terminal=False).print(table)
        return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"
    frame = rows_frame(rows)
    if fmt == "csv":
        return frame.to_csv(index=False)
    if fmt == "json":
        return json.dumps(json.loads(frame.to_json(orient="records")), indent=2) + "\n"
    if fmt == "md":
        shown = frame.apply(lambda col: col.map(lambda v, c=col.name: _shown(c, v)))
        return shown.to_markdown(index=False, disable_numparse=True) + "\n"
    raise ValueError(f"unknown format {fmt!r}")


def export(rows: list[dict[str, Any]], fmt: str, path: Path) -> None:
    write_text_atomic(Path(path), render(rows, fmt))
