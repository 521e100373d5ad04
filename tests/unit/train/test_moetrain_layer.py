"""The trainer's MoE layer against hand computations and a plain loop over experts; its flags as Megatron-LM
reads them."""

import math

import pytest
import torch
import torch.nn.functional as F

from nlp_bench.train.args import UsageError, moe_layers, parse_args
from nlp_bench.train.config import GPTConfig, MoEConfig, build_config
from nlp_bench.train.layers import TensorParallel
from nlp_bench.train.moe import MoELayer, capacity, dispatch, route

BASE = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "16",
        "--micro-batch-size", "2", "--lr", "1e-3", "--train-iters", "3", "--mock-data", "--vocab-size", "100"]
LOGITS = [[2.0, 1.0, 0.5, -1.0], [0.0, 3.0, 0.2, 0.1], [1.0, 1.5, 2.5, 0.0]]


def _softmax(row):
    e = [math.exp(v) for v in row]
    return [v / sum(e) for v in e]


def test_softmax_router_topk_and_aux_loss_by_hand():
    r = route(torch.tensor(LOGITS), topk=2, score_function="softmax", aux_loss_coeff=0.1)
    assert r.experts.tolist() == [[0, 1], [1, 2], [2, 1]]
    # Megatron: softmax over the k picked logits
    for t, (a, b) in enumerate([(0, 1), (1, 2), (2, 1)]):
        pa = math.exp(LOGITS[t][a]) / (math.exp(LOGITS[t][a]) + math.exp(LOGITS[t][b]))
        assert r.probs[t].tolist() == pytest.approx([pa, 1 - pa], rel=1e-6)
    # E * sum_e(f_e * P_e): f_e = routed to e / (T k), P_e = mean over tokens of the full softmax
    counts = [1, 3, 2, 0]
    probs = [_softmax(row) for row in LOGITS]
    balance = 4 * sum(counts[e] / (3 * 2) * sum(p[e] for p in probs) / 3 for e in range(4))
    assert r.balance.item() == pytest.approx(balance, rel=1e-6)
    assert r.aux_loss.item() == pytest.approx(0.1 * balance, rel=1e-6)
    assert route(torch.tensor(LOGITS), 2).aux_loss is None  # coefficient 0: none, as Megatron


def test_sigmoid_router_normalises_the_topk_scores():
    r = route(torch.tensor(LOGITS), topk=2, score_function="sigmoid", aux_loss_coeff=1.0)
    s = [1 / (1 + math.exp(-v)) for v in LOGITS[0]]
    assert r.probs[0].tolist() == pytest.approx([s[0] / (s[0] + s[1]), s[1] / (s[0] + s[1])], rel=1e-6)
    norm = [[1 / (1 + math.exp(-v)) for v in row] for row in LOGITS]
    norm = [[v / sum(row) for v in row] for row in norm]
    balance = 4 * sum(c / 6 * sum(p[e] for p in norm) / 3 for e, c in enumerate([1, 3, 2, 0]))
    assert r.balance.item() == pytest.approx(balance, rel=1e-6)
    assert route(torch.tensor(LOGITS), 1, "sigmoid").probs[:, 0].tolist() == pytest.approx(
        [1 / (1 + math.exp(-2.0)), 1 / (1 + math.exp(-3.0)), 1 / (1 + math.exp(-2.5))], rel=1e-6)


def _layer(swiglu=True, bias=False, factor=None, policy="probs", experts=4, topk=2, hidden=8):
    moe = MoEConfig(experts, topk, 12, (True,), "softmax", 0.01, factor, policy, None)
    cfg = GPTConfig(num_layers=1, hidden_size=hidden, num_attention_heads=2, ffn_hidden_size=16, seq_length=4,
                    max_position_embeddings=4, vocab_padded=128, num_query_groups=2, swiglu=swiglu,
                    add_bias_linear=bias, moe=moe)
    return MoELayer(cfg, TensorParallel(1, 0, None), index=0).double()


