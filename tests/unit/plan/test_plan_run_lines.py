"""Every layout `bench plan` ranks is a `bench run` line, and the point that line makes is predicted exactly as
the row (issue 53, finding 1: the 175B plan's best row, vp 6 without recompute, could not be run as shown)."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from nlp_bench.app import planning

#: plans whose rows between them change every option a `bench run` line may carry: nodes, tp, pp, vp, mbs, gas
#: (the global batch), recompute (none, full), the distributed optimizer (off, and on where the tag has it off)
#: and the system
PLANS = {
    "175": ["--tag", "175", "--top", "8"],
    "13": ["--tag", "13", "--system", "juwels-booster", "--nodes", "16", "--gas", "64", "--recompute", "full",
           "--top", "3"],
    "smoke": ["--tag", "smoke", "--top", "4"],
}


def _predictions(results) -> dict:
    return {p: json.loads(p.read_text()) for p in results.glob("nlp/*/*/prediction.json")}


@pytest.mark.parametrize("plan", sorted(PLANS))
def test_each_ranked_row_runs_as_its_line_and_is_predicted_exactly_as_the_row(bench, results, plan):
    out = bench("plan", *PLANS[plan], "--json")
    assert out.exit_code == 0, out.output
    rows = [r for r in json.loads(out.output) if r["fits"]]
    assert rows and all(r["command"] for r in rows)
    for row in rows:
        before = _predictions(results)
        words = shlex.split(row["command"])
        assert words[:2] == ["bench", "run"]
        made = bench(*words[1:], "--dry-run")
        assert made.exit_code == 0, (row["command"], made.output)
        (path, predicted), = ((p, d) for p, d in _predictions(results).items() if p not in before)
        assert predicted["fits"] and predicted["calibrated"] is row["calibrated"]
        assert round(predicted["tokens_per_s"], 1) == row["tokens_per_s"], row["command"]
        assert round(predicted["tokens_per_s_low"], 1) == row["tokens_per_s_low"]
        assert round(predicted["tokens_per_s_high"], 1) == row["tokens_per_s_high"]
        assert round(predicted["memory_gib"], 2) == row["memory_gib"]
        point = json.loads((path.parent / "point.json").read_text())
        layout = point["layout"]
        assert [layout[k] for k in ("nodes", "tp", "pp", "vp", "mbs", "gas")] == \
               [row[k] for k in ("nodes", "tp", "pp", "vp", "mbs", "gas")]
        # the point's id names interleaving, and the settings where they are not the tag's
        assert ("_vp" in point["id"]) is (row["vp"] > 1)
        assert ("_rc-" in point["id"]) is ("--recompute" in words)
        assert ("_dist-opt-" in point["id"]) is any("distributed-optimizer" in w for w in words)
    said = " ".join(r["command"] for r in rows)
    expected = {"175": ["--vp", "--recompute none", "--no-distributed-optimizer"],
                "13": ["--system juwels-booster", "--nodes 16", "--gas 64", "--recompute full"],
                "smoke": ["--distributed-optimizer"]}[plan]
    assert all(option in said for option in expected), said


def test_the_lines_are_the_rows_unrounded_prediction(bench, results):
    """The prediction of the point a line makes is the ranked layout's to the last bit, not only as rounded."""
    good, _, _, _ = planning.plan(results, "nlp", "175", None, {"nodes": (), "tp": None, "pp": None, "vp": None,
                                                               "mbs": None, "gas": None, "global_batch_size": None,
                                                               "batch": None}, 1)
    (line,), rules = planning.run_lines("nlp", "175", None, None, good)
    assert line == "bench run --tag 175 --pp 16 --vp 6 --recompute none" and rules == "jupiter"
    assert bench(*shlex.split(line)[1:], "--dry-run").exit_code == 0
    (predicted,) = _predictions(results).values()
    assert (predicted["tokens_per_s"], predicted["memory_gib"]) == (good[0].tokens_per_s, good[0].memory_gib)
    assert (predicted["tokens_per_s_low"], predicted["tokens_per_s_high"]) == (good[0].tokens_per_s_low,
                                                                               good[0].tokens_per_s_high)


def test_the_text_names_each_rows_line_within_the_width(bench, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    text = bench("plan", *PLANS["13"]).output
    rows = json.loads(bench("plan", *PLANS["13"], "--json").output)
    assert max(map(len, text.splitlines())) <= 80
    joined = re.sub(r" \\\n +", " ", text)  # the continued lines, as a shell reads them
    said = dict(re.findall(r"^ *#(\d+)  (bench run .*)$", joined, re.M))
    assert said == {str(i): r["command"] for i, r in enumerate(rows, 1) if r["fits"]}
    # the tag's rules keep its recompute: the lines that change it are no submission, and the plan says so
    ranks = ", ".join(f"#{rank}" for rank in said)  # every row recomputes fully, the tag selectively
    assert f"{ranks} change recompute or the distributed optimizer, training arguments the jupiter rules keep as " \
           "the tag has them: `bench rules check` calls such a run no submission" in " ".join(text.split())


def test_a_model_no_tag_trains_has_no_line(bench):
    out = bench("plan", "--tag", "13", "--model", "gpt-1.3b", "--top", "2")
    assert out.exit_code == 0, out.output
    assert "no `bench run` line: no tag trains the model planned (--model)" in out.output
    rows = json.loads(bench("plan", "--tag", "13", "--model", "gpt-1.3b", "--top", "2", "--json").output)
    assert all(r["command"] is None for r in rows)
