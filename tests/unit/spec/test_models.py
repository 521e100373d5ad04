"""One model definition: presets with their published shapes, the Megatron flags written from it and read back,
the points and kept records that carry it, and what the planner and the layout rules take from it."""

import json

import pytest

from nlp_bench.errors import LayoutError, SpecError
from nlp_bench.plan.candidate import Candidate
from nlp_bench.plan.memory import parameters_on_most_loaded_shard
from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.spec.models import ARCHITECTURE_FLAGS, PRESETS, from_flags, from_record, get_model


@pytest.mark.parametrize("name,published", [("llama3-8b", 8_030_261_248), ("llama3-70b", 70_553_706_496),
                                            ("llama3.1-405b", 405_853_388_800)])
def test_llama_parameter_counts_are_the_published_ones(name, published):
    """The safetensors parameter counts of the meta-llama checkpoints (untied, no biases, RMSNorm, GQA)."""
    model = get_model(name)
    assert model.parameters(model.vocab_size) == published


def test_gpt_parameter_count_with_biases_tied_and_learned_positions():
    m = get_model("gpt-tiny")
    h, f, L, V, P = 128, 512, 2, 50257, 128
    per_layer = 4 * h * h + 2 * h * f + (3 * h + h + f + h) + 2 * 2 * h
    assert m.parameters(V) == L * per_layer + 2 * h + V * h + P * h


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_flags_written_from_a_model_read_back_as_that_model(name):
    model = PRESETS[name]
    flags = {**model.megatron_flags(), "num-layers": model.num_layers, "hidden-size": model.hidden_size,
             "num-attention-heads": model.num_attention_heads, "ffn-hidden-size": model.ffn_hidden_size,
             "seq-length": model.seq_length, "max-position-embeddings": model.max_position_embeddings}
    back = from_flags(model.name, flags, model.vocab_size)
    assert {k: v for k, v in back.to_dict().items() if k not in ("nominal_billions", "source")} == \
        {k: v for k, v in model.to_dict().items() if k not in ("nominal_billions", "source")}
    assert set(model.megatron_flags()) <= ARCHITECTURE_FLAGS


def test_gpt_presets_write_no_architecture_flags_at_megatrons_defaults():
    assert get_model("gpt-175b").megatron_flags() == {}
    assert get_model("gpt-175b", position_embedding_type="rope").megatron_flags() == {"position-embedding-type": "rope"}


def test_a_point_carries_the_models_flags_and_its_record_reads_back_the_model():
    point = load_benchmark().point("llama3-70b")
    assert point.train["group-query-attention"] is True and point.train["num-query-groups"] == 8
    assert point.train["vocab-size"] == 128256 and point.train["rotary-base"] == 500000
    kept = json.loads(json.dumps(point.to_dict()))
    assert from_record(kept["model"], kept["train"]) == point.model


def test_a_record_kept_before_models_had_an_architecture_reads_it_from_its_flags():
    old = {"name": "gpt-13b", "num_layers": 40, "hidden_size": 5120, "num_attention_heads": 32,
           "ffn_hidden_size": 20480, "seq_length": 2048, "max_position_embeddings": 2048, "vocab_size": 50257,
           "nominal_billions": 13, "vocab_padded": 50432, "size_billions": 13}
    model = from_record(old, {"position-embedding-type": "rope", "swiglu": True, "bf16": True})
    assert model.swiglu and model.position_embedding_type == "rope" and model.nominal_billions == 13
    assert model.num_query_groups is None and model.bias


def test_a_tag_may_not_set_what_the_model_says(tmp_path):
    path = tmp_path / "b.yaml"
    path.write_text("name: b\ntags:\n  t:\n    model: gpt-tiny\n    system: local\n    nodes: 1\n"
                    "    train: {swiglu: true, train-iters: 2, lr: 0.1, mock-data: true}\n")
    with pytest.raises(SpecError, match="train may not set swiglu: the model says them"):
        load_benchmark(str(path)).point("t")


@pytest.mark.parametrize("overrides,words", [({"mlp": "relu"}, "mlp must be one of gelu, swiglu"),
                                             ({"bias": 1}, "bias must be true or false"),
                                             ({"num_query_groups": 3}, "do not split into 3 query groups"),
                                             ({"colour": 2}, "unknown model field colour")])
