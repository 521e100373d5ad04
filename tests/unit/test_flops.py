import pytest

from nlp_bench import flops
from nlp_bench.analysis.reference import reference_rows
from nlp_bench.spec.models import get_model, pad_vocab


def test_reference_times_to_report():
    assert round(flops.time_to_report(36055.39), 2) == 554.70
    assert round(flops.time_to_report(60777.68), 2) == 329.07
    assert flops.time_to_report(1000.0, tokens=5000) == 5.0


def test_jupiter_tflops_of_the_13b_reference():
    # the JUPITER 13B reference row: B=1024, s=2048, L=40, h=5120, V=50432, W=32 at 60777.68 tokens/s -> 206.88
    shape = flops.Shape(1024, 2048, 40, 5120, 50432, 20480, recompute=True)
    seconds = 1024 * 2048 / 60777.68
    assert round(flops.tflops_per_device(flops.jupiter_flops(shape), seconds, 32), 2) == 206.88


def test_175b_conventions_differ_as_published():
    # the 175B reference (96 nodes, 5.453 s/iteration) is ~135 JUPITER, ~100 Megatron model FLOPs
    m = get_model("gpt-175b")
    shape = flops.Shape(96, 2048, m.num_layers, m.hidden_size, pad_vocab(m.vocab_size, 8), m.ffn_hidden_size,
                        recompute=True)
    assert flops.tflops_per_device(flops.jupiter_flops(shape), 5.453, 384) == pytest.approx(135, abs=1)
    assert flops.tflops_per_device(flops.megatron_model_flops(shape), 5.453, 384) == pytest.approx(100, abs=1)


def test_recompute_and_swiglu_factors():
    base = flops.Shape(8, 128, 2, 64, 1024, 256)
    assert flops.jupiter_flops(flops.Shape(8, 128, 2, 64, 1024, 256, recompute=True)) / flops.jupiter_flops(base) == pytest.approx(4 / 3)
    assert flops.jupiter_flops(flops.Shape(8, 128, 2, 64, 1024, 256, swiglu=True)) / flops.jupiter_flops(base) == pytest.approx(32 / 24)


def test_reference_rows_reproduce_the_published_table():
    rows = {r["Model_Size"]: r for r in reference_rows()}
    assert rows[13]["Nodes"] == 8 and rows[13]["Batch_Size"] == 1024
    assert round(rows[13]["time_to_report_in_seconds"], 2) == 329.07
    assert round(rows[13]["Avg_TFLOPs/GPU"], 2) == 206.88
    assert rows[175]["Nodes"] == 96 and rows[175]["Batch_Size"] == 96
    assert (rows[175]["Tensor_Parallel"], rows[175]["Pipeline_Parallel"], rows[175]["GAS"]) == (8, 8, 16)
    assert round(rows[175]["time_to_report_in_seconds"], 2) == 554.70
