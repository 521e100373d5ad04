"""The tex export: a table a paper can \\input as it is (booktabs rules, a caption and a label, headers in words,
figures right-aligned), of the benchmark's figures and the layout that made them rather than all 30 columns."""

from __future__ import annotations

import re
from typing import Any

from nlp_bench.flops import REPORT_TOKENS

#: the columns of a paper's table where none are chosen: the model and its layout, then the figures; as
#: Megatron-LM's papers report a run (DP, MBS and GAS follow, and --columns adds them), and narrow enough for
#: one column of an article
PAPER_COLUMNS = ("Model_Size", "Nodes", "Tensor_Parallel", "Pipeline_Parallel", "Batch_Size", "Tokens/sec",
                 "Avg_TFLOPs/GPU", "MFU", "time_to_report_in_seconds")
#: a column's header in words, over two lines where it is long (TP, PP, DP, MBS and GAS are the benchmark's own
#: words, as its rules write them); a column not named here is written with spaces for its underscores
PAPER_HEADERS = {"system": "System", "version": "Version", "queue": "Queue", "JobID": "Job", "Job_Time": "Job\ntime (s)",
           "Model_Size": "Model\n(B)", "Batch_Size": "Global\nbatch", "Pipeline_Parallel": "PP", "Tensor_Parallel": "TP",
           "Avg_TFLOPs/GPU": "TFLOP/s\nper GPU", "Tokens/sec": "Tokens/s", "time_to_report_in_seconds":
           "Time to\nreport (s)", "Predicted_Tokens/sec": "Predicted\ntokens/s", "Predicted/Measured":
           "Predicted/\nmeasured", "state": "State", "failure_class": "Failure", "run": "Run", "point": "Point",
           "trainer": "Trainer", "trainer_version": "Trainer\nversion", "Joules/token": "J/token",
           "Report_kWh": "kWh to\nreport", "XLA_Graphs/step": "XLA graphs\nper step", "XLA_Compiles": "XLA\ncompiles"}


def paper_columns(frame) -> list[str]:
    """PAPER_COLUMNS but those no row has a value in (MFU where no peak is known, say)."""
    return [c for c in PAPER_COLUMNS if frame[c].notna().any()] or list(PAPER_COLUMNS)


def _figures(column) -> bool:
    """A column of figures (right-aligned): numbers, not words or switches."""
    from pandas.api.types import is_bool_dtype, is_numeric_dtype

    return is_numeric_dtype(column) and not is_bool_dtype(column)


def latex_table(frame, shown, runs: list[str]) -> str:
    """`frame`'s columns as a booktabs table float: `shown` is the frame with every cell formatted as
    text; each column's header in words (PAPER_HEADERS, on two rows where one is long; specials escaped), figures
    right-aligned, a caption naming the run(s) and a label a paper can \\ref."""
    import pandas as pd

    align = "".join("r" if _figures(frame[c]) else "l" for c in frame.columns)
    words = [PAPER_HEADERS.get(c, c.replace("_", " ")).split("\n") for c in frame.columns]
    depth = max(len(lines) for lines in words)
    named = shown.set_axis(pd.MultiIndex.from_tuples([(*lines, *[""] * (depth - len(lines))) for lines in words])
                           if depth > 1 else [lines[0] for lines in words], axis=1)
    safe = [re.sub(r"[^A-Za-z0-9.-]", "", run) for run in runs]  # a run id is these already; a label takes them
    which = f" (run {safe[0]})" if len(safe) == 1 else f" (runs {', '.join(safe)})" if safe else ""
    caption = (f"Training throughput measured by nlp-bench{which}: tokens/s, and the time to report, the seconds "
               f"a training of {REPORT_TOKENS:,} tokens takes at that rate.")
    styler = named.style.hide(axis="index").format(escape="latex").format_index(escape="latex", axis=1)
    # small type and 4pt between columns: the nine default columns fit one column of an article
    styler = styler.set_table_styles([{"selector": "small", "props": ":;"},
                                      {"selector": "setlength", "props": ":{\\tabcolsep}{4pt};"}])
    return styler.to_latex(column_format=align, hrules=True, caption=caption, position_float="centering",
                           label="tab:nlp-bench-" + (safe[0] if len(safe) == 1 else "results"), sparse_columns=False)


def runs_of(rows: list[dict[str, Any]]) -> list[str]:
    """The runs the rows come from, in order of appearance."""
    return list(dict.fromkeys(str(row["run"]) for row in rows if row.get("run")))
