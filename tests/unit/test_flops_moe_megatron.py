"""The model FLOPs of every MoE preset, and of variants that take Megatron-LM's other paths (an integer layer
frequency, shared experts without latent attention, a multi-token-prediction module after a dense last layer,
a vocabulary padded for tp 8), against Megatron-LM core_v0.20.0's own num_floating_point_operations. Its
arguments are made from the flags the spec renders, read as Megatron reads them (its own moe_freq_type for
--moe-layer-freq, its validate_args default for --kv-channels): a flag the spec wrote wrong shows here as a
different count."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from megatron_snapshots import megatrons_flops_function

from nlp_bench import flops
from nlp_bench.spec.models import ModelSpec, MoESpec, get_model, pad_vocab

SNAPSHOT = "megatron-lm-core_v0.20.0-d98e8a6.tar.gz"
BATCH = 64


def _megatrons_layer_freq(snapshot: Path):
    """moe_freq_type, the argparse type of --moe-layer-freq, as the snapshot's arguments.py defines it (with the
    pattern evaluator it calls)."""
    import re

    source = (snapshot / "megatron" / "training" / "arguments.py").read_text()
    nodes = [n for n in ast.parse(source).body
             if isinstance(n, ast.FunctionDef) and n.name in ("moe_freq_type", "_eval_pattern")]
    space: dict = {"re": re}
    exec(compile(ast.Module(body=nodes, type_ignores=[]), "arguments.py", "exec"), space)
    return space["moe_freq_type"]


def _megatron_args(model: ModelSpec, vocab_padded: int, layer_freq) -> SimpleNamespace:
    """Megatron's args after parse_args and validate_args for the model's rendered flags: each flag under its
    argparse name, --moe-layer-freq through Megatron's type, every other flag at Megatron's default (None or
    False; --moe-layer-freq's is 1, --kv-channels' is hidden / heads)."""

    class Args(SimpleNamespace):
        def __getattr__(self, name):
            return None

    rendered = {name.replace("-", "_"): value for name, value in model.megatron_flags().items()}
    args = Args(num_layers=model.num_layers, hidden_size=model.hidden_size,
                num_attention_heads=model.num_attention_heads, ffn_hidden_size=model.ffn_hidden_size,
                seq_length=model.seq_length, padded_vocab_size=vocab_padded, moe_layer_freq=1,
                kv_channels=model.hidden_size // model.num_attention_heads)
    args.__dict__.update(rendered)
    args.moe_layer_freq = layer_freq(str(args.moe_layer_freq))
    return args


#: (name, model, tp): the presets, then what takes Megatron's other paths
CASES = [
    *((name, get_model(name), 1) for name in ("moe-tiny", "mixtral-8x7b", "qwen3-30b-a3b", "gpt-oss-20b",
                                               "deepseek-v3")),
    ("gpt-oss-20b tp 8", get_model("gpt-oss-20b"), 8),
    ("moe-tiny every 2nd layer, shared experts", replace(get_model("moe-tiny"), moe=MoESpec(
        4, 2, 128, shared_expert_intermediate_size=96, layer_freq=2)), 1),
    ("qwen3-30b-a3b with a shared expert", replace(get_model("qwen3-30b-a3b"), moe=replace(
        get_model("qwen3-30b-a3b").moe, shared_expert_intermediate_size=768)), 1),
    # 62 layers, experts on the even ones from the fourth: the last layer is dense, and so is the MTP module's
    ("deepseek-v3 with a dense last layer", replace(get_model("deepseek-v3"), num_layers=62, moe=replace(
        get_model("deepseek-v3").moe, layer_freq=2)), 1),
    ("deepseek-v3 without the query latent", replace(get_model("deepseek-v3"), mla=replace(
        get_model("deepseek-v3").mla, q_lora_rank=None)), 1),
]


@pytest.mark.parametrize("model,tp", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_model_flops_equal_megatron_lms_own_function(unpacked, model, tp):
    snapshot = unpacked(SNAPSHOT)
    vocab = pad_vocab(model.vocab_size, tp)
    args = _megatron_args(model, vocab, _megatrons_layer_freq(snapshot))
    theirs = megatrons_flops_function(snapshot)(args, BATCH)
    shape = model.flops_shape(BATCH, vocab)
    assert flops.megatron_model_flops(shape) == pytest.approx(theirs, rel=1e-12)
    assert flops.log_convention(shape) == flops.MEGATRON_MODEL


def test_the_variants_take_the_paths_they_are_named_for():
    """Each variant differs from its preset where it says, so the comparison above covers that path."""
    by_name = {name: model for name, model, _ in CASES}
    tiny = by_name["moe-tiny every 2nd layer, shared experts"]
    assert tiny.megatron_flags()["moe-layer-freq"] == 2 and tiny.moe.layer_pattern(4) == (1, 0, 1, 0)
    dense_last = by_name["deepseek-v3 with a dense last layer"]
    assert dense_last.moe.layer_pattern(62)[-1] == 0 and dense_last.flops_shape(1, 129280).mtp_moe is False
    assert get_model("deepseek-v3").flops_shape(1, 129280).mtp_moe is True
    assert "q-lora-rank" not in by_name["deepseek-v3 without the query latent"].megatron_flags()


def test_neither_counts_the_routers_gemm(unpacked):
    """The router's h x E GEMM is the one MoE GEMM Megatron's formula leaves out: more experts at the same top-k
    and expert width change neither count (ours says so in flops.py)."""
    snapshot = unpacked(SNAPSHOT)
    few, many = (replace(get_model("qwen3-30b-a3b"), moe=replace(get_model("qwen3-30b-a3b").moe, num_experts=e))
                 for e in (8, 256))
    layer_freq = _megatrons_layer_freq(snapshot)
    theirs = [megatrons_flops_function(snapshot)(_megatron_args(m, 151936, layer_freq), BATCH) for m in (few, many)]
    ours = [flops.megatron_model_flops(m.flops_shape(BATCH, 151936)) for m in (few, many)]
    assert theirs[0] == theirs[1] and ours[0] == ours[1] == pytest.approx(theirs[0], rel=1e-12)
    assert "router" in flops.megatron_model_flops.__doc__ + flops._megatron_moe_flops.__doc__


def test_the_moe_formula_as_the_report_writes_it_is_the_count():
    """flops.MOE_FORMULA, symbol by symbol, for a model with grouped queries, its own head size, dense first
    layers and shared experts (no latent attention or MTP, which it names only)."""
    model = replace(get_model("qwen3-30b-a3b"), moe=replace(get_model("qwen3-30b-a3b").moe, first_k_dense=2,
                                                             shared_expert_intermediate_size=512))
    B, s, L, h, V, f = 8, model.seq_length, model.num_layers, model.hidden_size, 151936, 3
    n, g, d, e = model.num_attention_heads, model.query_groups, model.head_dim, model.moe
    q = n * d
    attn = h * (q + 2 * d * g) + q * h
    L_moe = sum(e.layer_pattern(L))
    written = (6 * B * s * (L * attn + (L - L_moe) * f * h * model.ffn_hidden_size
                            + L_moe * f * h * (e.router_topk * e.ffn_hidden_size + e.shared_expert_intermediate_size)
                            + h * V) + 6 * B * s ** 2 * q * L)
    assert "6*B*s*(L*attn + L_dense*f*h*ffn + L_moe*f*h*(k*ffn_e + ffn_s) + h*V) + 6*B*s^2*q*L" in flops.MOE_FORMULA
    assert flops.megatron_model_flops(model.flops_shape(B, V)) == pytest.approx(written, rel=1e-12)
