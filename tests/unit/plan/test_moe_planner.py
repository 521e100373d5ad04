"""The planner on mixture-of-experts models: expert weights and states placed as Megatron-core places them
(over ep x expert tp, their optimizer states over expert dp), the routed tokens' activations, the
all-to-all inside and across nodes, the expert GEMMs at their own side, and ep / expert tp as ranked axes."""

import json

import pytest

from nlp_bench.plan import experts, memory, ranking, timing
from nlp_bench.plan.candidate import Candidate
from nlp_bench.plan.explicit import load_rows
from nlp_bench.plan.points import from_point
from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.spec.models import get_model, pad_vocab
from nlp_bench.spec.systems import load_system

MOE_TAGS = ("qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-20b", "deepseek-v3")
EFF = timing.Efficiency(gemm=0.92, gemm_half=120, network=0.8, memory=0.87)


def _tag(tag):
    return from_point(load_benchmark("nlp").point(tag, None))


@pytest.mark.parametrize("tag", MOE_TAGS)
def test_every_published_moe_layout_of_the_tags_is_predicted_to_fit(tag):
    planned = _tag(tag)
    c, model = planned.candidate, planned.model
    assert c.layout.ep > 1
    gib = memory.footprint(model, pad_vocab(model.vocab_size, c.layout.tp), c).gib
    assert gib <= planned.system.device_memory_gib, f"{tag}: {gib:.1f} GiB"


def test_expert_weights_are_split_over_ep_and_expert_tp_and_their_states_over_expert_dp():
    model = get_model("qwen3-30b-a3b")
    vocab = pad_vocab(model.vocab_size, 1)
    c = Candidate.of(2, 8, 1, 1, 1, 64, ep=16, etp=1)
    (dense, routed), = memory.stage_split(model, vocab, c)
    mlp = 3 * model.hidden_size * model.moe.ffn_hidden_size  # SwiGLU, no biases
    assert routed == pytest.approx(48 * 128 * mlp / 16)
    assert dense + routed == pytest.approx(memory.parameters_on_most_loaded_shard(model, vocab, c))
    # expert dp 1 (16 devices, ep 16): the experts' states are not sharded, the dense ones over dp 16
    assert c.layout.edp == 1
    states = memory.footprint(model, vocab, c).weights_and_optimizer
    assert states == pytest.approx(dense * (6 + 12 / 16) + routed * 18)
    # four times the devices: expert dp 4 shards the experts' states four ways
    wide = Candidate.of(8, 8, 1, 1, 1, 16, ep=16, etp=1)
    (_, routed_wide), = memory.stage_split(model, vocab, wide)
    assert routed_wide == pytest.approx(routed)
    assert memory.footprint(model, vocab, wide).weights_and_optimizer == \
        pytest.approx(dense * (6 + 12 / 64) + routed * (6 + 12 / 4))


def test_routed_token_activations_grow_with_top_k_and_the_capacity_factor():
    from dataclasses import replace

    model = get_model("mixtral-8x7b")
    c = Candidate.of(1, 8, 1, 1, 1, 8, ep=8, etp=1, sequence_parallel=False)
    top2 = memory.layer_activation_bytes(model, c)
    top4 = memory.layer_activation_bytes(replace(model, moe=replace(model.moe, router_topk=4)), c)
    capped = memory.layer_activation_bytes(replace(model, moe=replace(model.moe, capacity_factor=1.5)), c)
    tokens, h, f = model.seq_length, model.hidden_size, model.moe.ffn_hidden_size
    per_copy = (2 * h + 6 * f) * tokens  # the permuted input and SwiGLU's intermediates, expert tp 1
    assert top4 - top2 == pytest.approx(2 * per_copy)
    assert capped - top2 == pytest.approx(0.5 * 2 * per_copy)


def test_the_all_to_all_crosses_nodes_only_where_the_ep_group_does():
    model, system = get_model("qwen3-30b-a3b"), load_system("h100-8")
    vocab = pad_vocab(model.vocab_size, 1)

    def moe_work(ep):
        c = Candidate.of(2, 8, 1, 1, 1, 64, ep=ep, etp=1)
        return timing.work(model, vocab, c, system).experts

    inside, across = moe_work(8), moe_work(16)
    assert inside.across_bytes == 0 and inside.inside_bytes > 0
    assert across.across_bytes == pytest.approx(across.inside_bytes * 8 / 7)  # 8 peers away, 7 at home
    t_inside = experts.expert_times(inside, 0.9, 120, 0.8, 5e-6, 7e14, 2048)[1]
    t_across = experts.expert_times(across, 0.9, 120, 0.8, 5e-6, 7e14, 2048)[1]
    assert t_across > 3 * t_inside  # a device's share of the node's network cards is ~9x slower than NVLink


