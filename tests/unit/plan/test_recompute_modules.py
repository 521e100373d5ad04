"""Megatron-core 0.20's --recompute-modules and Transformer Engine's FP8-cached activations in the planner:
each module's stored bytes dropped as docs/planner.md states, its forward timed again, the flag read from a
point's flags and from a predict row, and DeepSeek-V3's run (its report's recompute and FP8 storage) fitting."""

from dataclasses import replace

import pytest

from nlp_bench.errors import SpecError
from nlp_bench.plan import memory, timing
from nlp_bench.plan.candidate import STATED_START, Candidate
from nlp_bench.plan.corpus import load_corpus
from nlp_bench.plan.explicit import read_row
from nlp_bench.spec.models import get_model, pad_vocab
from nlp_bench.spec.switches import decode, read_settings
from nlp_bench.spec.systems import load_system

BASE = replace(STATED_START, recompute="selective", sequence_parallel=True)


def _candidate(modules=("core_attn",), *, tp=2, ep=1, **settings):
    switches = replace(BASE, recompute_modules=tuple(modules), **settings)
    return Candidate.of(1, 8, tp, 1, 1, 4, switches=switches, **({"ep": ep, "etp": 1} if ep > 1 else {}))


def _dense(model, c, recompute=None):
    return memory.layer_activation_bytes(model, c, recompute, moe_share=0.0) if model.moe else \
        memory.layer_activation_bytes(model, c, recompute)


def _sbh(model, c):
    return model.seq_length * c.layout.mbs * model.hidden_size / c.layout.tp  # sequence parallel: split over tp


def test_core_attn_drops_unfused_attentions_score_matrix():
    model = get_model("llama3-8b")
    kept = _candidate((), flash_attention=False)
    dropped = _candidate(("core_attn",), flash_attention=False)
    s, a = model.seq_length, model.num_attention_heads
    assert _dense(model, kept) - _dense(model, dropped) == pytest.approx(5 * a * s * s / 2)
    # flash attention never keeps it: nothing to drop
    assert _dense(model, _candidate(())) == _dense(model, _candidate(("core_attn",)))


def test_mlp_drops_the_dense_mlps_input_and_intermediates():
    model = get_model("llama3-8b")  # SwiGLU: fc1's output 4 ffn/h, the activation's output 2 ffn/h
    c0, c1 = _candidate(), _candidate(("core_attn", "mlp"))
    ffn = model.ffn_hidden_size / model.hidden_size
    assert _dense(model, c0) - _dense(model, c1) == pytest.approx((2 + 6 * ffn) * _sbh(model, c0))


def test_layernorm_drops_the_separate_norms_outputs_only():
    v3 = get_model("deepseek-v3")  # latent attention: the input norm is a module; MoE layers: the pre-MLP norm too
    c0, c1 = _candidate(ep=8), _candidate(("core_attn", "layernorm"), ep=8)
    sbh = _sbh(v3, c0)
    assert _dense(v3, c0) - _dense(v3, c1) == pytest.approx(2 * sbh)  # the down-projections' input
    moe0 = memory.layer_activation_bytes(v3, c0, moe_share=1.0)
    moe1 = memory.layer_activation_bytes(v3, c1, moe_share=1.0)
    assert moe0 - moe1 == pytest.approx(4 * sbh)  # and the router's and experts' input
    # a GQA layer fuses both norms into the next GEMM (TE's LayerNormLinear): nothing to drop
    llama = get_model("llama3-8b")
    assert _dense(llama, c0) == _dense(llama, c1)


def test_mla_up_proj_drops_queries_keys_and_values():
    v3 = get_model("deepseek-v3")
    c0, c1 = _candidate(ep=8), _candidate(("core_attn", "mla_up_proj"), ep=8)
    sbh = _sbh(v3, c0)
    # queries 2, keys and values 4 (as many key/value heads as query heads)
    assert _dense(v3, c0) - _dense(v3, c1) == pytest.approx(6 * sbh)


def _routed_copies(model, c):
    return model.moe.router_topk * model.seq_length * c.layout.mbs * c.layout.routed_share


def test_moe_act_drops_the_experts_activation_output():
    v3 = get_model("deepseek-v3")
    c0, c1 = _candidate(ep=8), _candidate(("core_attn", "moe_act"), ep=8)
    drop = memory.layer_activation_bytes(v3, c0, moe_share=1.0) - memory.layer_activation_bytes(v3, c1, moe_share=1.0)
    assert drop == pytest.approx(_routed_copies(v3, c0) * 2 * v3.moe.ffn_hidden_size)


