"""The planner's validation corpus, its leave-one-source-out errors, and the trust every prediction carries."""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from nlp_bench import flops
from nlp_bench.app import planning
from nlp_bench.cli import cli
from nlp_bench.plan import calibrate, memory, points, timing, validation
from nlp_bench.plan.candidate import Candidate
from nlp_bench.plan.corpus import load_corpus
from nlp_bench.plan.outcomes import load_outcomes
from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.spec.models import get_model, pad_vocab
from nlp_bench.spec.systems import load_system


@pytest.fixture(scope="module")
def rows():
    return load_corpus()

@pytest.fixture(scope="module")
def trust(tmp_path_factory):
    return validation.corpus_trust(tmp_path_factory.mktemp("results"))

def test_the_corpus_holds_the_published_tables_with_sources(rows):
    sources = [r.source for r in rows]
    assert sum("Narayanan et al. 2021, Table 1" in s for s in sources) == 10
    assert sum("Korthikanti et al. 2022, Table 5" in s for s in sources) == 8
    assert sum("JUPITER" in s for s in sources) == 2
    others = [s for s in sources if not any(k in s for k in ("Table 1", "Table 5", "JUPITER"))]
    assert len(others) >= 2 and any("BigScience" in s for s in others)
    assert len({r.id for r in rows}) == len(rows)
    # JUWELS Booster rows are only the two reference rows: its strong-scaling runs are held back
    assert sorted(r.candidate.layout.nodes for r in rows if r.planned.system.name == "juwels-booster") == [8, 96]

def test_each_measurement_is_converted_as_published(rows):
    by_id = {r.id: r for r in rows}
    # Korthikanti 175B, selective + sequence parallel: 64 sequences of 2048 tokens in 13.75 s
    assert by_id["korthikanti-175b-selective"].tokens_per_s == pytest.approx(64 * 2048 / 13.75)
    # Narayanan 1T: 163 TFLOP/s per GPU on 3072 GPUs in the full-recompute count (96 B s L h^2 (...))
    row = by_id["selene-1008b"]
    m, c = row.planned.model, row.candidate
    seconds = flops.jupiter_flops(m.flops_shape(3072, 51200, recompute=True)) / (3072 * 163e12)
    assert c.layout.global_batch_size == 3072 and row.tokens_per_s == pytest.approx(3072 * 2048 / seconds)
    # the README's GPT-3 example: ~32 s per iteration at 138 TFLOP/s, as the README says
    readme = by_id["megatron-readme-gpt3-175b"]
    assert 1536 * 2048 / readme.tokens_per_s == pytest.approx(32, rel=0.02)
    assert by_id["jupiter-175b-96n"].tokens_per_s == 36055.39

def test_leave_one_source_out_errors(trust, rows):
    assert len(trust.checked) == len(rows)
    errors = [abs(c.error) for c in trust.checked]
    assert trust.median_abs_error == statistics.median(errors)
    # Measured on whole held-out publications, fitted only on rows that state every input (2026-11-26, GEMMs
    # and fused attention timed against each device's measured rates, FP8 casts counted, gradient
    # accumulation and the backward's tensor-parallel all-reduce as the row's software ran them, the optimizer
    # step's every pass, constants held near what the hardware measures, each publication weighing as one in
    # the fit, the bubble at the other stages' pace, conformal intervals, the overlaps MLPerf's FP8 runs use,
    # FP8's measured GEMM curve, the fill's overlapped sends, FP8 weights; 2026-11-27: the attention core as it
    # runs, Narayanan et al.'s Table 1 as its authors' scripts ran it: 68 rows of 11 publications, median 5.7%,
    # largest 17.9%, 90% inside the others' intervals, mean half-width ±15.6%). The bounds are issue 34's goals;
    # 2026-11-28, Fujii et al. 2024's A100 rows added: 81 rows of 12 publications, median 5.3%, largest 20.8%
    # (its tp 2, cp 2, pp 2 layout at 256 GPUs, predicted too fast), 91% inside, ±14.5%.
    assert trust.median_abs_error <= 0.06
    assert trust.max_abs_error <= 0.21
    assert trust.coverage >= 0.85
    assert trust.mean_half_width <= 0.20
    assert trust.error_low < 0 < trust.error_high
    assert trust.publications == len({r.publication for r in rows}) >= 11
    # the fit never sees a row with an assumed input
    assert len(rows) >= 40 and any(not r.fitted for r in rows) and any(r.fitted for r in rows)

