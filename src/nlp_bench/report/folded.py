"""Plain-text tables that keep their figures at any width: where the columns do not fit, headers go on two
lines first, then the columns equal in every row are said once in a line above the table, and only then are
the least needed columns left out, named in a line below. `bench plan` and `bench plan validate` print
through it; without a width (a file, a pipe) every column is shown."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from tabulate import tabulate

from nlp_bench.report.fit import wrap

#: the spaces between two columns
_GAP = 2


@dataclass(frozen=True)
class Columns:
    """What a table may do to its columns to fit a width."""

    #: the columns whose cells are numbers, right-aligned
    right: Collection[str] = ()
    #: the columns never folded into the line of equal values nor left out: the figures
    kept: Collection[str] = ()
    #: the columns left out when folding is not enough, first the least needed
    least_needed: Sequence[str] = ()
    #: headers on two lines ("GiB/\ndevice") where the cells are narrower than the header
    narrow: Mapping[str, str] = field(default_factory=dict)
    #: where every column can be had, said after the columns left out
    hint: str = ""


def _width(headers: Sequence[str], rows: list[list[str]], shown: Sequence[str], names: Mapping[str, str]) -> int:
    index = {h: i for i, h in enumerate(headers)}
    cells = [max([*map(len, names[h].split("\n")), *(len(row[index[h]]) for row in rows)]) for h in shown]
    return sum(cells) + _GAP * (len(cells) - 1)


def folded(headers: Sequence[str], rows: list[list], width: int | None, columns: Columns) -> str:
    """The table in `width` columns (every column without one), with the lines that say what was folded or
    left out."""
    rows = [[str(cell) for cell in row] for row in rows]
    shown, names, same, left_out = list(headers), {h: h for h in headers}, [], []
    if width is not None and _width(headers, rows, shown, names) > width:
        names.update(columns.narrow)
    if width is not None and rows and _width(headers, rows, shown, names) > width:
        same = [h for i, h in enumerate(headers) if h not in columns.kept and len({row[i] for row in rows}) == 1]
        shown = [h for h in shown if h not in same]
    for header in columns.least_needed:
        if width is None or _width(headers, rows, shown, names) <= width:
            break
        if header in shown:
            shown.remove(header)
            left_out.append(header)
    out = ""
    if same:
        every = "in every row" if len(rows) > 1 else "the row"
        out += wrap(f"{every}: " + ", ".join(f"{h} {rows[0][headers.index(h)]}" for h in same), width) + "\n"
    out += _render(headers, rows, shown, names, columns.right) + "\n"
    if left_out:
        out += wrap(f"left out for the width: {', '.join(left_out)}" + (f" ({columns.hint})" if columns.hint else ""),
                    width) + "\n"
    return out


def _render(headers: Sequence[str], rows: list[list[str]], shown: Sequence[str], names: Mapping[str, str],
            right: Collection[str]) -> str:
    """The shown columns under their headers (a header's lines end on the same line) and a rule of dashes."""
    index = [headers.index(h) for h in shown]
    head = [names[h].split("\n") for h in shown]
    lines = max(len(h) for h in head)
    head = [[""] * (lines - len(h)) + h for h in head]
    body = [[row[i] for i in index] for row in rows]
    widths = [max([*map(len, h), *(len(row[k]) for row in body)]) for k, h in enumerate(head)]
    table = [*([h[n] for h in head] for n in range(lines)), ["-" * w for w in widths], *body]
    text = tabulate(table, tablefmt="plain", disable_numparse=True,
                    colalign=["right" if h in right else "left" for h in shown])
    return "\n".join(line.rstrip() for line in text.splitlines())