def test_bad_model_overrides_say_why(overrides, words):
    with pytest.raises(SpecError, match=words):
        get_model("llama-tiny", **overrides)


def test_tp_must_divide_the_query_groups_or_be_a_multiple_of_them():
    from nlp_bench.spec.layout import Layout, valid_layout

    assert load_benchmark().point("llama3-8b", tp=4).layout.tp == 4  # 8 groups over 4 ranks
    model = get_model("gpt-125m", num_query_groups=4)  # 12 heads in 4 groups
    assert valid_layout(model, Layout(3, 4, 2, 1, 1, 1)).tp == 2  # 2 groups per rank
    assert valid_layout(model, Layout(3, 4, 12, 1, 1, 1)).tp == 12  # each group kept by 3 ranks
    with pytest.raises(LayoutError, match="tp 6 must divide the 4 query groups or be a multiple of them"):
        valid_layout(model, Layout(3, 4, 6, 1, 1, 1))


def test_memory_counts_one_copy_of_a_key_value_head_per_rank_when_tp_exceeds_the_groups():
    model = get_model("llama3-70b")
    vocab = 128256

    def shard(tp):
        return parameters_on_most_loaded_shard(model, vocab, Candidate.of(nodes=16, devices_per_node=32, tp=tp, pp=8,
                                                                       mbs=1, gas=1))

    kv_per_layer = 2 * 128 * 8192  # one key and one value head of 128
    # tp 8: one group per rank; tp 32: still one group per rank, the rest split 4 times finer
    assert shard(32) - (shard(8) - kv_per_layer * 10) / 4 == pytest.approx(kv_per_layer * 10, rel=1e-9)


def test_layer_activations_count_the_query_groups_and_swiglu():
    from nlp_bench.plan.memory import layer_activation_bytes

    c = Candidate.of(nodes=1, devices_per_node=1, tp=1, pp=1, mbs=2, gas=1, recompute="selective")
    gpt = get_model("gpt-1.3b")
    sbh = gpt.seq_length * 2 * gpt.hidden_size
    assert layer_activation_bytes(gpt, c) == 34 * sbh  # Korthikanti et al.'s 34·s·b·h
    llama = get_model("llama-tiny")  # 2 groups of 4 heads, SwiGLU of 352 on a hidden size of 128
    sbh = llama.seq_length * 2 * llama.hidden_size
    assert layer_activation_bytes(llama, c) == pytest.approx((10 + 4 + 4 * 2 / 4 + 6 * 352 / 128) * sbh)


@pytest.mark.parametrize("overrides,words", [("rope", "model_overrides must map model fields to values"),
                                             ("{mlp: relu}", "model_overrides: model field mlp must be one of")])
def test_bad_model_overrides_in_a_benchmark_file_name_the_file_and_tag(tmp_path, overrides, words):
    path = tmp_path / "b.yaml"
    path.write_text(f"name: b\ntags:\n  t:\n    model: gpt-tiny\n    system: local\n    nodes: 1\n"
                    f"    model_overrides: {overrides}\n")
    with pytest.raises(SpecError, match=f"{path}: tag 't': {words}"):
        load_benchmark(str(path))


def test_pipeline_on_xla_is_kept_only_where_the_tags_block_for_that_system_sets_it(tmp_path):
    path = tmp_path / "b.yaml"
    path.write_text("name: b\ntags:\n  t:\n    model: gpt-13b\n    system: h100-8\n    nodes: 8\n    tp: 8\n"
                    "    pp: 4\n    train: {train-iters: 2, lr: 0.1, mock-data: true}\n"
                    "    systems:\n      trn2: {nodes: 8, tp: 32, pp: 2}\n")
    bench = load_benchmark(str(path))
    with pytest.raises(LayoutError, match="pipeline parallelism .pp 4. is not available with the xla backend"):
        bench.point("t", "trn1", tp=32)  # the tag's pp 4 was not written for trn1
    assert "rendered and planned but not run here" in bench.point("t", "trn2").unrunnable
    assert bench.point("t").unrunnable is None
