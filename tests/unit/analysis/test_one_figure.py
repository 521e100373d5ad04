"""One log, one number per figure: JUBE's (every interval) and the steady state's are each defined once
(analysis.metrics) and every view shows the same value under its own name: the progress bar, `bench status`,
the result table and its exports, `bench parse`, `bench result compare`, the report's headline."""


import pytest

from nlp_bench.analysis import metrics, parsers

SEQ, GBS = 128, 4

def _log(times: list[float]) -> str:
    return "".join(f"[default1]: iteration {5 * i:8d}/      {5 * len(times)} | consumed samples: {20 * i:12d} | "
                   f"elapsed time per iteration (s): {t:.4f} | global batch size: {GBS:5d} | "
                   f"lm loss: 1.0E+01 | tokens per second: {GBS * SEQ / t:.1f} |\n" for i, t in enumerate(times, 1))

def test_without_warm_up_the_two_figures_are_one():
    records = parsers.parse_text(_log([1.0, 1.1, 0.9, 1.0]))
    _, summary = metrics.steady_summary(records, SEQ)
    assert summary["warmup_excluded"] == 0
    assert summary["tokens_per_s"]["mean"] == pytest.approx(summary["tokens_per_s_all_intervals"])
    from nlp_bench.report.headline import steady_note

    note = steady_note({"steady": summary}, 2e7 / summary["tokens_per_s_all_intervals"])
    assert "no interval of 4 ran slow enough to count as warm-up, so it is the same figure" in note
