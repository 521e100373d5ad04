"""The planner's owed GPU measurements (benchmark/perf/gemm_sustained.py, layer_fixed_cost.py and the script
that runs them with gemm_rates.py in one device call) run here on CPU at toy sizes, and the planner's layer time
stays near the layers the H200 measured (benchmark/perf/measured/)."""

import importlib.util
import json

import pytest
from conftest import ROOT

PERF = ROOT / "benchmark" / "perf"

def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, PERF / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

def test_a_held_load_is_timed_window_by_window_against_the_short_run(tmp_path):
    out = tmp_path / "held.json"
    assert _script("gemm_sustained").main(["--device", "cpu", "--hidden", "64", "--tp", "2", "--tokens", "32",
                                           "--seconds", "0.6", "--window", "0.2", "--repeats", "2",
                                           "--json", str(out)]) == 0
    found = json.loads(out.read_text())
    assert found["short_tflops"] > 0 and found["windows"]  # how many fit in 0.6 s depends on the machine's load
    assert all(w["tflops"] > 0 for w in found["windows"])
    assert [w["at_s"] for w in found["windows"]] == sorted(w["at_s"] for w in found["windows"])

def test_a_windows_rate_is_the_work_it_finished_over_its_time():
    now = [0.0]

    def run():  # one layer run takes 10 ms of a fake clock: 1e12 FLOPs at 100 TFLOP/s
        now[0] += 0.01

    module = _script("gemm_sustained")
    windows = module.sustained([run], 1e12, 2.0, 0.5, module.torch.device("cpu"), clock=lambda: now[0])
    assert len(windows) == 4 and all(w["tflops"] == pytest.approx(100) for w in windows)

@pytest.mark.parametrize("argv, why", [(["--hidden", "100", "--tp", "8"], "divide by --tp"),
                                       (["--seconds", "0"], "positive")])
def test_a_held_load_refuses_a_shape_it_cannot_run(argv, why, capsys):
    assert _script("gemm_sustained").main(["--device", "cpu", *argv]) == 2
    assert why in capsys.readouterr().err

def test_a_layers_fixed_cost_is_measured_at_every_micro_batch_size(tmp_path):
    out = tmp_path / "fixed.json"
    assert _script("layer_fixed_cost").main(["--device", "cpu", "--hidden", "64", "--heads", "4", "--tp", "2",
                                             "--seq", "16", "--mbs", "1,2,3", "--layers", "2", "--repeats", "2",
                                             "--json", str(out)]) == 0
    shape, = json.loads(out.read_text())["shapes"]
    assert [r["tokens"] for r in shape["rows"]] == [16, 32, 48]
    assert all(r["layer_ms"] > 0 and r["gemm_ms"] > 0 for r in shape["rows"])
    assert set(shape["intercept_ms"]) == {"layer", "gemm", "rest"}

@pytest.mark.parametrize("argv, why", [(["--hidden", "64,128", "--heads", "4"], "one entry each"),
                                       (["--mbs", "2"], "two sizes"),
                                       (["--hidden", "64", "--heads", "5", "--tp", "1"], "heads must divide")])
def test_a_fixed_cost_run_refuses_shapes_it_cannot_fit(argv, why, capsys):
    assert _script("layer_fixed_cost").main(["--device", "cpu", *argv]) == 2
    assert why in capsys.readouterr().err

def test_in_a_row_timing_is_per_gemm(monkeypatch):
    module = _script("gemm_rates")
    calls = []
    monkeypatch.setattr(module, "median_seconds", lambda fn, device, repeats: (fn(), float(len(calls)))[1])
    assert module.Timer("cpu", 1, in_a_row=4)(lambda: calls.append(1)) == 1.0 and len(calls) == 4

