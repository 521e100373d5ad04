"""The planner times matrix products against the GEMM rate each device was measured to reach (the profile's,
else the device table's, else a stated share of the peak), FP8 runs pay for their casts, and
benchmark/perf/gemm_rates.py measures the rate (here on CPU at toy sizes)."""

import importlib.util
import json
import os
from dataclasses import replace

import pytest

from nlp_bench.plan import timing
from nlp_bench.plan.candidate import Candidate
from nlp_bench.spec import devices
from nlp_bench.spec.models import get_model, pad_vocab
from nlp_bench.spec.systems import load_system

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmark", "perf", "gemm_rates.py")


def test_the_rate_is_the_profiles_else_the_device_tables_else_a_stated_share_of_the_peak():
    h100, a100, gh200 = load_system("h100-8"), load_system("selene"), load_system("jupiter")
    assert h100.matmul_rate() == (750.5, pytest.approx(h100.matmul_rate()[1]))
    assert "measured on an H100" in h100.matmul_rate()[1] and h100.matmul_rate(fp8=True)[0] == 1375
    assert replace(h100, device_name="H200-SXM-141GB").matmul_rate()[0] == 795.9
    assert a100.matmul_rate()[0] == 258 and a100.matmul_rate(fp8=True) == (None, "")  # an A100 has no FP8
    rate, why = gh200.matmul_rate()
    assert rate == pytest.approx(989 * devices.MATMUL_FRACTION) and "0.8 of its peak assumed" in why
    assert gh200.matmul_rate(fp8=True)[0] == pytest.approx(1979 * devices.MATMUL_FP8_FRACTION)
    own = replace(h100, matmul_tflops=700.0, sources={"matmul_tflops": "our own run"})
    assert own.matmul_rate() == (700.0, "our own run")
    assert replace(gh200, peak_tflops=None).matmul_rate() == (None, "")
    # every measured rate lies below its device's peak
    for d in devices.DEVICES:
        assert d.matmul_tflops is None or d.matmul_tflops < d.peak_tflops


def _work(system, precision="bf16", tp=1):
    model = get_model("gpt-13b")
    c = Candidate(1, 8, tp, 1, 1, 8, precision=precision, sequence_parallel=tp > 1)
    return model, c, timing.work(model, pad_vocab(model.vocab_size, tp), c, system)


def test_gemm_time_follows_the_measured_rate_not_the_peak():
    system = replace(load_system("h100-8"), memory_bandwidth_gbps=1e12)  # element-wise work costs nothing
    eff = timing.Efficiency(gemm_half=8.0)
    _, _, slow = _work(replace(system, matmul_tflops=400.0))
    _, _, fast = _work(replace(system, matmul_tflops=800.0, peak_tflops=1.0))
    assert timing.timed(slow, eff).compute_s == pytest.approx(2 * timing.timed(fast, eff).compute_s, rel=1e-6)


@pytest.mark.parametrize("tp, per_hidden", [(1, 16), (2, 10), (8, 5.5)])
def test_fp8_pays_for_casting_each_linear_layers_input_and_output_gradient(tp, per_hidden):
    system = load_system("h100-8")
    model, c, bf16 = _work(system, tp=tp)
    _, _, fp8 = _work(system, "fp8", tp=tp)
    # GPT (multi-head, GeLU MLP of 4h): inputs h + h/tp + h + 4h/tp, output gradients 3h/tp + h + 4h/tp + h,
    # 4 bytes each (16-bit read, FP8 written twice: as is and transposed)
    tokens = c.mbs * model.seq_length
    assert per_hidden == 4 + 12 / tp
    extra = model.num_layers * 4 * per_hidden * model.hidden_size * tokens
    assert fp8.elementwise_bytes - bf16.elementwise_bytes == pytest.approx(extra, rel=1e-9)


def _script():
    spec = importlib.util.spec_from_file_location("gemm_rates", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("hidden, tp", [(4096, 1), (12288, 8)])
def test_a_layers_gemms_are_megatrons_linear_flops(hidden, tp):
    tokens = 2048
    gemms = _script().layer_gemms(hidden, tp, tokens)
    assert len(gemms) == 12
    assert sum(2 * m * n * k for m, n, k in gemms) == 72 * tokens * hidden ** 2 // tp


def test_gemm_rates_measures_every_layer_and_writes_json(tmp_path):
    out = tmp_path / "rates.json"
    module = _script()
    assert module.main(["--device", "cpu", "--tokens", "32", "--hidden", "64,128", "--tp", "1,2", "--square", "32",
                        "--copy-mib", "1", "--repeats", "2", "--json", str(out)]) == 0
    found = json.loads(out.read_text())
    dtypes = {r["dtype"] for r in found["layers"]}
    assert "bf16" in dtypes
    assert {(r["hidden"], r["tp"]) for r in found["layers"] if r["dtype"] == "bf16"} == {(64, 1), (64, 2), (128, 1),
                                                                                         (128, 2)}
    assert all(r["tflops"] > 0 for r in found["layers"] + found["square"]) and found["copy_gbps"] > 0


def test_gemm_rates_refuses_an_unknown_dtype(capsys):
    assert _script().main(["--device", "cpu", "--dtypes", "fp4"]) == 2
    assert "unknown dtype fp4" in capsys.readouterr().err


@pytest.mark.parametrize("key", ["matmul_tflops", "matmul_fp8_tflops"])
def test_a_profiles_measured_rate_must_be_a_positive_number(site, key):
    import yaml

    from nlp_bench.errors import SpecError

    profile = site / "slurm" / "systems" / "h100-8.yaml"
    data = yaml.safe_load(profile.read_text())
    data[key] = -5
    profile.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match=f"{key} must be a positive number"):
        load_system("h100-8")
    data[key] = 640
    profile.write_text(yaml.safe_dump(data))
    assert load_system("h100-8").matmul_rate(fp8=key.endswith("fp8_tflops"))[0] == 640
