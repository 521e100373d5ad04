"""The model FLOPs with grouped-query attention and SwiGLU, counted two independent ways: GEMM by GEMM by hand,
and by torch's FLOP counter on the trainer's own model (forward and backward)."""

import pytest

from nlp_bench import flops
from nlp_bench.spec.models import get_model


def _by_hand(B, s, L, h, n, g, ffn, V, swiglu):
    """Every GEMM of one forward pass, times 3 (forward, and the two GEMMs of the backward pass)."""
    d, T = h // n, B * s
    per_layer = (2 * T * h * h            # queries
                 + 2 * 2 * T * h * g * d  # keys and values: g heads each
                 + 2 * T * h * h          # output projection
                 + 2 * T * h * ffn * (2 if swiglu else 1)  # up (and gate)
                 + 2 * T * ffn * h        # down
                 + 2 * (2 * B * n * s * s * d) / 2)  # scores and weighted values, causal half
    return 3 * (L * per_layer + 2 * T * h * V)


@pytest.mark.parametrize("g,swiglu", [(2, True), (4, True), (1, False), (4, False)])
def test_formula_is_a_count_of_every_gemm(g, swiglu):
    shape = flops.Shape(3, 16, 2, 64, 256, 96, swiglu, False, heads=4, query_groups=g)
    assert flops.megatron_model_flops(shape) == pytest.approx(_by_hand(3, 16, 2, 64, 4, g, 96, 256, swiglu))


def test_grouped_queries_cost_less_than_multi_head():
    mha = flops.Shape(8, 2048, 4, 1024, 32000, 4096, heads=16, query_groups=16)
    gqa = flops.Shape(8, 2048, 4, 1024, 32000, 4096, heads=16, query_groups=2)
    # the key and value projections shrink from 2h^2 to 2h^2 g/n per token and layer: 6 B s L 2 h^2 (1 - 2/16)
    saved = 6 * 8 * 2048 * 4 * 2 * 1024 * 1024 * (1 - 2 / 16)
    assert flops.megatron_model_flops(mha) - flops.megatron_model_flops(gqa) == pytest.approx(saved)


def test_log_convention_is_jupiter_only_where_its_formula_holds():
    assert flops.log_convention(get_model("gpt-175b").flops_shape(96, 51200)) == flops.JUPITER
    assert flops.log_convention(get_model("llama3-8b").flops_shape(128, 128256)) == flops.MEGATRON_MODEL
    assert flops.log_convention(get_model("llama-tiny").flops_shape(4, 32256)) == flops.MEGATRON_MODEL


def test_trainers_model_executes_the_formulas_flops():
    """torch's FLOP counter over one forward and backward of the tiny Llama (explicit attention matmuls, so
    every product is counted): the formula's FLOPs plus the causal half it leaves out."""
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    from nlp_bench.train.config import GPTConfig
    from nlp_bench.train.layers import TensorParallel
    from nlp_bench.train.model import GPTStage
    from nlp_bench.train.rng import ParallelRNG

    m = get_model("llama-tiny")
    B, vocab = 2, 32000
    cfg = GPTConfig(m.num_layers, m.hidden_size, m.num_attention_heads, m.ffn_hidden_size, m.seq_length,
                    m.max_position_embeddings, vocab, m.query_groups, "rope", m.rotary_base, False,
                    hidden_dropout=0.0, attention_dropout=0.0, masked_softmax_fusion=False, normalization="RMSNorm",
                    swiglu=True, untie_embeddings=True)
    model = GPTStage(cfg, TensorParallel(1, 0, None), ParallelRNG(1, 0, torch.device("cpu")), 0, m.num_layers,
                     True, True)
    tokens = torch.randint(0, vocab, (B, m.seq_length))
    with FlopCounterMode(display=False) as counter:
        model(tokens, tokens).backward()
    full_attention = 6.0 * B * m.seq_length ** 2 * m.hidden_size * m.num_layers  # the causal half, counted
    expected = flops.megatron_model_flops(m.flops_shape(B, vocab)) + full_attention
    assert counter.get_total_flops() == pytest.approx(expected, rel=1e-9)
