"""The FLOPs conventions, each under its own name.

Published LLM-training TFLOP/s figures differ by ~35% depending on which convention counted them,
so every number this project prints says which one it used. The trainer's log line and the analysis
both call these functions: there is no second copy of a formula anywhere.

Symbols: B global batch (sequences), s sequence length, L layers, h hidden size, V padded vocabulary,
ffn MLP width, n attention heads, g query groups (g = n: multi-head attention), t seconds per iteration,
W number of devices.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The hypothetical training size of the JUPITER benchmark (time_to_report = tokens / tokens_per_s).
REPORT_TOKENS = 20_000_000

JUPITER = "jupiter"
MEGATRON_MODEL = "megatron-model"


@dataclass(frozen=True)
class Shape:
    """What the FLOPs conventions need to know about a model and a step."""

    global_batch: int
    seq_length: int
    num_layers: int
    hidden: int
    vocab_padded: int
    ffn_hidden: int
    swiglu: bool = False
    recompute: bool = False
    #: attention heads and query groups (grouped-query attention); 0 and 0 mean multi-head attention
    heads: int = 0
    query_groups: int = 0
    #: each head's size where it is not h/n (0: h/n)
    kv_channels: int = 0
    #: layers with experts (the others dense), each token's routed experts (top-k), a routed expert's MLP
    #: width, the shared experts' width together
    moe_layers: int = 0
    topk: int = 0
    moe_ffn_hidden: int = 0
    shared_ffn_hidden: int = 0
    #: latent attention: (q rank or 0 for none, kv rank, qk head dim, rope head dim, v head dim); None: none
    mla: tuple[int, int, int, int, int] | None = None
    #: multi-token prediction modules, and whether their layer has experts (as the last layer)
    mtp_layers: int = 0
    mtp_moe: bool = False

    @property
    def kv_share(self) -> float:
        """Key/value heads per query head: g/n, 1 for multi-head attention."""
        return self.query_groups / self.heads if self.heads and self.query_groups else 1.0


def jupiter_flops(shape: Shape) -> float:
    """FLOPs per iteration as the JUPITER benchmark's Megatron patch counts them.

    This is the convention behind the reference table's TFLOPs (and Avg_TFLOPs/GPU), so using it is what
    makes our numbers comparable with the published ones. Any activation recompute counts one extra
    forward (factor 4 instead of 3). It knows multi-head attention and an MLP of width 4h only
    (`log_convention` says where it applies).
    """
    c = 32 if shape.swiglu else 24
    k = 4 if shape.recompute else 3
    b, s, n, h, v = shape.global_batch, shape.seq_length, shape.num_layers, shape.hidden, shape.vocab_padded
    return c * k * b * s * n * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * n * h))


def megatron_model_flops(shape: Shape) -> float:
    """Model FLOPs per iteration as current Megatron-LM counts them (no recompute term; for MFU).

    `num_floating_point_operations` in megatron/training/training.py (core_v0.20.0), dense transformer with
    head size h/n: 3 (forward, two backward GEMMs) x 2 (multiply-add) x per token the query and output
    projections (2h^2), the key and value projections (2h^2 g/n), the MLP (f h ffn) and the logits (h V),
    plus the attention scores and their product with the values, halved for the causal mask.
    """
    b, s, n, h, v = shape.global_batch, shape.seq_length, shape.num_layers, shape.hidden, shape.vocab_padded
    f = 3 if shape.swiglu else 2
    if not (shape.moe_layers or shape.mla or shape.kv_channels or shape.mtp_layers):
        attention = 2 * h * h + 2 * h * h * shape.kv_share
        per_token = n * attention + n * h * shape.ffn_hidden * f + h * v
        return 6.0 * b * s * per_token + 6.0 * b * s * s * h * n
    return _megatron_moe_flops(shape)


def _megatron_moe_flops(shape: Shape) -> float:
    """The same count for experts, latent attention, a head size other than h/n and multi-token prediction,
    as Megatron-LM 0.20 counts them: a layer with experts counts its top-k routed experts and its shared
    experts, the active parameters' GEMMs (the router's own GEMM is not counted); each MTP module counts one
    more layer (with experts where the last layer has them), its norms and 2h -> h projection, and one more
    logits GEMM.

    Left out, as Megatron-LM leaves them out (tests/unit/test_flops_moe_*.py check both against its function
    and against torch's FLOP counter on the trainer's model): the router's h x E GEMM (6 T h E per MoE layer);
    the rows by which a grouped GEMM pads each expert to the fullest one's tokens, and the tokens a capacity
    factor drops (every token counts its top-k experts); sliding windows (gpt-oss's windowed layers count as
    full causal attention) and attention sinks; and, as for dense models, the causal half of attention, norms,
    softmax, activations, rotary embeddings and the aux loss."""
    b, s, h, v, f = shape.global_batch, shape.seq_length, shape.hidden, shape.vocab_padded, 3 if shape.swiglu else 2
    mtp = shape.mtp_layers
    moe_layers = shape.moe_layers + (mtp if shape.mtp_moe else 0)
    layers = shape.num_layers + mtp
    dense_layers = layers - moe_layers
    n = shape.heads
    if shape.mla is not None:
        q_rank, kv_rank, qk, rope, v_dim = shape.mla
        queries = h * n * (qk + rope) if not q_rank else q_rank * (h + n * (qk + rope) + 1)
        attention = queries + kv_rank * (h + n * (qk + v_dim) + 1) + h * rope + n * v_dim * h
        core = n * (qk + rope) / 2 + n * v_dim / 2
    else:
        d = shape.kv_channels or h / n
        q, kv = d * n, 2 * d * shape.query_groups
        attention, core = h * (q + kv) + q * h, q
    mlp = h * (shape.ffn_hidden * f * dense_layers
               + (shape.moe_ffn_hidden * shape.topk + shape.shared_ffn_hidden) * f * moe_layers)
    per_token = mlp + attention * layers + mtp * (3 * h + 2 * h * h) + h * v * (mtp + 1)
    return 6.0 * b * s * per_token + 6.0 * b * s * s * core * layers


def log_convention(shape: Shape) -> str:
    """The convention a log's TFLOPs use for this model: the JUPITER patch's where its formula holds
    (multi-head attention, MLP width 4h: the GPT models it was written for), else Megatron-LM's model FLOPs,
    which count grouped-query attention and any MLP width."""
    plain = not (shape.moe_layers or shape.mla or shape.kv_channels or shape.mtp_layers)
    return JUPITER if plain and shape.kv_share == 1.0 and shape.ffn_hidden == 4 * shape.hidden else MEGATRON_MODEL


CONVENTIONS = {JUPITER: jupiter_flops, MEGATRON_MODEL: megatron_model_flops}
#: each convention as a formula a reader can check (f = 2, or 3 with SwiGLU; c = 24 or 32, k = 3 or 4)
FORMULAS = {
    JUPITER: "c*k*B*s*L*h^2*(1 + s/(6h) + V/(16*L*h)) per iteration (JUPITER Megatron patch; k = 4 with recompute)",
    MEGATRON_MODEL: "6*B*s*(L*(2h^2 + 2h^2*g/n + f*h*ffn) + h*V) + 6*B*s^2*h*L per iteration (Megatron-LM "
                    "num_floating_point_operations: query groups g of n heads, causal attention halved, no "
                    "recompute term)",
}
#: the same count for a model with experts, whose MFU counts the active parameters' FLOPs only (q = n*d query
#: columns, attn = h*(q + 2*d*g) + q*h; k routed experts of width ffn_e and shared experts of width ffn_s on
#: each of the L_moe layers with experts)
MOE_FORMULA = ("6*B*s*(L*attn + L_dense*f*h*ffn + L_moe*f*h*(k*ffn_e + ffn_s) + h*V) + 6*B*s^2*q*L per iteration "
               "(Megatron-LM core_v0.20.0 num_floating_point_operations; latent attention and MTP modules as it "
               "counts them)")
#: what the MFU of a model with experts counts, in the words the table and the report use beside such points
MOE_MFU_BASIS = ("active parameters only (each token's top-k routed experts and the shared experts; not the "
                 "router's GEMM), causal attention halved, as Megatron-LM core_v0.20.0's "
                 "num_floating_point_operations counts them")


def tflops_per_device(flops_per_iteration: float, iteration_time_s: float, devices: int) -> float:
    """Achieved TFLOP/s per device for one iteration's FLOPs."""
    return flops_per_iteration / (iteration_time_s * devices * 1e12)


def time_to_report(tokens_per_s: float, tokens: float = REPORT_TOKENS) -> float:
    """The benchmark's metric: seconds a training of `tokens` tokens would take at this throughput."""
    return tokens / tokens_per_s
