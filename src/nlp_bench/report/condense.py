"""What a table can give up before it gives up a figure: the columns whose value is the same on every row
(said once, on a line of their own, instead of once a row) and the parts of long ids that every row shares.
The result table, `bench status` and `bench result compare` condense their rows this way before they fit
the terminal's width."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

#: what a cell holds where there is no value
EMPTY = ("-", "")
#: the shortest prefix of a run id shown: its date and time to the second (`bench` takes any unique prefix)
RUN_PREFIX = len("20260101-000000")


def same_on_every_row(headers: Sequence[str], rows: Sequence[Sequence[str]],
                      keep: Sequence[str] = ()) -> dict[str, str]:
    """Column -> its one value, for the columns (but those in `keep`) whose cells are alike on every row of
    two or more; "" for a column empty on every row. One row has nothing to be alike with: none."""
    if len(rows) < 2:
        return {}
    common = {}
    for i, header in enumerate(headers):
        values = {row[i] for row in rows}
        if header not in keep and len(values) == 1:
            (value,) = values
            common[header] = "" if value in EMPTY else value
    return common


def common_line(common: dict[str, str], width: int | None) -> str:
    """The columns left out for being alike on every row, with their value (empty ones are not named here:
    the line of what was left out names them), folded to the width; "" where there is none."""
    said = ", ".join(f"{name}={value}" for name, value in common.items() if value)
    if not said:
        return ""
    return "\n".join(textwrap.wrap(f"same on every row: {said}", width or 100_000, break_on_hyphens=False)) + "\n"


def shorter_ids(ids: Sequence[str], sep: str = "_") -> tuple[dict[str, str], str | None]:
    """Each id without the `sep`-separated parts every id shares (a point id keeps what tells it apart:
    `n8_tp2_gas32` of `gpt-13b_n8_tp2_pp4_mbs1_gas32`), and the pattern they share, `*` where the kept
    parts go (`gpt-13b_*_*_pp4_mbs1_*`). Ids of as many parts compare part by part, others by their
    shared first and last parts; where nothing is shared (or every id is the same): the ids as they are
    and no pattern."""
    distinct = list(dict.fromkeys(ids))
    parts = [i.split(sep) for i in distinct]
    if len(distinct) < 2:
        return {i: i for i in distinct}, None
    if len({len(p) for p in parts}) == 1:
        varies = [len({p[k] for p in parts}) > 1 for k in range(len(parts[0]))]
        if all(varies):
            return {i: i for i in distinct}, None
        short = {i: sep.join(x for x, v in zip(p, varies, strict=True) if v) for i, p in zip(distinct, parts, strict=True)}
        pattern = sep.join("*" if v else x for x, v in zip(parts[0], varies, strict=True))
        return short, pattern
    shortest = min(len(p) for p in parts)
    lead = next((k for k in range(shortest) if len({p[k] for p in parts}) > 1), shortest)
    trail = next((k for k in range(shortest - lead) if len({p[-1 - k] for p in parts}) > 1), shortest - lead)
    if lead == trail == 0:
        return {i: i for i in distinct}, None
    short = {i: sep.join(p[lead:len(p) - trail]) or i for i, p in zip(distinct, parts, strict=True)}
    return short, sep.join([*parts[0][:lead], "*", *parts[0][len(parts[0]) - trail:]])


def run_prefixes(ids: Sequence[str], minimum: int = RUN_PREFIX) -> dict[str, str]:
    """Each run id as its shortest prefix that no other of `ids` starts with (at least `minimum`
    characters): still a run id `bench` takes."""
    distinct = list(dict.fromkeys(ids))
    short = {}
    for run in distinct:
        length = minimum
        while length < len(run) and any(o != run and o.startswith(run[:length]) for o in distinct):
            length += 1
        short[run] = run[:length]
    return short
