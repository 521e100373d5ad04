"""The ops in plain eager PyTorch: the references the Triton kernels are tested against (on fp32
copies of the inputs), and the implementation used wherever Triton cannot run (no GPU, no driver)
or is switched off (NLP_BENCH_KERNELS=torch, Megatron's --no-*-fusion flags). They are what a
Megatron run without Apex executes, so the trainer's fused-vs-unfused comparison is fair.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F


def eager_layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                     eps: float) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def eager_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    return F.rms_norm(x, x.shape[-1:], weight, eps)


def eager_bias_gelu(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """GeLU with the tanh approximation of x + bias, unfused (Megatron's --no-bias-gelu-fusion)."""
    return F.gelu(x if bias is None else x + bias, approximate="tanh")


def eager_swiglu(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, with gate and up the two halves of the last dimension."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def reduce_vocab_shards(t: torch.Tensor, group, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """Per-token figures combined in place over the ranks that hold the vocabulary's shards; nothing to do
    outside tensor parallelism."""
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(t, op=op, group=group)
    return t


class EagerVocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token loss from vocab-split logits without gathering them: only [tokens]-sized reductions
    (max, target logit, sum of exponentials) cross the network. Keeps the fp32 softmax for the
    backward pass, which is the memory the Triton version saves."""

    @staticmethod
    def forward(ctx, logits, target, vocab_start, group):
        ctx.input_dtype = logits.dtype
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()  # the softmax needs fp32 range and precision
        logits_max = reduce_vocab_shards(logits.max(dim=-1).values, group, dist.ReduceOp.MAX)
        shifted = logits - logits_max.unsqueeze(-1)
        width = shifted.shape[-1]
        outside = (target < vocab_start) | (target >= vocab_start + width)
        local = (target - vocab_start).masked_fill(outside, 0).long()  # int32 ids (xla) index as int64
        target_logit = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        reduce_vocab_shards(target_logit, group)
        exp = shifted.exp_()
        sum_exp = reduce_vocab_shards(exp.sum(dim=-1), group)
        loss = torch.log(sum_exp) - target_logit
        exp.div_(sum_exp.unsqueeze(-1))  # now the softmax, kept for the backward pass
        ctx.save_for_backward(exp, outside, local)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, outside, local = ctx.saved_tensors
        grad = softmax
        grad.scatter_add_(-1, local.unsqueeze(-1), -(~outside).unsqueeze(-1).to(grad.dtype))
        grad.mul_(grad_loss.unsqueeze(-1))
        return grad.to(ctx.input_dtype), None, None, None


def eager_adam_step(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, *,
                    lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, step: int,
                    decoupled: bool) -> None:
    """One Adam(W) step on an fp32 tensor in place, as torch.optim.AdamW (decoupled) or Adam computes it."""
    g = grad.float()
    if decoupled:
        param.mul_(1.0 - lr * weight_decay)
    elif weight_decay:
        g = g.add(param, alpha=weight_decay)
    exp_avg.lerp_(g, 1.0 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
    denom = (exp_avg_sq.sqrt() / math.sqrt(1.0 - beta2 ** step)).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-lr / (1.0 - beta1 ** step))
