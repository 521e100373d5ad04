"""What a site can run: the system profiles (`bench system list`) and the benchmark's tags (`bench tag list`),
so that their names are found where they are listed, not only in the error that refuses a wrong one."""

from __future__ import annotations

import textwrap
from typing import Any

from nlp_bench.errors import BenchError
from nlp_bench.spec.benchmark import Benchmark
from nlp_bench.spec.systems import known_systems, load_system

SYSTEM_COLUMNS = ("system", "scheduler", "launcher", "peak TFLOP/s", "partition", "devices/node")
TAG_COLUMNS = ("tag", "model", "system", "nodes", "layout", "what it is for")
#: the columns whose figures are right-aligned
_FIGURES = {"peak TFLOP/s", "nodes"}
#: between two columns; under its row, the last column's indent; the least room the last column takes beside them
_GAP, _INDENT, _ROOM = "  ", "    ", 18


def system_rows() -> tuple[list[dict[str, Any]], list[str]]:
    """One row per profile of slurm/systems/, and one line for each that cannot be read (listed anyway, so
    that one broken site profile does not hide the others)."""
    rows, problems = [], []
    for name in known_systems():
        try:
            system = load_system(name)
        except BenchError as exc:
            rows.append({"system": name, "scheduler": "(cannot be read)"})
            problems.append(str(exc))
            continue
        peak = "" if system.peak_tflops is None else f"{system.peak_tflops:g} {system.peak_precision}"
        rows.append({"system": name, "scheduler": system.executor, "launcher": system.launcher,
                     "devices/node": f"{system.devices_per_node} x {system.device_name or system.device}",
                     "peak TFLOP/s": peak, "partition": system.partition})
    return rows, problems


def tag_rows(benchmark: Benchmark) -> list[dict[str, Any]]:
    """One row per tag of the benchmark, with the layout it fixes on its own system."""
    rows = []
    for name, spec in benchmark.tags.items():
        layout = " ".join(f"{key} {spec.get(key, 1)}" for key in ("tp", "pp", "mbs", "gas"))
        others = ", ".join(spec.get("systems") or {})
        about = " ".join(str(spec.get("description", "")).split())
        rows.append({"tag": name, "model": spec["model"], "system": spec["system"], "nodes": spec["nodes"],
                     "layout": layout, "what it is for": about + (f" (own layouts on: {others})" if others else "")})
    return rows


def catalog_table(rows: list[dict[str, Any]], columns: tuple[str, ...], width: int | None) -> str:
    """The rows as a table that fits `width` (None: any width, for a file or a pipe): every column but the last
    as wide as its widest cell, two spaces apart; the last wraps beside them where 18 characters are left
    for it, else under its row, indented."""
    cells = [[str(row.get(c, "") or "-") for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns[:-1])]

    def lead(values: list[str]) -> str:
        return "".join((v.rjust(w) if c in _FIGURES else v.ljust(w)) + _GAP
                       for c, v, w in zip(columns, values, widths, strict=False))

    room = None if width is None else width - sum(widths) - len(_GAP) * len(widths)
    beside = room is None or room >= _ROOM
    lines = [lead(list(columns[:-1])) + (columns[-1] if beside else "")]
    lines.append("-" * (len(lines[0]) if beside else len(lines[0].rstrip())))
    for row in cells:
        if room is None:
            lines.append(lead(row) + row[-1])
        elif beside:
            parts = textwrap.wrap(row[-1], room, break_on_hyphens=False) or [""]
            lines += [lead(row) + parts[0], *(" " * (width - room) + part for part in parts[1:])]
        else:
            lines.append(lead(row))
            lines += textwrap.wrap(row[-1], width, initial_indent=_INDENT, subsequent_indent=_INDENT,
                                   break_on_hyphens=False)
    return "\n".join(line.rstrip() for line in lines) + "\n"
