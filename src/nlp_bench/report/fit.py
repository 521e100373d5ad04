"""Plain-text tables that fit a terminal: the columns kept by how much a reader needs them, those whose values
differ between the rows kept first (they are what tells the rows apart), and a last line naming what was left
out. `bench plan` and `bench result compare` print through it; the result table does the same with rich."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from tabulate import tabulate

#: what tabulate's "simple" format adds to a column's widest cell: two spaces of padding (with headers) and
#: two between columns
_GAP = 4


def varying(headers: list[str], rows: list[list[str]]) -> list[str]:
    """The columns whose values are not the same in every row."""
    return [h for i, h in enumerate(headers) if len({row[i] for row in rows}) > 1]


def choose_columns(headers: list[str], rows: list[list[str]], width: int | None, wanted: Sequence[str],
                   identity: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """(the columns shown, in table order; those left out). `wanted`: the columns, most needed first;
    `identity`: columns that tell rows apart, kept first where their values differ."""
    if width is None:
        return list(headers), []
    size = {h: max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(headers)}
    first = [h for h in identity if h in varying(headers, rows)]
    kept: list[str] = []
    used = -_GAP
    for header in [*first, *(h for h in wanted if h not in first)]:
        need = size[header] + _GAP
        if used + need <= width or not kept:
            kept.append(header)
            used += need
    return [h for h in headers if h in kept], [h for h in headers if h not in kept]


def fitted(headers: list[str], rows: list[list[str]], width: int | None, wanted: Sequence[str],
           identity: Sequence[str] = (), fmt: str = "simple") -> str:
    """The table (tabulate's `fmt`) of the columns that fit `width`, and a line naming those left out."""
    rows = [[str(cell) for cell in row] for row in rows]
    shown, left_out = choose_columns(headers, rows, width, wanted, identity)
    while True:  # the estimate of tabulate's padding can be a character short: measure, drop one more if so
        index = [headers.index(h) for h in shown]
        text = tabulate([[row[i] for i in index] for row in rows], headers=shown, tablefmt=fmt, disable_numparse=True)
        if width is None or len(shown) == 1 or max(len(line) for line in text.splitlines()) <= width:
            break
        last = next(h for h in reversed([*identity, *wanted]) if h in shown)
        shown.remove(last)
        left_out = [h for h in headers if h not in shown]
    if left_out:
        text += "\n" + wrap(f"left out for the width: {', '.join(left_out)} (--format csv or json: every column)",
                            width)
    return text + "\n"


def wrap(text: str, width: int | None) -> str:
    """A line of prose folded to the width (as it is, without one)."""
    return "\n".join(textwrap.wrap(text, width, break_on_hyphens=False)) if width else text