def _loop(layer, x):
    """The same layer as a plain PyTorch MoE: each expert its own matmuls over the tokens routed to it."""
    flat = x.reshape(-1, x.shape[-1])
    r = route(flat @ layer.router.t(), layer.moe.topk)
    ex = layer.experts
    out = torch.zeros_like(flat)
    for e in range(layer.moe.num_experts):
        tokens, slot = (r.experts == e).nonzero(as_tuple=True)
        if tokens.numel() == 0:
            continue
        h = flat[tokens] @ ex.fc1[e] + (0 if ex.bias1 is None else ex.bias1[e])
        h = F.silu(h.chunk(2, -1)[0]) * h.chunk(2, -1)[1] if ex.swiglu else F.gelu(h, approximate="tanh")
        y = h @ ex.fc2[e] + (0 if ex.bias2 is None else ex.bias2[e])
        out = out.index_add(0, tokens, y * r.probs[tokens, slot].unsqueeze(-1))
    return out.view(x.shape)


@pytest.mark.parametrize("swiglu,bias", [(True, False), (False, True)])
def test_grouped_experts_equal_a_loop_over_experts_forward_and_backward(swiglu, bias):
    torch.manual_seed(0)
    layer = _layer(swiglu, bias)
    layer.eval()  # no aux loss: the loop has none
    x = torch.randn(5, 3, 8, dtype=torch.float64, requires_grad=True)
    grouped, looped = layer(x), _loop(layer, x)
    assert torch.allclose(grouped, looped)
    weights = torch.randn_like(grouped)
    params = [x, *layer.parameters()]
    ours = torch.autograd.grad((grouped * weights).sum(), params)
    ref = torch.autograd.grad((looped * weights).sum(), params, allow_unused=True)
    for name, a, b in zip(["x", *(n for n, _ in layer.named_parameters())], ours, ref, strict=True):
        assert torch.allclose(a, b if b is not None else torch.zeros_like(a)), name


def test_aux_loss_reaches_the_router_in_backward():
    torch.manual_seed(0)
    layer = _layer()
    x = torch.randn(4, 2, 8, dtype=torch.float64)
    (with_aux,) = torch.autograd.grad(layer(x).sum(), [layer.router])
    layer.eval()
    (without,) = torch.autograd.grad(layer(x).sum(), [layer.router])
    assert not torch.allclose(with_aux, without)
    assert len(layer.balance) == 1


def test_capacity_is_megatrons_formula():
    assert capacity(8, 4, 2, 0.5) == 2  # ceil(8 * 2 / 4 * 0.5)
    assert capacity(10, 4, 2, 1.1) == 6  # ceil(5.5)
    assert capacity(8, 4, 2, None) is None and capacity(8, 4, 2, 5.0) is None  # dropless, or more than T


@pytest.mark.parametrize("policy", ["probs", "position"])
def test_capacity_factor_drops_exactly_the_tokens_past_capacity(policy):
    # 8 tokens, 4 experts, top-2; every token picks expert 0 and one other: expert 0 gets 8, capacity 2
    torch.manual_seed(1)
    logits = torch.randn(8, 4)
    logits[:, 0] += 10.0
    r = route(logits, 2)
    counts = torch.bincount(r.experts.flatten(), minlength=4).tolist()
    slots = capacity(8, 4, 2, 0.5)
    plan = dispatch(r, 4, slots, policy)
    assert counts[0] == 8 and plan.dropped == sum(max(0, c - slots) for c in counts) > 0
    assert plan.token.numel() == 16 - plan.dropped
    kept0 = sorted(plan.token[plan.expert == 0].tolist())
    if policy == "position":
        assert kept0 == [0, 1]
    else:
        best = torch.topk(r.probs[:, 0], 2).indices.tolist()  # expert 0 is every token's first pick
        assert kept0 == sorted(best)


def test_a_token_whose_experts_are_all_full_gets_zero_from_them():
    layer = _layer(factor=0.25, policy="position", experts=2, topk=1)
    with torch.no_grad():
        layer.router.zero_()
        layer.router[0, 0] = 1.0  # positive first feature: expert 0, else expert 1
    x = torch.ones(4, 1, 8, dtype=torch.float64)  # all 4 tokens to expert 0; capacity ceil(4 / 2 * 0.25) = 1
    y = layer(x)
    assert layer.dropped == 3
    assert y[0].abs().sum() > 0 and torch.all(y[1:] == 0)


