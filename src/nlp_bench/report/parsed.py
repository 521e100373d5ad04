"""`bench parse` for people: the records as a table and the summary in words, each figure named."""

from __future__ import annotations

from typing import Any


def _num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def render_parsed(fmt: str, records: list[dict], summary: dict) -> str:
    from tabulate import tabulate

    rows = [[r["iteration"], _num(r["iteration_time_s"], 4), _num(r["global_batch_size"]), _num(r["tokens_per_s"]),
             _num(r["samples_per_s"], 3), _num(r["tflops_per_gpu"]), _num(r["loss"], 4)] for r in records]
    table = tabulate(rows, headers=["iteration", "time/iter (s)", "global batch", "tokens/s", "samples/s",
                                    "TFLOPs/GPU", "loss"], disable_numparse=True, colalign=("right",) * 7)
    tokens = summary["tokens_per_s"]
    lines = [f"format {fmt}: {summary['intervals']} logged intervals up to iteration {summary['iterations']}, "
             f"the first {summary['warmup_excluded']} excluded as warm-up"]
    if tokens:
        ci = tokens["ci95"]
        spread = (f", median {_num(tokens['median'])}, std {_num(tokens['std'])}, 95% CI {_num(ci[0])} .. {_num(ci[1])}"
                  if ci else "")
        lines.append(f"tokens/s (steady state): mean {_num(tokens['mean'])}{spread}")
        lines.append(f"tokens/s (every interval, as the JUBE result computes it): "
                     f"{_num(summary['tokens_per_s_all_intervals'])}")
        lines.append(f"time to report {summary['report_tokens']:,} tokens: {_num(summary['time_to_report_s'])} s")
    else:
        lines.append("tokens/s: unknown, the log does not give the sequence length (pass --seq-length)")
    if summary["samples_per_s"] is not None:
        lines.append(f"samples/s (steady state): {_num(summary['samples_per_s'], 3)}")
    return table + "\n\n" + "\n".join(lines) + "\n"
