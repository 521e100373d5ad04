"""Which columns the HTML report's results table keeps: those that tell its points apart and what they
measured; the rest are said once above it (the table of thirty columns scrolled sideways at 1400 px)."""

from nlp_bench.analysis.results import RESULT_COLUMNS
from nlp_bench.report.html_columns import table_columns


def _cells(run: str, point: str, system: str, tp: int, state: str = "COMPLETED") -> dict[str, str]:
    cells = dict.fromkeys(RESULT_COLUMNS, "-")
    cells.update({"run": run, "point": point, "system": system, "queue": system, "version": "0.1.0", "Nodes": "1",
                  "Tensor_Parallel": str(tp), "Tokens/sec": f"{100 * tp:.2f}", "MFU": "0.5000", "state": state})
    return cells


def test_equal_columns_are_said_once_per_report_and_per_run():
    rows = [_cells("a", "p1", "local", 1), _cells("a", "p2", "local", 2, state="FAILED"),
            _cells("b", "p1", "juwels-booster", 1)]
    table = table_columns(rows)
    assert table.shown == ["Tensor_Parallel", "Tokens/sec", "MFU", "state", "run", "point"]
    assert table.same == [("version", "0.1.0"), ("Nodes", "1")]
    assert table.by_run == {"a": [("system", "local"), ("queue", "local")],
                            "b": [("system", "juwels-booster"), ("queue", "juwels-booster")]}
    assert "Joules/token" in table.empty and "failure_class" in table.empty


def test_one_point_keeps_its_figures_in_the_table():
    table = table_columns([_cells("a", "p1", "local", 2)])
    assert table.shown == ["Tokens/sec", "MFU", "point"] and table.by_run == {}
    assert ("Tensor_Parallel", "2") in table.same and ("state", "COMPLETED") in table.same


def test_a_value_that_differs_within_a_run_stays_in_the_table():
    rows = [_cells("a", "p1", "local", 1), _cells("a", "p2", "local-slurm", 1), _cells("b", "p1", "local", 1)]
    assert "system" in table_columns(rows).shown and table_columns(rows).by_run == {}