def test_shared_experts_and_moe_drop_what_they_recompute():
    v3 = get_model("deepseek-v3")
    c0 = _candidate(ep=8)
    shared, whole = _candidate(("core_attn", "shared_experts"), ep=8), _candidate(("core_attn", "moe"), ep=8)
    moe = {c: memory.layer_activation_bytes(v3, c, moe_share=1.0) for c in (c0, shared, whole)}
    width = v3.moe.shared_expert_intermediate_size / v3.hidden_size
    assert moe[c0] - moe[shared] == pytest.approx(6 * width * _sbh(v3, c0))
    routed = _routed_copies(v3, c0) * (2 * v3.hidden_size + 6 * v3.moe.ffn_hidden_size)
    scores = 4 * v3.moe.num_experts * v3.seq_length / c0.layout.tp_cp
    assert moe[c0] - moe[whole] == pytest.approx(6 * width * _sbh(v3, c0) + routed + scores)


def test_fp8_caches_the_fp8_gemms_inputs_in_one_byte():
    model = get_model("llama3-8b")
    bf16, fp8 = _candidate(), _candidate(fp8_format="hybrid")
    ffn = model.ffn_hidden_size / model.hidden_size
    # the QKV and fc1 inputs 2 -> 1 each, fc2's input 2 -> 1 a unit of width, TE's copy of the projection's
    # input beside flash attention's own (+1)
    assert _dense(model, bf16) - _dense(model, fp8) == pytest.approx((1 + 1 + ffn - 1) * _sbh(model, bf16))
    stored = _candidate(activation_func_fp8_input_store=True)  # SwiGLU's input (4 ffn/h) halved
    assert _dense(model, bf16) - _dense(model, stored) == pytest.approx(2 * ffn * _sbh(model, bf16))


def test_the_time_grows_by_the_recomputed_forward():
    model, system = get_model("llama3-8b"), load_system("h100-8")
    vocab = pad_vocab(model.vocab_size, 2)
    c0, c1 = _candidate(), _candidate(("core_attn", "mlp"))
    tokens = c0.layout.global_batch_size * model.seq_length
    mlp = 2 * tokens * 3 * model.hidden_size * model.ffn_hidden_size * model.num_layers
    assert timing.hardware_flops(model, vocab, c1) - timing.hardware_flops(model, vocab, c0) == pytest.approx(mlp)
    eff = timing.Efficiency()
    assert timing.estimate(model, vocab, c1, system, eff).iteration_s > \
        timing.estimate(model, vocab, c0, system, eff).iteration_s
    v3 = get_model("deepseek-v3")
    m, n = v3.mla, v3.num_attention_heads
    up = 2 * c0.layout.global_batch_size * v3.seq_length * n * (m.q_lora_rank * (m.qk_head_dim + m.qk_pos_emb_head_dim)
                           + m.kv_lora_rank * (m.qk_head_dim + m.v_head_dim)) * v3.num_layers
    c2 = _candidate(("core_attn", "mla_up_proj"), ep=8)
    v3_vocab = pad_vocab(v3.vocab_size, 2)
    assert timing.hardware_flops(v3, v3_vocab, c2) - timing.hardware_flops(v3, v3_vocab, _candidate(ep=8)) == \
        pytest.approx(up)


def test_the_flag_is_decoded_from_a_points_flags_and_a_predict_row():
    flags = {"bf16": True, "recompute-granularity": "selective", "recompute-modules": ["layernorm", "moe_act"]}
    assert decode(flags).recompute_modules == ("layernorm", "moe_act")
    assert decode({**flags, "recompute-modules": "mla_up_proj mlp"}).recompute_modules == ("mla_up_proj", "mlp")
    assert decode({"recompute-granularity": "selective"}).recompute_modules == ("core_attn",)  # Megatron's default
    with pytest.raises(SpecError, match="gdn_norm_out"):
        decode({**flags, "recompute-modules": ["gdn_norm_out"]})
    row = {"id": "r", "model": "llama3-8b", "system": "h100-8", "gpus": 8, "global_batch_size": 8,
           "recompute": "selective", "recompute_modules": ["mlp"], "activation_func_fp8_input_store": True}
    planned = read_row(row, 1, "rows.yaml").planned
    assert planned.candidate.switches.recompute_modules == ("mlp",)
    assert planned.candidate.switches.activation_func_fp8_input_store
    with pytest.raises(SpecError, match="rows.yaml row r: recompute_modules goes with recompute selective"):
        read_settings({**row, "recompute": "full"}, STATED_START, "rows.yaml row r")


def test_deepseek_v3s_run_with_its_reports_memory_savings_fits_its_80_gb():
    row = next(r for r in load_corpus() if r.id == "deepseek-v3-2048xh800")
    model, c, system = row.planned.model, row.candidate, row.planned.system
    vocab = pad_vocab(model.vocab_size, c.layout.tp)
    assert c.switches.recompute_modules == ("layernorm", "mla_up_proj", "moe_act")
    gib = memory.footprint(model, vocab, c).gib
    assert gib <= system.device_memory_gib
    assert gib == pytest.approx(57.4, abs=0.1)
    # without them (Megatron's default recompute, 16-bit activations) it would not
    plain = replace(c, switches=replace(c.switches, recompute_modules=("core_attn",), fp8_format=None,
                                        fp8_recipe=None, activation_func_fp8_input_store=False))
    assert memory.footprint(model, vocab, plain).gib > system.device_memory_gib
