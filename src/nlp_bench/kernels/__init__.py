"""Fused ops without Apex or a CUDA build: Triton kernels with eager torch fallbacks.

    layer_norm(x, weight, bias, eps)    rms_norm(x, weight, eps)
    bias_gelu(x, bias)                  swiglu(x)
    cross_entropy(logits, target)       FusedAdam(params, lr, ...)
    vocab_parallel_cross_entropy(logits, target, vocab_start, group)   (per-token loss, for tensor parallelism)

Every op computes in fp32 internally and returns its input's dtype; each has a backward. Which
implementation runs is decided once per process (see `select`); `describe()` says which.
"""

from __future__ import annotations

import torch

from nlp_bench.kernels import eager, select
from nlp_bench.kernels.fused_adam import FusedAdam
from nlp_bench.kernels.select import KernelChoiceError, configure, describe, implementation

__all__ = ["layer_norm", "rms_norm", "bias_gelu", "swiglu", "cross_entropy", "vocab_parallel_cross_entropy",
           "FusedAdam", "KernelChoiceError", "configure", "describe", "implementation"]


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
               eps: float = 1e-5) -> torch.Tensor:
    if select.runs_triton("layer_norm", x):
        from nlp_bench.kernels import norms

        return norms.triton_layer_norm(x, weight, bias, eps, select.persistent_layer_norm())
    return eager.eager_layer_norm(x, weight, bias, eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-5) -> torch.Tensor:
    if select.runs_triton("rms_norm", x):
        from nlp_bench.kernels import norms

        return norms.triton_rms_norm(x, weight, eps, select.persistent_layer_norm())
    return eager.eager_rms_norm(x, weight, eps)


def bias_gelu(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """gelu_tanh(x + bias), the bias broadcast over the last dimension."""
    if select.runs_triton("bias_gelu", x):
        from nlp_bench.kernels import activations

        return activations.triton_bias_gelu(x, bias)
    return eager.eager_bias_gelu(x, bias)


def swiglu(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :n]) * x[..., n:] for a last dimension of 2n."""
    if select.runs_triton("swiglu", x):
        from nlp_bench.kernels import activations

        return activations.triton_swiglu(x)
    return eager.eager_swiglu(x)


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, vocab_start: int = 0, group=None,
                                 inplace_backward: bool = False) -> torch.Tensor:
    """Per-token loss of logits holding vocabulary ids [vocab_start, vocab_start + width) of a vocabulary
    split over `group`. With `inplace_backward` (Triton only) the gradient is written over the logits,
    which must not be used after the backward pass."""
    if select.runs_triton("cross_entropy", logits):
        from nlp_bench.kernels import loss

        return loss.triton_vocab_parallel_cross_entropy(logits, target, vocab_start, group, inplace_backward)
    return eager.EagerVocabParallelCrossEntropy.apply(logits, target, vocab_start, group)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean softmax cross-entropy of logits [..., vocab] against target ids [...]."""
    return vocab_parallel_cross_entropy(logits, target).mean()