def test_megatron_moe_flags_and_defaults():
    args = parse_args(BASE + ["--num-experts", "4"])
    assert (args.moe_router_topk, args.moe_ffn_hidden_size, args.moe_layer_freq) == (2, 256, 1)
    assert (args.moe_router_score_function, args.moe_aux_loss_coeff, args.moe_expert_capacity_factor) == (
        "softmax", 0.0, None)
    assert args.moe_token_drop_policy == "probs" and args.expert_tensor_parallel_size == 1
    assert args.moe_token_dispatcher_type == "allgather" and args.moe_router_load_balancing_type == "aux_loss"
    assert moe_layers(parse_args(BASE + ["--num-experts", "4", "--moe-layer-freq", "2"]).moe_layer_freq, 4) == [
        True, False, True, False]
    pattern = parse_args(BASE + ["--num-experts", "4", "--moe-layer-freq", "([0]+[1]*1)*2"]).moe_layer_freq
    assert pattern == [0, 1, 0, 1]


@pytest.mark.parametrize("flags,says", [
    (["--expert-model-parallel-size", "0"], "--expert-model-parallel-size must be at least 1"),
    (["--expert-tensor-parallel-size", "3"], "--expert-tensor-parallel-size 3 must divide each expert's FFN size"),
    (["--moe-router-topk", "5"], "--moe-router-topk 5"),
    (["--moe-layer-freq", "[1]*3"], "the pattern has 3 layers"),
    (["--moe-layer-freq", "__import__('os')"], "neither an integer nor a list pattern"),
])
def test_moe_layouts_not_built_are_refused_in_one_line(flags, says):
    with pytest.raises(UsageError) as exc:
        parse_args(BASE + ["--num-experts", "4", *flags])
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_full_recompute_with_experts_is_refused_in_one_line():
    args = parse_args(BASE + ["--num-experts", "4", "--recompute-granularity", "full", "--recompute-method",
                              "uniform", "--recompute-num-layers", "1"])
    with pytest.raises(UsageError, match="--num-experts with full activation recompute is not built yet"):
        build_config(args, 1)


@pytest.mark.parametrize("flags,world,says", [
    (["--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "2"], 4,
     "expert parallelism (ep 2, expert tp 2) with --tensor-model-parallel-size 2 needs --sequence-parallel"),
    (["--expert-model-parallel-size", "2", "--use-distributed-optimizer"], 2,
     "--use-distributed-optimizer with expert parallelism (ep 2, expert tp 1) is not built yet"),
    (["--expert-tensor-parallel-size", "2", "--use-distributed-optimizer"], 2,
     "--use-distributed-optimizer with expert parallelism (ep 1, expert tp 2) is not built yet"),
    (["--expert-model-parallel-size", "3"], 3, "ep 3 must divide the 4 experts"),
    (["--expert-model-parallel-size", "2", "--expert-tensor-parallel-size", "2"], 2,
     "expert tp 2 x ep 2 x pp 1 does not divide the 2"),
])
def test_expert_layouts_the_trainer_cannot_run_are_refused_in_one_line(flags, world, says):
    """Before any process group: the expert grid's rules, and what the expert grid does not reach yet."""
    args = parse_args(BASE + ["--num-experts", "4", *flags])
    with pytest.raises(UsageError) as exc:
        build_config(args, world)
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_moe_only_flags_need_experts():
    with pytest.raises(UsageError, match="--moe-expert-capacity-factor needs --num-experts"):
        parse_args(BASE + ["--moe-expert-capacity-factor", "1.0"])


def test_moe_flag_names_and_defaults_are_megatron_core_v0_20_0s():
    """Against the flag table generated from Megatron-LM's own parser (benchmark/megatron-lm/flags)."""
    import json
    from pathlib import Path

    from nlp_bench.train.args import build_parser

    table = Path(__file__).parents[3] / "benchmark" / "megatron-lm" / "flags" / "0.20.0.tsv"
    rows = [line.split("\t") for line in table.read_text().splitlines() if not line.startswith("#")]
    megatron = {row[0]: json.loads(row[5]) for row in rows[1:]}
    ours = {a.option_strings[0][2:]: a.default for a in build_parser()._actions
            if a.option_strings and ("moe" in a.dest or "expert" in a.dest)}
    assert len(ours) == 14
    for name, default in ours.items():
        assert name in megatron, name
        assert default == megatron[name], (name, default, megatron[name])
