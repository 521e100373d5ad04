"""Which result columns the HTML report's results table shows, and what it says of the others instead.

Thirty columns do not fit a page (at 1400 px the table scrolled sideways and hid `state`). Most of them
hold one value on every point of a report, or one value per run (a run is one tag on one system), or none
at all: those are said once above the table, which leaves what tells the points apart and what they
measured."""

from __future__ import annotations

from dataclasses import dataclass

from nlp_bench.analysis.results import MOE_COLUMNS, RESULT_COLUMNS

#: what each point measured (and the point itself): kept in the table even where every point has the same
#: value, so that a report of one point still shows its figures as a table
MEASURED = ("point", "Job_Time", "Avg_TFLOPs/GPU", "Tokens/sec", "time_to_report_in_seconds", "MFU",
            "Predicted_Tokens/sec", "Predicted/Measured", "Joules/token", "Report_kWh", "XLA_Graphs/step",
            "XLA_Compiles")
#: what a run fixes for all its points where it fixes it: said per run when every run holds one value
RUN_WIDE = ("system", "version", "queue", "Model_Size", "Active_Params", "Total_Params", "trainer", "trainer_version")
#: what the table shows where no point has a value
NO_VALUE = "-"


@dataclass(frozen=True)
class TableColumns:
    """shown: the table's columns; same: (column, value) of those equal on every point; by_run: per run, the
    (column, value) of those equal within each run but not across runs; empty: those no point has."""

    shown: list[str]
    same: list[tuple[str, str]]
    by_run: dict[str, list[tuple[str, str]]]
    empty: list[str]


def table_columns(rows: list[dict[str, str]]) -> TableColumns:
    """The split of RESULT_COLUMNS for these rows, each a point's cells as the table shows them."""
    empty = [c for c in RESULT_COLUMNS if all(row[c] == NO_VALUE for row in rows)]
    # a report without a model with experts does not name the experts' columns as empty: they do not apply
    absent = set(MOE_COLUMNS) if all(row[MOE_COLUMNS[1]] == NO_VALUE for row in rows) else set()
    same = [c for c in RESULT_COLUMNS if c not in empty and c not in MEASURED and len({row[c] for row in rows}) == 1]
    runs: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        runs.setdefault(row["run"], []).append(row)
    per_run = [c for c in RUN_WIDE if c not in empty and c not in same and len(runs) > 1
               and all(len({row[c] for row in group}) == 1 for group in runs.values())]
    by_run = {run: [(c, group[0][c]) for c in per_run] for run, group in runs.items()} if per_run else {}
    return TableColumns(shown=[c for c in RESULT_COLUMNS if c not in {*empty, *same, *per_run}],
                        same=[(c, rows[0][c]) for c in same], by_run=by_run,
                        empty=[c for c in empty if c not in absent])
