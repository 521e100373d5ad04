"""Warm-up is decided from two logged intervals on (said undecidable for one), and the shipped smoke grid
logs enough intervals to leave a steady state with a spread after the most warm-up the rule excludes."""

from conftest import ROOT

from nlp_bench.analysis import metrics, parsers
from nlp_bench.report.headline import steady_note
from nlp_bench.report.parsed import render_parsed

SEQ, GBS = 128, 8


def _summary(times: list[float]) -> dict:
    text = "".join(f" iteration {5 * i:8d}/{5 * len(times):8d} | consumed samples: {5 * i * GBS:12d} | elapsed time per "
                   f"iteration (s): {t:.4f} | global batch size: {GBS:5d} | lm loss: 1.0E+01 |\n"
                   for i, t in enumerate(times, 1))
    return metrics.steady_summary(parsers.parse_text(text), SEQ)


def test_the_first_of_two_intervals_is_warm_up_where_it_ran_slow():
    """The smoke grid's log: the first of two intervals 26% slower, once reported as no warm-up at all."""
    views, summary = _summary([2.52, 2.0])
    assert summary["warmup_excluded"] == 1
    assert summary["tokens_per_s"]["mean"] == GBS * SEQ / 2.0 and summary["time_to_report_s"] == 2e7 / (GBS * SEQ / 2.0)
    note = steady_note({"steady": summary, "records": [{"iteration_time_s": 2.52}, {"iteration_time_s": 2.0}]},
                       summary["time_to_report_s_all_intervals"])
    assert "1 warm-up interval(s) of 2 left out" in note and "they took 26% longer per iteration" in note
    assert "the first 1 excluded as warm-up" in render_parsed("megatron", views, summary)


def test_two_even_intervals_have_no_warm_up():
    _, summary = _summary([2.05, 2.0])
    assert summary["warmup_excluded"] == 0
    assert summary["tokens_per_s"]["mean"] == summary["tokens_per_s_all_intervals"]
    assert "no interval of 2 ran slow enough" in steady_note({"steady": summary}, summary["time_to_report_s"])


def test_one_interval_says_warm_up_cannot_be_decided():
    views, summary = _summary([2.5])
    assert summary["warmup_excluded"] == 0
    note = steady_note({"steady": summary}, summary["time_to_report_s"])
    assert "one interval, too few to tell warm-up from the steady state" in note and "no interval of" not in note
    assert "warm-up cannot be decided from one interval" in render_parsed("megatron", views, summary)


def test_the_smoke_grid_logs_enough_intervals_to_tell_warm_up():
    from nlp_bench.sweep.grid import expand, load_grid

    points = expand(load_grid(ROOT / "benchmark" / "grids" / "smoke.yaml")).points
    assert len(points) == 4
    for point in points:
        intervals = point.train["train-iters"] // point.train["log-interval"]
        assert intervals - intervals // 2 >= 2, point.train  # after the most warm-up: a spread, a CI
        assert point.train["train-iters"] == 10  # no longer than before
