"""Validation held out three ways (publication, system, scale band), and the interval a prediction carries
from the held-out kinds it belongs to."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from nlp_bench.cli import cli
from nlp_bench.plan import ranking, validation
from nlp_bench.plan.candidate import STATED_START, Candidate
from nlp_bench.plan.corpus import load_corpus
from nlp_bench.plan.validation import HeldOutRow, carried, scale_band
from nlp_bench.spec.layout import Layout
from nlp_bench.spec.models import get_model
from nlp_bench.spec.systems import load_system


@pytest.fixture(scope="module")
def rows():
    return load_corpus()


def _held(kind: str, error: float, system: str = "selene", device: str = "A100-SXM4-80GB", devices: int = 64,
          publication: str = "p") -> HeldOutRow:
    return HeldOutRow("r", "", "m", system, devices // 8, 1, 1, devices, 100.0, 100.0 * (1 + error), publication,
                      devices=devices, device=device, kind=kind)


def test_scale_bands_split_at_their_edges():
    assert [scale_band(n) for n in (1, 255, 256, 1023, 1024, 4095, 4096, 16384)] == [
        "1-255 GPUs", "1-255 GPUs", "256-1023 GPUs", "256-1023 GPUs", "1024-4095 GPUs", "1024-4095 GPUs",
        "4096+ GPUs", "4096+ GPUs"]


def test_a_scale_band_is_predicted_by_a_fit_on_the_rows_below_it(rows, monkeypatch):
    """Fit on the rows below N GPUs, predict those above: the fit of each band never sees a row at or above
    its lower edge (the lowest band, with nothing below, is fitted on the rows above it)."""
    fitted_on = []
    real = validation.fit_rows
    monkeypatch.setattr(validation, "fit_rows", lambda subset: fitted_on.append(subset) or real(subset))
    checked = validation.hold_out(rows, "scale")
    bands = list(dict.fromkeys(scale_band(r.candidate.layout.world) for r in rows))
    assert len(fitted_on) == len(bands) >= 3 and len(checked) == len(rows)
    for subset, band in zip(fitted_on, bands, strict=True):
        floor = int(band.split("-")[0].rstrip("+ GPUs"))
        worlds = [r.candidate.layout.world for r in subset]
        assert all(r.fitted for r in subset)
        assert all(w < floor for w in worlds) if floor > 1 else all(w >= 256 for w in worlds)
    for held in checked:
        others = [c.error for c in checked if c.kind != held.kind]
        assert (held.others_low, held.others_high) == validation._interval(others)


def test_a_held_out_system_is_predicted_by_a_fit_that_never_saw_it(rows, monkeypatch):
    fitted_on = []
    real = validation.fit_rows
    monkeypatch.setattr(validation, "fit_rows", lambda subset: fitted_on.append(subset) or real(subset))
    checked = validation.hold_out(rows, "system")
    systems = list(dict.fromkeys(r.planned.system.name for r in rows))
    assert len(fitted_on) == len(systems)
    for subset, held_out in zip(fitted_on, systems, strict=True):
        assert subset and all(r.planned.system.name != held_out for r in subset)
    assert {c.kind for c in checked} == set(systems) and all(c.kind == c.system for c in checked)


def test_a_prediction_carries_the_interval_of_its_scale_band_and_system():
    held = {"publication": [_held("p", -0.05), _held("q", 0.05, publication="q")],
            "system": [_held("selene", -0.02), _held("h100-8", 0.30, system="h100-8", device="H100-SXM-80GB")],
            "scale": [_held("1-255 GPUs", 0.02), _held("4096+ GPUs", -0.25, devices=8192)]}
    # on selene at 64 GPUs: the publication interval, widened by nothing narrower
    assert carried(held, "selene", "A100-SXM4-80GB", 64, False) == pytest.approx((-0.05, 0.05))
    # at 8192 GPUs the scale band's held-out error widens it
    assert carried(held, "selene", "A100-SXM4-80GB", 8192, False) == pytest.approx((-0.25, 0.05))
    # another profile of a device the corpus has takes that device's rows
    assert carried(held, "other-a100", "A100-SXM4-80GB", 64, False) == pytest.approx((-0.05, 0.05))
    # a device the corpus lacks, a band without rows, or any extrapolation: the widest any kind gave
    widest = (-0.25, 0.30)
    assert carried(held, "gh200", "GH200", 64, False) == pytest.approx(widest)
    assert carried(held, "selene", "A100-SXM4-80GB", 512, False) == pytest.approx(widest)
    assert carried(held, "selene", "A100-SXM4-80GB", 64, True) == pytest.approx(widest)
    # a publication left out leaves its rows out of every pool
    assert carried(held, "selene", "A100-SXM4-80GB", 64, False, without="q") == pytest.approx((-0.05, 0.02))


def test_ranking_gives_an_extrapolated_layout_the_widest_interval(rows):
    trust = validation.corpus_trust(None)
    system = load_system("h100-8")
    model = get_model("gpt-175b")
    inside = Candidate(Layout(64, 8, tp=4, pp=8, mbs=1, gas=64), STATED_START)
    beyond = Candidate(Layout(4096, 8, tp=4, pp=8, mbs=1, gas=1), STATED_START)  # 32,768 GPUs: above the corpus
    near = ranking.predict(model, system, inside, trust.efficiency, trust)
    far = ranking.predict(model, system, beyond, trust.efficiency, trust)
    assert not near.extrapolated and far.extrapolated
    low, high = trust.error_interval(system, beyond.layout.world, True)
    assert (far.tokens_per_s_low, far.tokens_per_s_high) == pytest.approx(
        (far.tokens_per_s / (1 + high), far.tokens_per_s / (1 + low)))
    widest = [k.interval for found in trust.kinds().values() for k in found]
    assert low == min(i[0] for i in widest) and high == max(i[1] for i in widest)
    assert near.tokens_per_s_high / near.tokens_per_s_low < far.tokens_per_s_high / far.tokens_per_s_low


def test_bench_plan_validate_json_reports_every_kind_and_the_worst(tmp_path, rows):
    result = CliRunner().invoke(cli, ["--results-dir", str(tmp_path), "plan", "validate", "--json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    assert set(found["kinds"]) == {"publication", "system", "scale"}
    for way, kinds in found["kinds"].items():
        assert sum(k["rows"] for k in kinds) == len(rows)
        worst = found["worst_kind"][way]
        assert worst["median_abs_error"] == max(k["median_abs_error"] for k in kinds)
        assert all(0 <= k["coverage"] <= 1 and k["interval"][0] <= k["interval"][1] for k in kinds)
    assert found["rows_at_1000_gpus_or_more"] == sum(r.candidate.layout.world >= 1000 for r in rows)
    row = found["rows"][0]
    assert set(row["held_out_errors"]) == {"publication", "system", "scale"} and row["scale"].endswith("GPUs")
    assert 0 < found["carried_coverage"] <= 1 and found["carried_mean_half_width"] > 0
    kept = json.loads((tmp_path / "plan" / "corpus-validation.json").read_text())
    assert set(kept["held_out"]) == {"publication", "system", "scale"}
