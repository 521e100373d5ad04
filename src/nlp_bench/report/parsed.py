"""`bench parse` for people: the records as a table and the summary in words, each figure named."""

from __future__ import annotations

import textwrap
from typing import Any

from nlp_bench.analysis.metrics import warmup_decided
from nlp_bench.report.figures import figure_text


def _num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def render_parsed(fmt: str, records: list[dict], summary: dict) -> str:
    from tabulate import tabulate

    rows = [[r["iteration"], _num(r["iteration_time_s"], 4), _num(r["global_batch_size"]),
             figure_text("tokens_per_s", r["tokens_per_s"]), figure_text("samples_per_s", r["samples_per_s"]),
             figure_text("tflops_per_gpu", r["tflops_per_gpu"]), _num(r["loss"], 4)] for r in records]
    table = tabulate(rows, headers=["iteration", "time/iter (s)", "global batch", "tokens/s", "samples/s",
                                    "TFLOPs/GPU", "loss"], disable_numparse=True, colalign=("right",) * 7)
    return table + "\n\n" + "\n".join(_summary_lines(fmt, summary)) + "\n"


def _summary_lines(fmt: str, summary: dict) -> list[str]:
    """The figures of the two measurements side by side, each row named for what it is."""
    from tabulate import tabulate

    intervals = summary["intervals"]
    lines = [f"format {fmt}: {intervals} logged interval(s) up to iteration {summary['iterations']}, "
             + (f"the first {summary['warmup_excluded']} excluded as warm-up" if warmup_decided(intervals)
                else "warm-up cannot be decided from one interval (none excluded)"), ""]
    tokens = summary["tokens_per_s"] or {}
    ci = tokens.get("ci95")
    rows = [("tokens/s, time-weighted mean", figure_text("tokens_per_s", tokens.get("mean")),
             figure_text("tokens_per_s", summary["tokens_per_s_all_intervals"])),
            ("tokens/s, median interval", figure_text("tokens_per_s", tokens.get("median")), ""),
            ("tokens/s, std of the intervals", figure_text("tokens_per_s", tokens.get("std")), ""),
            ("tokens/s, 95% CI of the mean",
             f"{figure_text('tokens_per_s', ci[0])} .. {figure_text('tokens_per_s', ci[1])}" if ci else "-", ""),
            ("samples/s, time-weighted mean", figure_text("samples_per_s", summary["samples_per_s"]),
             figure_text("samples_per_s", summary["samples_per_s_all_intervals"])),
            (f"time to report {summary['report_tokens']:,} tokens (s)",
             figure_text("time_to_report_s", summary["time_to_report_s"]),
             figure_text("time_to_report_s", summary["time_to_report_s_all_intervals"])),
            ("TFLOPs/GPU, mean of the logged", "", figure_text("tflops_per_gpu", summary["avg_tflops_per_gpu_all_intervals"]))]
    lines.append(tabulate(rows, headers=["", "steady state", "every interval"], disable_numparse=True,
                          colalign=("left", "right", "right")))
    lines += textwrap.wrap("every interval: JUBE's figures, the result table's Tokens/sec, time_to_report_in_seconds "
                           "and Avg_TFLOPs/GPU; time-weighted mean: tokens (samples) over seconds", 80)
    if not tokens:
        lines.append("tokens/s: unknown, the log does not give the sequence length (pass --seq-length)")
    return lines
