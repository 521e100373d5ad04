"""`bench result report`: one self-contained HTML file (figures embedded) with the result table, the
comparison with the reference, the figures and every point's provenance, to attach to a submission."""

from __future__ import annotations

import base64
import json
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from nlp_bench import __version__, flops
from nlp_bench.analysis.metrics import warmup_decided
from nlp_bench.analysis.reference import compare
from nlp_bench.analysis.results import MOE_COLUMNS, RESULT_COLUMNS
from nlp_bench.errors import ResultError
from nlp_bench.fsio import write_text_atomic
from nlp_bench.report import compare as comparison_table
from nlp_bench.report.figures import figure_text
from nlp_bench.report.headline import headline
from nlp_bench.report.html_columns import table_columns
from nlp_bench.report.table import format_cell
from nlp_bench.words import counted

_TEXT = {"system", "version", "queue", "JobID", "state", "failure_class", "run", "point", "reference", "model"}
#: headers written short (the whole name on hover), as point ids and `bench run` write them: the room goes to
#: the figures and the ids instead
_SHORT = {"Tensor_Parallel": "TP", "Pipeline_Parallel": "PP"}


def _breakable(name: str):
    """A column name or an id that may break after its underscores, slashes and dots, so narrow headers and
    long run and point ids wrap instead of widening the table."""
    from markupsafe import Markup, escape

    return Markup(str(escape(name)).replace("_", "_<wbr>").replace("/", "/<wbr>").replace(".", ".<wbr>"))


def _bases(results: dict[tuple[str, str], dict]) -> tuple[list[str], list[str]]:
    """What every MFU in the report divides by (or why a point has none), and where its energy comes from."""
    mfu, energy = set(), set()
    for result in results.values():
        summary = result.get("summary") or {}
        basis = summary.get("mfu_basis")
        if basis:
            runs = basis.get("run_precision") or basis["precision"]
            mfu.add(f"{basis['device']}: {basis['peak_tflops']} TFLOP/s dense {basis['precision']} per device "
                    f"({basis['source']}) for {runs} runs" + (f" ({basis['peak_note']})" if basis.get("peak_note") else ""))
        elif summary.get("mfu_note"):
            mfu.add(summary["mfu_note"])
        found = result.get("energy") or {}
        if found.get("source") or found.get("reason"):
            energy.add(found.get("source") or f"none ({found['reason']})")
    return sorted(mfu), sorted(energy)


def _with_experts(rows: list[dict[str, Any]]) -> list[str]:
    """The points whose model has experts (their MFU counts the active parameters only)."""
    return [row["point"] for row in rows if row.get(MOE_COLUMNS[1]) is not None]


def _steady_rows(results: dict[tuple[str, str], dict]) -> list[dict[str, Any]]:
    def num(value: float | None) -> str:
        return figure_text("tokens_per_s", value)

    out = []
    for (_, point), result in results.items():
        summary = result.get("steady")
        if not summary:
            continue
        tokens = summary.get("tokens_per_s") or {}
        ci = tokens.get("ci95")
        out.append({"point": point, "intervals": summary["intervals"],
                    "warmup": summary["warmup_excluded"] if warmup_decided(summary["intervals"]) else "undecided",
                    "mean": num(tokens.get("mean")), "median": num(tokens.get("median")), "std": num(tokens.get("std")),
                    "ci": f"{num(ci[0])} .. {num(ci[1])}" if ci else "-",
                    "report": figure_text("time_to_report_s", summary.get("time_to_report_s"))})
    return out


def write_report(path: Path, title: str, rows: list[dict[str, Any]], results: dict[tuple[str, str], dict],
                 references: list[dict[str, Any]], reference_name: str) -> None:
    """results: each point's analysed result.json, by (run, point)."""
    import jinja2

    from nlp_bench.report.plots import plot_all

    try:
        comparison = compare(rows, references)
    except ResultError:
        comparison = []
    figures = []
    if comparison:
        with tempfile.TemporaryDirectory() as tmp:
            records = {key: result.get("records") or [] for key, result in results.items()}
            for figure in plot_all(rows, records, Path(tmp), references, formats=("png",)):
                figures.append((figure.stem, base64.b64encode(figure.read_bytes()).decode("ascii")))
    env = jinja2.Environment(loader=jinja2.PackageLoader("nlp_bench.report", "templates"),
                             autoescape=True, trim_blocks=True, lstrip_blocks=True)
    env.filters["breakable"] = _breakable
    env.filters["counted"] = counted
    unmatched = sorted({row["model"] for row in comparison if row["reference"] is None})
    comparison = [row for row in comparison if row["reference"] is not None]
    cells = [{c: format_cell(c, r.get(c)) for c in RESULT_COLUMNS} for r in rows]
    html = env.get_template("report.html.j2").render(
        title=title, headline=headline(rows, results), bases=_bases(results),
        mfu_formula=flops.FORMULAS[flops.MEGATRON_MODEL], moe_points=_with_experts(rows),
        moe_formula=flops.MOE_FORMULA, moe_basis=flops.MOE_MFU_BASIS, generated=datetime.now(timezone.utc).isoformat(timespec="seconds"), version=__version__,
        table=table_columns(cells), rows=cells, text_columns=_TEXT, unmatched=unmatched, short=_SHORT,
        comparison_columns=comparison_table.COMPARISON_COLUMNS,
        comparison=[{c: comparison_table.comparison_cell(c, r[c]) for c in comparison_table.COMPARISON_COLUMNS} for r in comparison],
        reference_name=reference_name, figures=figures, steady=_steady_rows(results),
        provenance=[(f"{run} / {point}", json.dumps(result["provenance"], indent=2, sort_keys=True))
                    for (run, point), result in results.items() if result.get("provenance")],
    )
    write_text_atomic(Path(path), html)
