"""Launch settings of the Triton norm kernels, kept apart from the kernels so that they can be read and
overridden (NLP_BENCH_NORM_LAUNCH, `benchmark/perf/kernels.py --norm-launch`) without importing Triton.

The best settings depend on the GPU and the row width, so benchmark/perf/norm_launch.py times the
alternatives on a GPU and prints them in the form `override` takes; norm_registers.py shows their
register use without one.
"""

from __future__ import annotations

import re

NORM_LAUNCH_ENV = "NLP_BENCH_NORM_LAUNCH"

#: warps per program (None: by block width), rows per tile and, for the persistent launches, programs per
#: multiprocessor. fused_backward_max: the widest row whose backward is one kernel with the
#: parameter-gradient sums in registers; wider rows take dx and a tiled parameter-gradient kernel apart
#: (faster above 8192 on an H100). forward_chunk/backward_chunk: rows wider than this many columns (a
#: power of two; 0: none) are read in chunks, twice, by the chunked kernels (the backward's only where it
#: is split). forward_prefetch/backward_prefetch: persistent whole-row programs load their next tile
#: before reducing the current one. param_*: the split backward's parameter-gradient kernel, each program
#: summing param_rows rows (at least one tile) of a param_cols-wide column block in [param_tile x
#: param_cols] tiles, with param_warps warps (0: 4)
LAUNCH: dict[str, int | bool | None] = {
    "forward_warps": None, "backward_warps": None, "forward_per_processor": 4, "backward_per_processor": 4,
    "forward_rows": 1, "backward_rows": 1, "forward_chunk": 0, "backward_chunk": 0,
    "forward_prefetch": False, "backward_prefetch": False, "fused_backward_max": 8192,
    "param_rows": 256, "param_tile": 32, "param_cols": 128, "param_warps": None}
#: overrides of LAUNCH for rows up to a width, {width: {key: value}}: the smallest width at or above a row's
#: applies (for settings that differ between narrow and wide rows)
LAUNCH_BY_WIDTH: dict[int, dict] = {}


def _power_of_two(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


#: what each key accepts (by its last word), for the error a bad override gets
_RULES = {"warps": ("a power of two (0: the default for the block)", lambda v: v == 0 or _power_of_two(v)),
          "rows": ("a power of two", _power_of_two),
          "tile": ("a power of two", _power_of_two),
          "cols": ("a power of two of at least 16", lambda v: v >= 16 and _power_of_two(v)),
          "chunk": ("a power of two (0: whole rows)", lambda v: v == 0 or _power_of_two(v)),
          "prefetch": ("0 or 1", lambda v: v in (0, 1)),
          "processor": ("at least 1", lambda v: v >= 1),
          "max": ("a width", lambda v: True)}


def settings(width: int) -> dict:
    """The launch settings for rows of this width: LAUNCH with the narrowest LAUNCH_BY_WIDTH entry that covers it."""
    bounds = [bound for bound in LAUNCH_BY_WIDTH if width <= bound]
    return {**LAUNCH, **LAUNCH_BY_WIDTH[min(bounds)]} if bounds else LAUNCH


def parse_launch_settings(text: str) -> list[tuple[int | None, str, int | bool | None]]:
    """(width or None, key, value) for each item of "[WIDTH:]KEY=INTEGER,...", checked against LAUNCH's keys
    (ValueError with the offending item otherwise). A warps count of 0 means the default for the block."""
    out = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = re.fullmatch(r"(?:([0-9]+):)?(\w+)=([0-9]+)", item)
        if not match or match[2] not in LAUNCH or match[1] is not None and int(match[1]) == 0:
            raise ValueError(f"{item!r} is not [WIDTH:]KEY=INTEGER with KEY one of {', '.join(LAUNCH)}")
        width, key, number = match[1], match[2], int(match[3])
        rule, holds = _RULES[key.rpartition("_")[2]]
        if not holds(number):
            raise ValueError(f"{item!r}: {key} must be {rule}")
        if key.endswith("_prefetch"):
            number = bool(number)
        out.append((int(width) if width else None, key, None if key.endswith("_warps") and not number else number))
    return out


def override(text: str) -> None:
    """Apply "[WIDTH:]KEY=INTEGER,..." to LAUNCH (no width) or LAUNCH_BY_WIDTH; nothing changes if any item is bad."""
    for width, key, value in parse_launch_settings(text):
        (LAUNCH if width is None else LAUNCH_BY_WIDTH.setdefault(width, {}))[key] = value
