"""Mixture-of-experts models: each preset's total and active parameters against its model card, the
layers that have experts, a kept point's model read back, what the built-in trainer lacks, and the model FLOPs
against Megatron-LM 0.20's own function."""

from __future__ import annotations

from dataclasses import replace

import pytest
from megatron_snapshots import megatrons_flops_function

from nlp_bench import flops
from nlp_bench.spec.models import ARCHITECTURE_FLAGS, PRESETS, MoESpec, from_flags, from_record, get_model, pad_vocab

MOE_PRESETS = ("moe-tiny", "mixtral-8x7b", "qwen3-30b-a3b", "gpt-oss-20b", "deepseek-v3")


def _as_published(count: int, billions: float, digits: int) -> bool:
    """Whether a card writes `count` as `billions` to `digits` decimals: rounded, or cut (Qwen3's 3.35B
    active is written 3.3B)."""
    unit = 10.0 ** -digits
    return round(count / 1e9, digits) == billions or billions <= count / 1e9 < billions + unit


@pytest.mark.parametrize("preset,total,active,digits,input_embedding,url", [
    # "46.7B total parameters but only uses 12.9B parameters per token": https://mistral.ai/news/mixtral-of-experts
    ("mixtral-8x7b", 46.7, 12.9, 1, True, "https://huggingface.co/mistralai/Mixtral-8x7B-v0.1"),
    # "Number of Parameters: 30.5B in total and 3.3B activated"
    ("qwen3-30b-a3b", 30.5, 3.3, 1, True, "https://huggingface.co/Qwen/Qwen3-30B-A3B"),
    # "21B parameters with 3.6B active parameters"; the card (arXiv:2508.10925, Table 1) counts 3.61B active
    # with the unembedding only
    ("gpt-oss-20b", 21, 3.6, (0, 1), False, "https://huggingface.co/openai/gpt-oss-20b"),
    # "671B total parameters with 37B activated for each token", the MTP module's weights counted apart
    ("deepseek-v3", 671, 37, 0, False, "https://huggingface.co/deepseek-ai/DeepSeek-V3"),
])
def test_parameters_are_the_model_cards(preset, total, active, digits, input_embedding, url):
    model = get_model(preset)
    assert url in model.source
    total_digits, active_digits = digits if isinstance(digits, tuple) else (digits, digits)
    v = model.vocab_size  # the cards count the tokenizer's vocabulary, unpadded
    assert _as_published(model.total_parameters(v), total, total_digits)
    assert _as_published(model.active_parameters(v, input_embedding=input_embedding), active, active_digits)
    assert model.parameters(v) == model.total_parameters(v)


def test_deepseek_v3_counts_its_mtp_module_apart_and_its_first_three_layers_dense():
    model = get_model("deepseek-v3")
    v, h = model.vocab_size, model.hidden_size
    extra = model.total_parameters(v, mtp=True) - model.total_parameters(v)
    # one layer with experts, two norms in and one out, the 2h -> h projection: ~11.6B, as the card's 14B MTP
    # weights less the embedding and output layer it keeps its own copies of (2 x 0.93B)
    assert round((extra + 2 * v * h) / 1e9) == 13 and round(extra / 1e9, 1) == 11.6
    assert model.moe.layer_pattern(model.num_layers) == (0, 0, 0) + (1,) * 58
    assert MoESpec(8, 2, 64, first_k_dense=1, layer_freq=2).layer_pattern(6) == (0, 0, 1, 0, 1, 0)


def test_the_tiny_model_by_hand():
    model = get_model("moe-tiny")
    h, f, e, k, v = 64, 128, 4, 2, 32000
    attention = h * h + 2 * h * 2 * 16 + h * h  # 4 heads of 16 in 2 query groups
    expert = 3 * h * f
    layer = lambda experts: attention + h * e + experts * expert + 2 * h  # noqa: E731  router, RMSNorms
    assert model.total_parameters(v) == 4 * layer(e) + h + 2 * v * h
    assert model.active_parameters(v) == 4 * layer(k) + h + 2 * v * h
    assert model.active_parameters(v, input_embedding=False) == 4 * layer(k) + h + v * h
    assert model.moe.dropless and model.builtin_lacks == ()


def test_dense_models_have_all_their_parameters_active():
    for model in PRESETS.values():
        if model.moe is None:
            v = model.vocab_size
            assert model.active_parameters(v) == model.total_parameters(v) == model.parameters(v)


def test_what_the_builtin_trainer_lacks_is_named():
    assert get_model("deepseek-v3").builtin_lacks == ("multi-head latent attention", "multi-token prediction")
    assert get_model("gpt-oss-20b").builtin_lacks[:2] == ("attention sinks", "sliding-window attention")
    assert "query/key layernorm" in get_model("qwen3-30b-a3b").builtin_lacks
    assert get_model("mixtral-8x7b").builtin_lacks == ()
    assert replace(get_model("llama-tiny"), kv_channels=32).builtin_lacks == ()  # 128 / 4 heads: as it builds


def test_a_kept_point_gives_back_its_experts_and_latent_attention():
    for name in MOE_PRESETS:
        model = get_model(name)
        assert from_record(model.to_dict(), {}) == model


