import pytest

from nlp_bench.errors import LayoutError, SpecError
from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.spec.layout import Layout, problems, validate
from nlp_bench.spec.models import get_model, pad_vocab
from nlp_bench.spec.systems import known_systems, load_system


def test_presets_match_the_benchmark():
    m13, m175 = get_model("gpt-13b"), get_model("gpt-175b")
    assert (m13.hidden_size, m13.num_layers, m13.num_attention_heads, m13.ffn_hidden_size) == (5120, 40, 32, 20480)
    assert (m175.hidden_size, m175.num_layers, m175.num_attention_heads, m175.ffn_hidden_size) == (12288, 96, 96, 49152)
    assert m13.seq_length == m175.seq_length == 2048 and m13.vocab_size == 50257
    assert 12.5e9 < m13.parameters(50432) < 13.5e9
    assert 170e9 < m175.parameters(51200) < 180e9


@pytest.mark.parametrize("tp,padded", [(1, 50304), (2, 50432), (4, 50688), (8, 51200)])
def test_vocab_padded_as_megatron_pads(tp, padded):
    assert pad_vocab(50257, tp) == padded


def test_layout_derivation():
    lay = Layout(nodes=96, devices_per_node=4, tp=8, pp=8, mbs=1, gas=16)
    assert (lay.world, lay.dp, lay.global_batch_size) == (384, 6, 96)
    lay = Layout(nodes=8, devices_per_node=4, tp=2, pp=4, mbs=1, gas=256)
    assert (lay.dp, lay.global_batch_size) == (4, 1024)


def test_layout_reasons_are_in_words():
    m = get_model("gpt-13b")
    found = problems(m, Layout(nodes=3, devices_per_node=4, tp=3, pp=3, mbs=1, gas=1))
    text = " ".join(found)
    assert "tp 3 must divide the number of attention heads 32" in text
    assert "pp 3 must divide the number of layers 40" in text
    assert any("tp x pp = 9 must divide the 12 devices" in f for f in found)
    with pytest.raises(LayoutError, match="impossible layout for gpt-13b"):
        validate(m, Layout(nodes=1, devices_per_node=4, tp=8, pp=1, mbs=1, gas=1))
    assert problems(m, Layout(nodes=0, devices_per_node=4, tp=1, pp=1, mbs=1, gas=1)) == [
        "nodes must be a positive integer, got 0"]


def test_systems():
    assert {"juwels-booster", "jureca-dc", "local", "local-slurm", "jupiter", "h100-8"} <= set(known_systems())
    for name in known_systems():  # every shipped profile loads
        assert load_system(name).devices_per_node >= 1
    booster = load_system("juwels-booster")
    assert booster.devices_per_node == 4 and booster.device_memory_gib == 40
    assert booster.sbatch["partition"] == "booster" and booster.sbatch["cpus-per-task"] == 48
    local = load_system("local")
    assert local.backend == "gloo" and local.executor == "local" and local.launcher == "direct"
    with pytest.raises(SpecError, match=r"unknown system 'juwels-boster' \(did you mean 'juwels-booster'\?\)"):
        load_system("juwels-boster")


def test_benchmark_tags_reproduce_the_reference():
    bench = load_benchmark("nlp")
    assert bench.default_tag == "175"
    p175 = bench.point()
    assert p175.tag == "175" and p175.layout.nodes == 96 and p175.layout.global_batch_size == 96
    assert p175.train["bf16"] is True and p175.train["init-method-std"] == 0.0048 and not p175.train["fp16"]
    p13 = bench.point("13")
    assert (p13.layout.tp, p13.layout.pp, p13.layout.gas, p13.layout.global_batch_size) == (2, 4, 256, 1024)
    assert p13.train["fp16"] is True and p13.train["lr-warmup-samples"] == 216320
    smoke = bench.point("smoke")
    assert smoke.system.name == "local" and smoke.layout.world == 2 and smoke.layout.tp == 2
    assert smoke.train["mock-data"] is True


def test_layout_overrides_and_their_errors():
    bench = load_benchmark("nlp")
    p = bench.point("13", nodes=16, gas=128)
    assert p.layout.dp == 8 and p.layout.global_batch_size == 1024
    with pytest.raises(LayoutError, match="tp 5 must divide"):
        bench.point("13", tp=5)
    with pytest.raises(SpecError, match="has 1"):
        bench.point("smoke", nodes=2)


def test_benchmark_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("tags: {x: {model: gpt-tiny, system: local, nodes: 1, tpp: 2}}\n")
    with pytest.raises(SpecError, match=r"unknown key 'tpp' \(did you mean 'tp'\?\)"):
        load_benchmark(str(bad))
    bad.write_text("tags: [1, 2\n")
    with pytest.raises(SpecError, match="invalid YAML"):
        load_benchmark(str(bad))
    with pytest.raises(SpecError, match="benchmark file not found"):
        load_benchmark(str(tmp_path / "missing.yaml"))
    bad.write_text("tags: {x: {model: gpt-tiny, system: local, nodes: 1, train: {num-layers: 3}}}\n")
    with pytest.raises(SpecError, match="may not set num-layers"):
        load_benchmark(str(bad)).point("x")


def test_one_home_for_the_layout_rules():
    """The spec, the planner and the trainer ask the same function, so the same sizes break the same rules."""
    from nlp_bench.plan.candidate import Candidate
    from nlp_bench.spec.layout import parallel_violations, violations

    m = get_model("gpt-13b")
    layout = Layout(nodes=3, devices_per_node=4, tp=3, pp=3, mbs=1, gas=1)
    by_spec = [v.rule for v in violations(m, layout)]
    by_flags = [v.rule for v in parallel_violations(world=12, tp=3, pp=3, num_layers=40, num_attention_heads=32,
                                                    ffn_hidden_size=20480, hidden_size=5120, seq_length=2048)]
    assert by_spec == by_flags == ["tp-pp-world", "tp-heads", "tp-ffn", "pp-layers"]
    # interleaving: vp as chunks per rank (planner) and as layers per chunk (Megatron's flag) agree
    chunks = parallel_violations(world=64, tp=1, pp=8, num_layers=96, num_attention_heads=96, ffn_hidden_size=4,
                                 chunks=2, micro_batches=12)
    per_chunk = parallel_violations(world=64, tp=1, pp=8, num_layers=96, num_attention_heads=96, ffn_hidden_size=4,
                                    layers_per_chunk=6, micro_batches=12)
    assert [v.rule for v in chunks] == [v.rule for v in per_chunk] == ["vp-microbatches"]
    assert Candidate(16, 4, 1, 8, 1, 12, vp=2).problems(m)[-1] == chunks[0].message.replace("(12)", "(12)")
