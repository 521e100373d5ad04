"""Every collective the trainer uses, and the conjugate autograd pairs built from them.

Keeping them in one module means one place to read when a run hangs, and one place to swap the
communication backend. The pairs follow Megatron's tensor-parallel identities: what is an identity
in the forward pass is an all-reduce in the backward pass, and the other way round.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def size(group: dist.ProcessGroup | None) -> int:
    return 1 if group is None else dist.get_world_size(group)


def all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup | None, op: str = "sum") -> torch.Tensor:
    """In-place all-reduce (sum or max); a no-op on a group of one."""
    if size(group) > 1:
        dist.all_reduce(tensor, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op], group=group)
    return tensor


def all_reduce_mean_flat(tensors: list[torch.Tensor], group: dist.ProcessGroup | None) -> None:
    """Average many tensors over a group with one collective on a flat buffer (data-parallel gradients)."""
    n = size(group)
    if n == 1 or not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    flat.div_(n)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


def _gather_last_dim(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    n = size(group)
    if n == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=-1)


def _split_last_dim(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    n = size(group)
    if n == 1:
        return x
    return x.chunk(n, dim=-1)[dist.get_rank(group)].contiguous()


class _CopyToGroup(torch.autograd.Function):
    """Forward: identity. Backward: sum the gradients of all ranks (entry of a column-parallel region)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad.contiguous(), ctx.group), None


class _ReduceFromGroup(torch.autograd.Function):
    """Forward: sum the partial results of all ranks. Backward: identity (exit of a row-parallel region)."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x.contiguous(), group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromGroup(torch.autograd.Function):
    """Forward: concatenate the last dimension across ranks. Backward: keep this rank's slice."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_last_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _split_last_dim(grad, ctx.group), None


def copy_to_group(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    return x if size(group) == 1 else _CopyToGroup.apply(x, group)


def reduce_from_group(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    return x if size(group) == 1 else _ReduceFromGroup.apply(x, group)


def gather_from_group(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    return x if size(group) == 1 else _GatherFromGroup.apply(x, group)
