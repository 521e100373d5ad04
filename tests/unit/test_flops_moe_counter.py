"""The model FLOPs of an MoE model against torch's FlopCounterMode on the built-in trainer's own model: one
micro-batch forward and backward, dropless, built from the flags the spec renders.

FlopCounterMode counts every matrix product the model executes (mm, bmm and their fused forms); the formula
counts Megatron-LM's model FLOPs. They differ, term by term, in exactly these ways:

- attention: the trainer's explicit QK^T and (QK^T)V (--no-masked-softmax-fusion) compute the whole s x s
  square, which the counter sees; the formula halves it for the causal mask: 6 B s^2 h L more in the counter;
- the router: its h x E GEMM (forward, and the gradients of its input and its weight) is in the counter, not in
  the formula (Megatron's function leaves it out): 6 T h E per MoE layer;
- the grouped experts: one batched GEMM over E groups padded to the fullest expert's token count, so the
  counter sees E x slots rows where the formula counts T x top-k (the padding rows cost time, do no work):
  6 (E slots - T k) h f_e (3 with SwiGLU) per MoE layer;
- the logits, the projections, dense MLPs and shared experts: counted alike by both.
Norms, softmax, SwiGLU's product, rotary embeddings, the aux loss and the token dispatch are no matrix
product: neither counts them.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from nlp_bench import flops
from nlp_bench.spec.models import ModelSpec, get_model

torch = pytest.importorskip("torch")

BATCH = 2
TINY = get_model("moe-tiny")


def _trainer_argv(model: ModelSpec) -> list[str]:
    """The trainer's flags for one micro-batch of `model`: its shape and the architecture it renders, no dropout,
    attention as explicit matrix products."""
    out = ["--lr", "1e-3", "--train-iters", "1", "--mock-data", "--vocab-size", str(model.vocab_size),
           "--micro-batch-size", str(BATCH), "--global-batch-size", str(BATCH), "--hidden-dropout", "0",
           "--attention-dropout", "0", "--no-masked-softmax-fusion"]
    for name in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "seq_length",
                 "max_position_embeddings"):
        out += ["--" + name.replace("_", "-"), str(getattr(model, name))]
    for flag, value in model.megatron_flags().items():
        out += [f"--{flag}"] if value is True else [f"--{flag}", str(value)]
    return out


def _counted(model: ModelSpec) -> tuple[float, int, list[int]]:
    """FlopCounterMode's total over one forward and backward, the padded vocabulary, and each MoE layer's rows
    through its grouped experts (E x slots), read from the experts' input."""
    from torch.utils.flop_counter import FlopCounterMode

    from nlp_bench.train.args import build_parser
    from nlp_bench.train.config import build_config
    from nlp_bench.train.layers import TensorParallel
    from nlp_bench.train.model import GPTStage
    from nlp_bench.train.moe import MoELayer
    from nlp_bench.train.rng import ParallelRNG

    torch.manual_seed(0)
    cfg = build_config(build_parser().parse_args(_trainer_argv(model)), 1).model
    stage = GPTStage(cfg, TensorParallel(1, 0, None), ParallelRNG(1, 0, torch.device("cpu")), 0, model.num_layers,
                     True, True)
    rows: list[int] = []
    for module in stage.modules():
        if isinstance(module, MoELayer):
            module.experts.register_forward_hook(lambda _, inputs, __: rows.append(inputs[0].shape[0] * inputs[0].shape[1]))
    tokens = torch.randint(0, model.vocab_size, (BATCH, model.seq_length))
    with FlopCounterMode(display=False) as counter:
        stage(tokens, tokens).backward()
    return counter.get_total_flops(), cfg.vocab_padded, rows


@pytest.mark.parametrize("model", [
    TINY,
    replace(TINY, moe=replace(TINY.moe, shared_expert_intermediate_size=96, layer_freq=2)),
    replace(TINY, moe=replace(TINY.moe, router_score="sigmoid", router_topk=1)),
], ids=["moe-tiny", "moe-tiny shared experts every 2nd layer", "moe-tiny sigmoid top-1"])
def test_the_trainers_moe_model_executes_the_formulas_flops(model):
    counted, vocab, rows = _counted(model)
    e, h, s, L = model.moe, model.hidden_size, model.seq_length, model.num_layers
    tokens, moe_layers = BATCH * s, sum(e.layer_pattern(L))
    assert len(rows) == moe_layers and all(r >= tokens * e.router_topk for r in rows)
    full_attention = 6.0 * BATCH * s * s * h * L  # the causal half the formula leaves out
    router = 6.0 * tokens * h * e.num_experts * moe_layers
    padding = sum(6.0 * (r - tokens * e.router_topk) * h * e.ffn_hidden_size * 3 for r in rows)
    formula = flops.megatron_model_flops(model.flops_shape(BATCH, vocab))
    assert counted == formula + full_attention + router + padding


def test_a_capacity_of_exactly_the_even_share_leaves_no_padding():
    """With capacity factor 1, every expert group holds T k / E rows (tokens past it dropped, short groups
    padded): the counter's expert rows are the formula's T k, and only the router and the causal half differ."""
    model = replace(TINY, moe=replace(TINY.moe, capacity_factor=1.0))
    counted, vocab, rows = _counted(model)
    tokens, e = BATCH * model.seq_length, model.moe
    assert rows == [tokens * e.router_topk] * model.num_layers
    extra = (6.0 * BATCH * model.seq_length ** 2 * model.hidden_size * model.num_layers
             + 6.0 * tokens * model.hidden_size * e.num_experts * model.num_layers)
    assert counted == flops.megatron_model_flops(model.flops_shape(BATCH, vocab)) + extra