def test_a_layer_is_its_runs_time_over_its_layers_without_accumulating_gradients(monkeypatch):
    module = _script("layer_fixed_cost")
    models, grads = [], []
    build = module.nn.Sequential

    def kept(*layers):
        models.append(build(*layers))
        return models[-1]

    class TwoRuns:  # a Timer that runs the step twice and says it took 1 s
        def __init__(self, device, repeats):
            pass

        def __call__(self, step):
            for _ in range(2):
                step()
                grads.append(next(models[0].parameters()).grad.clone())
            return 1.0

    monkeypatch.setattr(module.nn, "Sequential", kept)
    monkeypatch.setattr(module, "Timer", TwoRuns)
    assert module.layer_seconds(32, 4, 1, 8, 1, 4, module.torch.device("cpu"), 1) == 0.25
    assert module.torch.equal(grads[0], grads[1])  # the second backward did not add to the first's gradients

def test_the_fixed_cost_is_the_intercept_of_the_layers_time_against_its_tokens(tmp_path, monkeypatch):
    module = _script("layer_fixed_cost")
    monkeypatch.setattr(module, "layer_seconds", lambda hidden, heads, tp, seq, mbs, *rest: 0.5e-3 + 2e-6 * mbs * seq)
    monkeypatch.setattr(module, "gemm_seconds", lambda *args: 1e-4)
    out = tmp_path / "fixed.json"
    assert module.main(["--device", "cpu", "--hidden", "64", "--heads", "4", "--tp", "1", "--seq", "16",
                        "--mbs", "1,2,4", "--json", str(out)]) == 0
    shape, = json.loads(out.read_text())["shapes"]
    assert shape["intercept_ms"] == pytest.approx({"layer": 0.5, "gemm": 1.2, "rest": -0.7})

def _measured_layers():
    for name in ("layer_fixed_cost_h200_seq512", "layer_fixed_cost_h200_seq2048"):
        found = json.loads((PERF / "measured" / f"{name}.json").read_text())
        for shape in found["shapes"]:
            for row in shape["rows"]:
                yield found["seq"], shape, row

def test_the_planners_layer_time_meets_the_h200s_measured_layers():
    """A check on data the fit never saw: the corpus's constants (fitted on A100- and H100-era publications)
    and the h200-8 profile time one layer's forward and backward within 4% of the H200's eager layers from
    1024 tokens up, and 10-11% short at 512, where the layer's fixed cost, which the planner does not charge,
    weighs most. The bounds are this run's errors with a point of room: a guard against the model drifting
    from a measurement, not a goal."""
    from dataclasses import replace

    from nlp_bench.plan import timing, validation
    from nlp_bench.plan.candidate import Candidate
    from nlp_bench.plan.corpus import corpus_path, load_corpus
    from nlp_bench.spec.models import get_model
    from nlp_bench.spec.systems import load_system

    eff = validation.fit_rows([r for r in load_corpus(corpus_path()) if r.fitted]).efficiency
    h200 = load_system("h200-8")
    errors = {}
    for seq, shape, row in _measured_layers():
        model = replace(get_model("gpt-tiny"), num_layers=4, hidden_size=shape["hidden"], ffn_hidden_size=4 * shape["hidden"],
                        num_attention_heads=shape["heads"], seq_length=seq, vocab_size=128)
        c = Candidate.of(nodes=1, devices_per_node=8, tp=shape["tp"], pp=1, mbs=row["mbs"], gas=1, recompute="none",
                      sequence_parallel=False, flash_attention=True, precision="bf16")
        predicted = timing.timed(timing.work(model, 128, c, h200), eff).compute_s / 4 * 1e3
        errors[(seq, shape["hidden"], shape["tp"], row["tokens"])] = predicted / row["layer_ms"] - 1
    assert len(errors) == 18
    assert all(-0.045 <= e <= 0.045 for (_, _, _, tokens), e in errors.items() if tokens >= 1024), errors
    assert all(-0.13 <= e < 0 for (_, _, _, tokens), e in errors.items() if tokens < 1024), errors
