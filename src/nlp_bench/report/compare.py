"""`bench result compare`: measured rows beside the reference, as a table or a file format."""

from __future__ import annotations

import json
from typing import Any

COLUMNS = ["point", "system", "Nodes", "Tensor_Parallel", "Pipeline_Parallel", "MBS", "GAS", "Tokens/sec",
           "time_to_report_in_seconds", "verdict", "reference", "ref_Tokens/sec", "ratio", "ratio_per_device"]
_DIGITS = {"Tokens/sec": 2, "time_to_report_in_seconds": 2, "ref_Tokens/sec": 2, "ratio": 3, "ratio_per_device": 3,
           "builtin_Tokens/sec": 2, "megatron-lm_Tokens/sec": 2, "builtin/megatron-lm": 3}


def format_cell(column: str, value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.{_DIGITS[column]}f}" if column in _DIGITS else str(value)


def render_comparison(rows: list[dict[str, Any]], fmt: str, columns: list[str] = COLUMNS) -> str:
    if fmt == "json":
        return json.dumps([{c: r[c] for c in columns} for r in rows], indent=2) + "\n"
    import pandas as pd

    frame = pd.DataFrame(rows, columns=columns)
    if fmt == "csv":
        return frame.to_csv(index=False)
    from tabulate import tabulate

    shown = [[format_cell(c, r[c]) for c in columns] for r in rows]
    style = "github" if fmt == "md" else "simple"
    return tabulate(shown, headers=columns, tablefmt=style, disable_numparse=True) + "\n"
