"""`bench result compare`: measured rows beside the reference, as a table or a file format."""

from __future__ import annotations

from typing import Any

from nlp_bench.fsio import dumps
from nlp_bench.report.condense import common_line, same_on_every_row, shorter_ids
from nlp_bench.report.fit import choose_columns, fitted

COMPARISON_COLUMNS = ["point", "system", "Nodes", "Tensor_Parallel", "Pipeline_Parallel", "MBS", "GAS", "Tokens/sec",
           "time_to_report_in_seconds", "verdict", "reference", "ref_Tokens/sec", "ratio", "ratio_per_device"]
_DIGITS = {"Tokens/sec": 2, "time_to_report_in_seconds": 2, "ref_Tokens/sec": 2, "ratio": 3, "ratio_per_device": 3,
           "builtin_Tokens/sec": 2, "megatron-lm_Tokens/sec": 2, "builtin/megatron-lm": 3}


def comparison_cell(column: str, value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.{_DIGITS[column]}f}" if column in _DIGITS else str(value)


#: what a narrow terminal keeps, most needed first: the point, the figures and the verdict
_WANTED = ["point", "model", "Tokens/sec", "time_to_report_in_seconds", "ratio", "verdict", "builtin/megatron-lm",
           "builtin_Tokens/sec", "megatron-lm_Tokens/sec", "ratio_per_device", "reference", "ref_Tokens/sec",
           "system", "Nodes", "Tensor_Parallel", "Pipeline_Parallel", "MBS", "GAS"]
#: what tells the rows apart where their values differ: the point, which names its layout, else the layout
_IDENTITY = ["system", "Nodes", "Tensor_Parallel", "Pipeline_Parallel", "MBS", "GAS"]
#: the figures: kept as columns even where alike on every row
_FIGURES = ("Tokens/sec", "time_to_report_in_seconds", "builtin_Tokens/sec", "megatron-lm_Tokens/sec")


def render_comparison(rows: list[dict[str, Any]], fmt: str, columns: list[str] = COMPARISON_COLUMNS,
                      width: int | None = None) -> str:
    """The comparison in `fmt`; the pretty table keeps the columns that fit `width`."""
    if fmt == "json":
        return dumps([{c: r[c] for c in columns} for r in rows]) + "\n"
    import pandas as pd

    frame = pd.DataFrame(rows, columns=columns)
    if fmt == "csv":
        return frame.to_csv(index=False)
    from tabulate import tabulate

    shown = [[comparison_cell(c, r[c]) for c in columns] for r in rows]
    if fmt == "md":
        return tabulate(shown, headers=columns, tablefmt="github", disable_numparse=True) + "\n"
    identity = ["point"] if "point" in columns else _IDENTITY
    return condensed(columns, shown, width, [c for c in _WANTED if c in columns], [c for c in identity if c in columns])


def condensed(headers: list[str], rows: list[list[str]], width: int | None, wanted: list[str],
              identity: list[str]) -> str:
    """fitted()'s table of the columns not alike on every row (those are said once, above it; the figures
    stay), the point ids shortened to what tells them apart where not every column fits."""
    common = same_on_every_row(headers, rows, keep=("point", *_FIGURES))
    index = [i for i, h in enumerate(headers) if h not in common]
    headers, rows = [headers[i] for i in index], [[row[i] for i in index] for row in rows]
    wanted, identity = [c for c in wanted if c in headers], [c for c in identity if c in headers]
    said = dict(common)
    if "point" in headers and choose_columns(headers, rows, width, wanted, identity)[1]:
        at = headers.index("point")
        short, pattern = shorter_ids([row[at] for row in rows])
        rows = [[short[cell] if i == at else cell for i, cell in enumerate(row)] for row in rows]
        said = {"point": pattern, **said} if pattern else said
    return common_line(said, width) + fitted(headers, rows, width, wanted, identity)


def render_changes(changes: list, fmt: str, width: int | None = None) -> str:
    """`compare baseline`: the ratio per point with its interval, and under each change beyond the noise
    what differs in its provenance."""
    if fmt == "json":
        return dumps([c.to_dict() for c in changes]) + "\n"

    def number(value, digits):
        return "-" if value is None else f"{value:,.{digits}f}"

    # the steady state's figure (warm-up excluded), not the table's Tokens/sec (JUBE's, every interval)
    columns = ["point", "steady tokens/s", "baseline steady tokens/s", "ratio", "95% CI", "verdict"]
    rows = [[c.point, number(c.tokens_per_s, 2), number(c.baseline_tokens_per_s, 2), number(c.ratio, 3),
             f"{c.ci95[0]:.3f} .. {c.ci95[1]:.3f}" if c.ci95 else "-", c.verdict] for c in changes]
    if fmt == "csv":
        import pandas as pd

        return pd.DataFrame(rows, columns=columns).to_csv(index=False)
    from tabulate import tabulate

    if fmt == "md":
        text = tabulate(rows, headers=columns, tablefmt="github", disable_numparse=True) + "\n"
    else:
        text = condensed(columns, rows, width, ["point", "ratio", "verdict", "95% CI", "steady tokens/s",
                                                "baseline steady tokens/s"], ["point"])
    for change in changes:
        if change.differences:
            text += f"\n{change.point}: {change.verdict} ({change.ratio:.3f}x); differs from the baseline in:\n"
            text += "".join(f"  {line}\n" for line in change.differences)
    return text