@pytest.mark.parametrize("preset,tp", [(name, 1) for name in MOE_PRESETS] + [("deepseek-v3", 8)])
def test_moe_model_flops_are_megatron_lms_own(unpacked, preset, tp):
    """flops.megatron_model_flops equals Megatron-LM 0.20's num_floating_point_operations with the model's
    MoE, latent attention and MTP arguments."""
    from types import SimpleNamespace

    class Args(SimpleNamespace):
        def __getattr__(self, name):  # every flag not set here is Megatron's None/False
            return None

    model = get_model(preset)
    vocab = pad_vocab(model.vocab_size, tp)
    e, m = model.moe, model.mla
    args = Args(num_layers=model.num_layers, hidden_size=model.hidden_size,
                num_attention_heads=model.num_attention_heads, group_query_attention=model.num_query_groups is not None,
                num_query_groups=model.num_query_groups, kv_channels=model.head_dim,
                ffn_hidden_size=model.ffn_hidden_size, swiglu=model.swiglu, padded_vocab_size=vocab,
                seq_length=model.seq_length, num_experts=e.num_experts, moe_router_topk=e.router_topk,
                moe_layer_freq=list(e.layer_pattern(model.num_layers)), moe_ffn_hidden_size=e.ffn_hidden_size,
                moe_shared_expert_intermediate_size=e.shared_expert_intermediate_size or None,
                mtp_num_layers=model.mtp_num_layers or None, multi_latent_attention=m is not None)
    if m is not None:
        args.group_query_attention = False
        args.__dict__.update(q_lora_rank=m.q_lora_rank, kv_lora_rank=m.kv_lora_rank, qk_head_dim=m.qk_head_dim,
                             qk_pos_emb_head_dim=m.qk_pos_emb_head_dim, v_head_dim=m.v_head_dim)
    theirs = megatrons_flops_function(unpacked("megatron-lm-core_v0.20.0-d98e8a6.tar.gz"))(args, 64)
    shape = model.flops_shape(64, vocab)
    assert flops.megatron_model_flops(shape) == pytest.approx(theirs, rel=1e-12)
    assert flops.log_convention(shape) == flops.MEGATRON_MODEL
    if m is not None:  # and without the query latent, as DeepSeek-V2-Lite has it
        args.q_lora_rank = None
        bare = replace(model, mla=replace(m, q_lora_rank=None))
        theirs = megatrons_flops_function(unpacked("megatron-lm-core_v0.20.0-d98e8a6.tar.gz"))(args, 64)
        assert flops.megatron_model_flops(bare.flops_shape(64, vocab)) == pytest.approx(theirs, rel=1e-12)


def test_a_builtin_point_of_a_model_it_cannot_build_is_refused_naming_the_parts(tmp_path):
    from nlp_bench.app.refusals import point_refusals
    from nlp_bench.spec.benchmark import load_benchmark

    path = tmp_path / "b.yaml"
    path.write_text("name: b\ntags:\n  t:\n    model: deepseek-v3\n    system: h100-8\n    nodes: 8\n    tp: 8\n"
                    "    pp: 1\n    train: {train-iters: 2, lr: 0.1, mock-data: true}\n")
    point = load_benchmark(str(path)).point("t", trainer="builtin")
    assert point.unrunnable == ("the built-in trainer has no multi-head latent attention, multi-token prediction "
                                "(model deepseek-v3): rendered and planned but not run here; use --trainer megatron-lm")
    assert point_refusals(point, None, force=True) == [f"{point.id}: {point.unrunnable}"]


@pytest.mark.parametrize("value,layers", [(2, (1, 0, 1, 0)), ("([0]*1+[1]*3)", (0, 1, 1, 1)),
                                          ("[0,0,1,0]", (0, 0, 1, 0)), ("1", (1, 1, 1, 1))])
def test_moe_layer_freq_reads_megatrons_forms(value, layers):
    flags = {"num-layers": 4, "hidden-size": 64, "num-attention-heads": 4, "seq-length": 8,
             "num-experts": 4, "moe-layer-freq": value}
    assert from_flags("m", flags, 100).moe.layer_pattern(4) == layers


def test_a_moe_layer_freq_no_spec_says_is_refused():
    from nlp_bench.errors import SpecError

    flags = {"num-layers": 4, "hidden-size": 64, "num-attention-heads": 4, "seq-length": 8, "num-experts": 4}
    with pytest.raises(SpecError, match=r"--moe-layer-freq \[1,1,0,1\]: not first-k dense then every n-th layer"):
        from_flags("m", {**flags, "moe-layer-freq": "[1,1,0,1]"}, 100)


def test_every_flag_a_model_writes_is_one_megatron_lm_0_20_knows():
    from conftest import ROOT

    from nlp_bench.spec.megatron.tables import read_table

    table = read_table(ROOT / "benchmark" / "megatron-lm" / "flags" / "0.20.0.tsv")
    assert ARCHITECTURE_FLAGS - set(table.flags) == set()


def test_the_models_parts_as_megatron_flags():
    deepseek = get_model("deepseek-v3").megatron_flags()
    assert deepseek["moe-layer-freq"] == "([0]*3+[1]*58)" and deepseek["moe-router-score-function"] == "sigmoid"
    assert (deepseek["moe-router-num-groups"], deepseek["moe-router-group-topk"]) == (8, 4)
    assert deepseek["moe-router-enable-expert-bias"] and deepseek["moe-router-load-balancing-type"] == "seq_aux_loss"
    assert deepseek["multi-latent-attention"] and deepseek["q-lora-rank"] == 1536 and deepseek["mtp-num-layers"] == 1
    assert "group-query-attention" not in deepseek
    oss = get_model("gpt-oss-20b").megatron_flags()
    assert (oss["softmax-type"], oss["window-size"], oss["window-attn-skip-freq"]) == ("learnable", "128,0", 2)
    assert "disable-bias-linear" not in oss and oss["kv-channels"] == 64
    assert get_model("mixtral-8x7b").megatron_flags()["moe-aux-loss-coeff"] == 0.02
    assert "moe-layer-freq" not in get_model("mixtral-8x7b").megatron_flags()  # every layer: Megatron's default
