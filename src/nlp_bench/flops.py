"""The FLOPs conventions, each under its own name.

Published LLM-training TFLOP/s figures differ by ~35% depending on which convention counted them,
so every number this project prints says which one it used. The trainer's log line and the analysis
both call these functions: there is no second copy of a formula anywhere.

Symbols: B global batch (sequences), s sequence length, L layers, h hidden size, V padded vocabulary,
ffn MLP width, t seconds per iteration, W number of devices.
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


def jupiter_flops(shape: Shape) -> float:
    """FLOPs per iteration as the JUPITER benchmark's Megatron patch counts them.

    This is the convention behind the reference table's TFLOPs (and Avg_TFLOPs/GPU), so using it is what
    makes our numbers comparable with the published ones. Any activation recompute counts one extra
    forward (factor 4 instead of 3).
    """
    c = 32 if shape.swiglu else 24
    k = 4 if shape.recompute else 3
    b, s, n, h, v = shape.global_batch, shape.seq_length, shape.num_layers, shape.hidden, shape.vocab_padded
    return c * k * b * s * n * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * n * h))


def megatron_model_flops(shape: Shape) -> float:
    """Model FLOPs per iteration as current Megatron-LM counts them (no recompute term; for MFU).

    Plain multi-head attention (q = k = v = h); the attention-score term is already halved for the
    causal mask.
    """
    b, s, n, h, v = shape.global_batch, shape.seq_length, shape.num_layers, shape.hidden, shape.vocab_padded
    f = 3 if shape.swiglu else 2
    per_token = n * (h * 3 * h + h * h) + n * h * shape.ffn_hidden * f + h * v
    return 6.0 * b * s * per_token + 6.0 * b * s * s * h * n


CONVENTIONS = {JUPITER: jupiter_flops, MEGATRON_MODEL: megatron_model_flops}
#: each convention as a formula a reader can check (f = 2, or 3 with SwiGLU; c = 24 or 32, k = 3 or 4)
FORMULAS = {
    JUPITER: "c*k*B*s*L*h^2*(1 + s/(6h) + V/(16*L*h)) per iteration (JUPITER Megatron patch; k = 4 with recompute)",
    MEGATRON_MODEL: "6*B*s*(L*(4h^2 + f*h*ffn) + h*V) + 6*B*s^2*h*L per iteration (Megatron-LM model FLOPs, "
                    "causal attention halved, no recompute term)",
}


def tflops_per_device(flops_per_iteration: float, iteration_time_s: float, devices: int) -> float:
    """Achieved TFLOP/s per device for one iteration's FLOPs."""
    return flops_per_iteration / (iteration_time_s * devices * 1e12)


def time_to_report(tokens_per_s: float, tokens: float = REPORT_TOKENS) -> float:
    """The benchmark's metric: seconds a training of `tokens` tokens would take at this throughput."""
    return tokens / tokens_per_s
