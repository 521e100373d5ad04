"""`bench result compare baseline` quotes the steady state's figure, the one result.json and the report give,
under the steady state's name: it was headed Tokens/sec, the table's name for JUBE's figure."""

from nlp_bench.analysis import metrics, parsers
from nlp_bench.analysis.run_diff import PointRun, compare_runs
from nlp_bench.report.compare import render_changes

SEQ, GBS = 128, 8


def _result(times: list[float]) -> dict:
    text = "".join(f" iteration {5 * i:8d}/{5 * len(times):8d} | consumed samples: {5 * i * GBS:12d} | elapsed time per "
                   f"iteration (s): {t:.4f} | global batch size: {GBS:5d} | lm loss: 1.0E+01 |\n"
                   for i, t in enumerate(times, 1))
    records = parsers.parse_text(text)
    return {"records": [r.to_dict() for r in records], "summary": {"seq_length": SEQ},
            "steady": metrics.steady_summary(records, SEQ)[1]}


def test_compare_baseline_shows_the_steady_figure_under_its_name():
    now, before = _result([2.6, 2.013, 1.987, 2.031, 1.994]), _result([2.6, 2.113, 2.087, 2.131, 2.094])
    change, = compare_runs({"p": PointRun({}, now)}, {"p": PointRun({}, before)})
    assert change.tokens_per_s == now["steady"]["tokens_per_s"]["mean"]
    assert change.baseline_tokens_per_s == before["steady"]["tokens_per_s"]["mean"]
    header = render_changes([change], "pretty").splitlines()[0]
    assert "steady tokens/s" in header and "Tokens/sec" not in header