def test_a_held_out_publication_is_predicted_by_a_fit_that_never_saw_it(rows, monkeypatch):
    """Rows of one publication share a machine and a way of measuring: a fit that saw any of them would
    predict the others too well. Every fit leaves out exactly one whole publication, and each row is checked
    against the interval the other publications' errors give."""
    fitted_on = []
    real = validation.fit_rows

    def recording(subset):
        fitted_on.append(subset)
        return real(subset)

    monkeypatch.setattr(validation, "fit_rows", recording)
    checked = validation.leave_one_source_out(rows)
    names = {r.publication for r in rows}
    fitted_names = {r.publication for r in rows if r.fitted}
    assert len(fitted_on) == len(names)
    for subset, held_out in zip(fitted_on, dict.fromkeys(r.publication for r in rows), strict=True):
        assert all(r.fitted and r.publication != held_out for r in subset)
        assert {r.publication for r in subset} == fitted_names - {held_out}
    for held in checked:
        others = [c.error for c in checked if c.publication != held.publication]
        assert (held.others_low, held.others_high) == validation._interval(others)
        assert held.inside == (held.others_low <= held.error <= held.others_high)

def test_the_interval_holds_ninety_percent_of_new_errors_not_fewer():
    """A 90% interval taken from n held-out errors must hold 90% of the next one's, not 90% of the n: the 5th and
    95th percentiles of 40 errors held about 86% of a new one (a corpus of 50 rows showed 84%)."""
    import random

    from nlp_bench.plan import validation

    assert validation._interval([float(i) for i in range(1, 41)]) == (2.0, 39.0)  # k = 41 - ceil(41 * 0.95)
    assert validation._interval([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few errors for 95% a side: the range
    assert validation._interval([]) == (0.0, 0.0)
    draw = random.Random(34)
    trials, inside = 4000, 0
    for _ in range(trials):
        errors = [draw.gauss(0.0, 0.1) for _ in range(41)]
        low, high = validation._interval(errors[:40])
        inside += low <= errors[40] <= high
    assert inside / trials >= 0.885  # 0.902 expected; the percentiles gave 0.856

def test_every_corpus_row_names_its_publication(tmp_path):
    from nlp_bench.errors import PlanError
    from nlp_bench.plan.corpus import corpus_path

    text = corpus_path().read_text().replace("    publication: Korthikanti et al. 2022\n", "", 1)
    (tmp_path / "corpus.yaml").write_text(text)
    with pytest.raises(PlanError, match="row korthikanti-22b-full: publication is required"):
        load_corpus(tmp_path / "corpus.yaml")

def test_a_switch_the_corpus_does_not_give_keeps_megatrons_default(tmp_path):
    from nlp_bench.plan.corpus import corpus_path

    text = corpus_path().read_text().replace("  gradient_accumulation_fusion: true\n", "", 1)
    (tmp_path / "corpus.yaml").write_text(text)
    by_id = {r.id: r.candidate for r in load_corpus(tmp_path / "corpus.yaml")}
    assert by_id["jupiter-175b-96n"].switches.gradient_accumulation_fusion is True
    assert by_id["selene-1.7b"].switches.gradient_accumulation_fusion is False

def test_every_fitted_efficiency_is_at_most_one_and_a_pinned_one_names_its_term(trust):
    eff = trust.efficiency
    assert 0 < eff.gemm <= 1 and 0 < eff.network <= 1 and 0 < eff.memory <= 1
    assert all(" = 1: " in line or line.startswith("gemm_half = 8: ") for line in trust.pinned)
    # rows faster than the peak allows: the fit stops at 1 and says compute is what it cannot explain
    c = Candidate.of(1, 8, 8, 1, 1, 1)
    m, system = get_model("gpt-13b"), load_system("selene")
    w = timing.work(m, pad_vocab(m.vocab_size, 8), c, system)
    fastest = 2048 / timing.timed(w, timing.Efficiency(1.0, 8.0, 1.0, 1.0)).iteration_s
    fit = calibrate.fit(lambda e: [2048 / timing.timed(w, e).iteration_s], [3 * fastest], ["impossible"])
    assert fit.efficiency.gemm == 1.0 and any(line.startswith("gemm = 1: compute") for line in fit.pinned)

def test_a_publication_weighs_as_one_however_many_rows_it_has(rows):
    fitted = [r for r in rows if r.fitted]
    korthikanti = [r for r in fitted if r.publication == "Korthikanti et al. 2022"]
    assert len(korthikanti) > 1 and len({r.publication for r in fitted}) > 1
    once = validation.fit_rows(fitted)
    # the same publication's rows twice over: the same evidence, the same constants
    twice = validation.fit_rows(fitted + korthikanti)
    for key in ("gemm", "gemm_half", "network", "memory"):
        assert getattr(twice.efficiency, key) == pytest.approx(getattr(once.efficiency, key), rel=1e-6), key

def test_weights_pull_the_fit_toward_the_heavier_point():
    def predict(e):
        return [100 * e.gemm, 100 * e.gemm]

    even = calibrate.fit(predict, [50.0, 80.0], ["a", "b"], free=("gemm",), start=timing.Efficiency())
    heavy = calibrate.fit(predict, [50.0, 80.0], ["a", "b"], free=("gemm",), start=timing.Efficiency(),
                          weights=[1.0, 9.0])
    assert even.efficiency.gemm == pytest.approx((0.5 * 0.8) ** 0.5, rel=1e-3)  # the geometric mean
    assert heavy.efficiency.gemm == pytest.approx(0.5 ** 0.1 * 0.8 ** 0.9, rel=1e-3)

def test_constants_few_rows_leave_free_stay_near_what_the_device_measured():
    import math

    c = Candidate.of(1, 8, 8, 1, 1, 1)
    m, system = get_model("gpt-13b"), load_system("selene")
    w = timing.work(m, pad_vocab(m.vocab_size, 8), c, system)
    truth = timing.Efficiency(0.85, 130.0, 0.8, 0.3)  # memory far from the prior's 0.87
    measured = [2048 / timing.timed(w, truth).iteration_s]

    def predict(e):
        return [2048 / timing.timed(w, e).iteration_s]

    free = calibrate.fit(predict, measured, ["one"])
    held = calibrate.fit(predict, measured, ["one"], prior=calibrate.PRIOR)
    # one row cannot pin four constants: unheld, the GEMM curve's half size wanders far from anything
    # measured; held, each constant lands within a factor 2 of the prior
    assert not 1 / 3 < free.efficiency.gemm_half / calibrate.PRIOR["gemm_half"] < 3
    for key, value in calibrate.PRIOR.items():
        assert 1 / 2 < getattr(held.efficiency, key) / value < 2, key
    # the reported error is the row's alone, not the prior's pull
    row_only = math.sqrt(math.log(predict(held.efficiency)[0] / measured[0]) ** 2)
    assert held.rms_log_error == pytest.approx(row_only, rel=1e-9)
    pull = calibrate.PRIOR_WEIGHT * sum(math.log(getattr(held.efficiency, k) / v) ** 2 for k, v in calibrate.PRIOR.items())
    assert pull > 0.1 * row_only ** 2  # a leak of the prior's pull would move the figure by more than 5%

def test_validate_json_is_the_documented_contract(tmp_path):
    out = CliRunner().invoke(cli, ["--results-dir", str(tmp_path), "plan", "validate", "--json"])
    assert out.exit_code == 0, out.output
    found = json.loads(out.output[out.output.index("{"):])
    assert {"rows", "median_abs_error", "max_abs_error", "coverage", "mean_interval_half_width",
            "publications", "held_out"} <= set(found)
    assert found["coverage"] == pytest.approx(sum(r["inside"] for r in found["rows"]) / len(found["rows"]), abs=1e-4)
    # every published run ran, so the memory model must let each fit (issue 34: the corpus's 50 rows and the
    # 168 layouts of Fujii et al.'s sweep that ran, 218 of 218)
    outcomes = list(load_outcomes())
    ran = len(found["rows"]) + sum(o.ran for o in outcomes)
    assert found["ran_predicted_to_fit"] == [ran, ran] and ran >= 236
    # the sweep's layouts with no figure (taken as out of memory): 2026-11-26, 84 of 124 refused; the bound
    # only keeps a change from making it worse
    refused, oom = found["oom_predicted_not_to_fit"]
    assert oom == sum(not o.ran for o in outcomes) >= 120 and refused >= 84
    assert len(found["memory_misses"]) == min(planning.MISSES_SHOWN, oom - refused)
    assert all(set(planning.VALIDATE_KEYS) <= set(r) for r in found["rows"])
    assert found["max_abs_error"] == max(abs(r["error"]) for r in found["rows"])
    # kept: the second call reads the stored validation
    assert (tmp_path / "plan" / "corpus-validation.json").is_file()
    text = CliRunner().invoke(cli, ["--results-dir", str(tmp_path), "plan", "validate"])
    assert "median absolute error" in text.output and "korthikanti-1t-selective" in text.output

@pytest.mark.parametrize("nodes", [48, 96, 192])
def test_the_reference_layout_fits_on_juwels_booster(nodes):
    base = points.from_point(load_benchmark("nlp").point("175", "juwels-booster"))
    c = base.candidate.changed(nodes=nodes)
    lay, on = c.layout, c.switches
    assert (lay.tp, lay.pp, lay.vp, lay.mbs, lay.gas, on.recompute, on.distributed_optimizer) == (8, 8, 1, 1, 16, "selective",
                                                                                                  True)
    assert memory.footprint(base.model, pad_vocab(base.model.vocab_size, 8), c).gib <= 40

def test_predictions_carry_an_interval_and_say_when_they_extrapolate(tmp_path):
    runner = CliRunner()
    argv = ["--results-dir", str(tmp_path), "plan", "--tag", "175", "--tp", "8", "--pp", "8", "--vp", "1",
            "--mbs", "1", "--recompute", "selective", "--json"]
    rows = json.loads(runner.invoke(cli, [*argv, "--nodes", "96"]).output)
    row = next(r for r in rows if r["fits"])
    assert row["tokens_per_s_low"] < row["tokens_per_s"] < row["tokens_per_s_high"]
    assert row["extrapolated"] is False and row["outside_corpus"] == []
    far = json.loads(runner.invoke(cli, [*argv, "--nodes", "4096", "--gas", "1"]).output)
    assert far[0]["extrapolated"] is True and "devices 16384 outside 8..12288" in far[0]["outside_corpus"]
    table = runner.invoke(cli, argv[:-1] + ["--nodes", "4096", "--gas", "1"]).output
    assert "EXTRAPOLATED" in table and "interval" in table

def test_overlap_hides_only_what_the_backward_covers():
    m, system = get_model("gpt-175b"), load_system("juwels-booster")
    c = Candidate.of(96, 4, 8, 8, 1, 16)
    eff = timing.Efficiency()
    plain = timing.estimate(m, pad_vocab(m.vocab_size, 8), c, system, eff)
    hidden = timing.estimate(m, pad_vocab(m.vocab_size, 8), c.changed(overlap_grad_reduce=True,
                                                                      overlap_param_gather=True), system, eff)
    assert plain.dp_exposed_s == pytest.approx(plain.dp_s)
    assert hidden.dp_exposed_s < plain.dp_exposed_s
    assert hidden.dp_exposed_s >= plain.dp_s - plain.compute_s - 1e-12
    assert hidden.iteration_s == pytest.approx(plain.iteration_s - (plain.dp_exposed_s - hidden.dp_exposed_s))

def test_a_switchless_node_gives_a_small_group_only_its_direct_links():
    """JUWELS Booster's four A100s are wired to each other, four NVLinks per pair, with no NVSwitch: a
    tp=2 pair shares 100 GB/s per direction, a group of all four 300; Selene's NVSwitch gives any group 300."""
    m = get_model("gpt-13b")
    booster, selene = load_system("juwels-booster"), load_system("selene")
    vocab = pad_vocab(m.vocab_size, 2)
    pair = timing.work(m, vocab, Candidate.of(8, 4, 2, 4, 1, 256), booster)
    assert pair.tp_bandwidth == pytest.approx(100e9)
    assert timing.work(m, vocab, Candidate.of(8, 4, 4, 1, 1, 256), booster).tp_bandwidth == pytest.approx(300e9)
    assert timing.work(m, vocab, Candidate.of(4, 8, 2, 4, 1, 256), selene).tp_bandwidth == pytest.approx(300e9)
    # pipeline neighbours inside one node send over their direct link
    assert timing.work(m, vocab, Candidate.of(1, 4, 2, 2, 1, 8), booster).p2p_bandwidth == pytest.approx(100e9)
    # a data-parallel group inside one node reaches its members over (k - 1) links
    assert timing.work(m, vocab, Candidate.of(1, 4, 1, 1, 1, 8), booster).dp_bandwidth == pytest.approx(300e9)
    assert timing.work(m, vocab, Candidate.of(1, 4, 2, 1, 1, 8), booster).dp_bandwidth == pytest.approx(100e9)
    switched = timing.work(m, vocab, Candidate.of(8, 4, 2, 4, 1, 256), replace(booster, intra_node_pair_gbps=None))
    eff = timing.Efficiency()
    assert timing.timed(pair, eff).tp_s > 2.5 * timing.timed(switched, eff).tp_s

def test_the_kept_validation_is_redone_when_a_system_profile_changes(site):
    from nlp_bench.plan.corpus import corpus_path

    before = validation._digest(corpus_path())
    profile = site / "slurm" / "systems" / "juwels-booster.yaml"
    profile.write_text(profile.read_text().replace("intra_node_pair_gbps: 100", "intra_node_pair_gbps: 90"))
    assert validation._digest(corpus_path()) != before

@pytest.mark.parametrize("module", ["devices", "systems"])
def test_the_kept_validation_is_redone_when_the_device_table_or_its_lookup_changes(tmp_path, monkeypatch, module):
    import importlib

    from nlp_bench.plan.corpus import corpus_path

    code = importlib.import_module(f"nlp_bench.spec.{module}")
    before = validation._digest(corpus_path())
    changed = tmp_path / f"{module}.py"
    changed.write_text(Path(code.__file__).read_text() + "\n# changed\n")  # any edit to the module
    monkeypatch.setattr(code, "__file__", str(changed))
    assert validation._digest(corpus_path()) != before

@pytest.mark.parametrize("value", [-100, 0, "fast", True])
def test_a_profile_figure_must_be_a_positive_number(site, value):
    import yaml

    from nlp_bench.errors import SpecError

    profile = site / "slurm" / "systems" / "juwels-booster.yaml"
    data = yaml.safe_load(profile.read_text())
    data["intra_node_pair_gbps"] = value
    profile.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match="intra_node_pair_gbps must be a positive number"):
        load_system("juwels-booster")

def test_a_sweep_cell_is_estimated_as_the_planner_would_plan_it(tmp_path):
    from nlp_bench.errors import PlanError

    table = {"id": "t", "publication": "p", "source": "s", "model": {"preset": "llama3-8b", "seq_length": 16384},
             "device_memory_gib": 40, "devices_per_node": 4, "global_batch_size": 64, "recompute": "none",
             "sequence_parallel": True, "distributed_optimizer": True, "precision": "bf16",
             "cells": [[2, 2, 1, 1, 8, 301.5], [2, 1, 1, 4, 4, None]]}
    path = tmp_path / "memory.yaml"
    path.write_text(json.dumps({"tables": [table]}))
    ran, failed = load_outcomes(path)
    assert ran.ran and not failed.ran and ran.id == "t/tp2-cp2-pp1-mbs1-8"
    c = Candidate.of(2, 4, 2, 1, 1, 32, cp=2, recompute="none")
    model = replace(get_model("llama3-8b"), seq_length=16384, max_position_embeddings=16384)
    assert ran.predicted_gib == pytest.approx(memory.footprint(model, pad_vocab(model.vocab_size, 2), c).gib)
    assert failed.predicted_gib > 40 and not failed.predicted_to_fit
    for bad, needle in ((2, 3, 1, 1, 8, None), "does not divide its 8 GPUs"), ([2, 1, 1, 3, 4, None], "does not divide the batch 64"), \
            ([2, 1, 1, 1, None], "a cell is [tp, cp, pp, micro-batch, GPUs, figure or null]"):
        path.write_text(json.dumps({"tables": [{**table, "cells": [list(bad)]}]}))
        with pytest.raises(PlanError, match=re.escape("memory.yaml table t: ") + ".*" + re.escape(needle)):
            list(load_outcomes(path))
    path.write_text(json.dumps({"tables": [{k: v for k, v in table.items() if k != "device_memory_gib"}]}))
    with pytest.raises(PlanError, match="table t: missing device_memory_gib"):
        list(load_outcomes(path))

@pytest.mark.parametrize("change, needle", [
    ({"model": "llama3-8b"}, "model needs a preset"),
    ({"model": {"preset": "llama9"}}, "unknown model"),
    ({"cells": None}, "cells must be a list"),
    ({"device_memory_gib": "lots"}, "device_memory_gib must be positive"),
    ({"devices_per_node": 0}, "devices_per_node must be positive"),
    ({"global_batch_size": "64"}, "global_batch_size must be positive"),
    ({"precision": "int4"}, "precision must be one of"),
    ({"cells": [[True, 1, 1, 1, 4, None]]}, "a cell is"),
    ({"cells": [[2, 1, 1, 1, 12, None]], "devices_per_node": 8, "global_batch_size": 48}, "12 GPUs do not fill nodes of 8"),
])
def test_a_faulty_sweep_table_is_one_line_naming_it(tmp_path, change, needle):
    from nlp_bench.errors import PlanError

    table = {"id": "t", "publication": "p", "source": "s", "model": {"preset": "llama3-8b"}, "device_memory_gib": 40,
             "devices_per_node": 4, "global_batch_size": 64, "recompute": "none", "sequence_parallel": True,
             "distributed_optimizer": True, "precision": "bf16", "cells": [[2, 1, 1, 1, 4, 300.0]]}
    path = tmp_path / "memory.yaml"
    path.write_text(json.dumps({"tables": [{**table, **change}]}))
    with pytest.raises(PlanError, match=re.escape("memory.yaml table t: ") + ".*" + re.escape(needle)):
        list(load_outcomes(path))

def test_a_sweep_file_without_tables_is_refused(tmp_path):
    from nlp_bench.errors import PlanError

    path = tmp_path / "memory.yaml"
    path.write_text("table: []\n")
    with pytest.raises(PlanError, match="no tables"):
        list(load_outcomes(path))
