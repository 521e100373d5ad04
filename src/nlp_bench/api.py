"""The small public API for notebooks and scripts: measured results as one pandas DataFrame.

    from nlp_bench.api import load_results
    frame = load_results("results")            # every run
    frame = load_results("results", ["20261122-1200"])   # some runs (ids, prefixes or folders)

The columns are the result table's (the JUPITER JUBE columns, then DP, MBS, GAS, EP, MFU, the active and
total parameters of a model with experts, state, failure_class, run, point) with nullable dtypes; a point's log is analysed on the way if it has not been.
"""

from __future__ import annotations

from pathlib import Path

from nlp_bench.analysis.results import rows_frame, run_rows
from nlp_bench.store.runs import find_run, list_runs


def load_results(results_dir: str | Path = "results", runs: list[str] | None = None):
    """Every point of the given runs (default: all runs under results_dir) as one DataFrame."""
    root = Path(results_dir)
    selected = [find_run(root, ref) for ref in runs] if runs else list_runs(root).runs
    return rows_frame([row for run_ in selected for row in run_rows(run_)])