def test_expert_gemms_run_at_their_own_side():
    model, system = get_model("qwen3-30b-a3b"), load_system("h100-8")
    vocab = pad_vocab(model.vocab_size, 1)
    w = timing.work(model, vocab, Candidate.of(2, 8, 1, 1, 1, 64, ep=16, etp=1), system)
    # tokens per local expert: 8 copies x 4096 tokens x ep 16 / 128 experts = 4096; the expert width 768 is narrower
    assert w.experts.side == 768
    extra, _ = experts.expert_times(w.experts, 0.9, 120, 0.8, 5e-6, 7e14, w.side)
    assert extra > 0  # narrower than the dense side (h = 2048): slower per FLOP
    wide_tp = timing.work(model, vocab, Candidate.of(2, 8, 2, 1, 1, 128, ep=8, etp=2), system)
    assert wide_tp.experts.side == 384 and wide_tp.experts.etp_bytes > 0


def test_ranking_a_moe_tag_tries_ep_and_expert_tp_within_their_rules():
    planned = _tag("deepseek-v3")
    space = ranking.Space(nodes=(128,), tp=(2,), pp=(16,), mbs=(1,), recompute=("none",),
                          distributed_optimizer=(True,))
    good, pruned = ranking.rank(planned.model, planned.system, space, planned.candidate, EFF)
    eps = {p.candidate.layout.ep for p in good + pruned}
    assert eps == {1, 2, 4, 8, 16, 32, 64}  # 1,024 devices / pp 16 = 64 per stage bound ep x expert tp
    assert {p.candidate.layout.expert_tp for p in good + pruned} == {1, 2}
    assert good and all(p.fits for p in good) and all(p.candidate.layout.ep > 1 for p in good)
    assert all("ep" in p.to_dict() for p in good)


def test_predict_rows_take_moe_flags_and_ep(tmp_path):
    model = {"num-layers": 16, "hidden-size": 2048, "num-attention-heads": 16, "ffn-hidden-size": 8192,
             "seq-length": 4096, "vocab-size": 50304, "swiglu": True, "disable-bias-linear": True,
             "num-experts": 64, "moe-router-topk": 6, "moe-ffn-hidden-size": 1024,
             "moe-shared-expert-intermediate-size": 2048, "moe-layer-freq": "([0]*1+[1]*15)",
             "moe-expert-capacity-factor": 1.25}
    path = tmp_path / "rows.yaml"
    path.write_text(json.dumps({"rows": [
        {"id": "ep8", "model": model, "system": "h100-8", "gpus": 16, "tp": 1, "ep": 8, "etp": 1, "mbs": 1,
         "global_batch_size": 64, "distributed_optimizer": True},
        {"id": "ep5", "model": model, "system": "h100-8", "gpus": 16, "ep": 5, "global_batch_size": 64}]}))
    ep8, ep5 = load_rows(path)
    m = ep8.planned.model
    assert m.moe.num_experts == 64 and m.moe.first_k_dense == 1 and m.moe.capacity_factor == 1.25
    assert ep8.planned.candidate.layout.ep == 8 and ep8.planned.candidate.layout.edp == 2
    p = ranking.predict(m, ep8.planned.system, ep8.planned.candidate, EFF)
    assert p.fits and p.tokens_per_s > 0
    refused = ranking.predict(m, ep5.planned.system, ep5.planned.candidate, EFF)
    assert refused.tokens_per_s is None and "ep 5 must divide the 64 experts" in refused.reason


def test_the_ep_all_to_all_overlap_hides_the_all_to_alls_behind_another_micro_batch():
    model, system = get_model("qwen3-30b-a3b"), load_system("h100-8")
    vocab = pad_vocab(model.vocab_size, 1)
    plain = Candidate.of(2, 8, 1, 1, 1, 64, ep=16, etp=1)
    overlapped = plain.changed(overlap_moe_comm=True)
    t_plain = timing.estimate(model, vocab, plain, system, EFF)
    t_over = timing.estimate(model, vocab, overlapped, system, EFF)
    assert t_over.compute_s == pytest.approx(t_plain.compute_s)
    # what is waited for: only what outlasts the other micro-batch's computation
    assert t_over.tp_s == pytest.approx(max(0.0, t_plain.tp_s - t_plain.compute_s), rel=1e-6)
    assert t_over.iteration_s < t_plain.iteration_s


def test_bench_plan_ranks_deepseek_v3_with_ep_and_each_row_runs_as_a_bench_run_line(bench):
    out = bench("plan", "--tag", "deepseek-v3", "--tp", "2", "--pp", "16", "--mbs", "1", "--recompute", "none",
                "--top", "3", "--json")
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    best = [r for r in rows if r["fits"]]
    assert best and all(r["ep"] > 1 and r["memory_gib"] <= 80 for r in best)
    assert all(r["edp"] == 1024 // (16 * r["ep"] * r["etp"]) for r in best)
    for r in best:  # the tag's own ep 64 / etp 1 needs no flag; another one is named
        assert (f"--ep {r['ep']}" in r["command"]) == (r["ep"] != 64)


def test_an_moe_prediction_says_the_corpus_has_no_experts():
    from nlp_bench.plan.corpus import load_corpus, ranges

    planned, dense = _tag("qwen3-30b-a3b"), _tag("llama3-8b")
    covered = ranges([r for r in load_corpus() if r.planned.model.moe is None])  # a corpus without MoE rows
    assert "mixture of experts not in the corpus" in covered.outside(planned.model, planned.system,
                                                                     planned.candidate, 151936)
    assert not [w for w in covered.outside(dense.model, dense.system, dense.candidate, 128256) if "experts" in w]
