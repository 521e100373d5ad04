"""Every collective the trainer uses, and the conjugate autograd pairs built from them.

Keeping them in one module means one place to read when a run hangs, and one place to swap the
communication backend. The pairs follow Megatron's tensor-parallel identities: what is an identity
in the forward pass is an all-reduce in the backward pass, and the other way round.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

#: torch-xla's own switch: an all-reduce on a group of one takes the multi-rank path. The trainer honours it
#: for its sums too, so one process shows what every layout with world > 1 sends where.
ALWAYS_ALL_REDUCE = "XLA_ALWAYS_ALLREDUCE"


def size(group: dist.ProcessGroup | None) -> int:
    return 1 if group is None else dist.get_world_size(group)


def _reduces(group: dist.ProcessGroup | None) -> bool:
    """Whether a sum over `group` has to run (None: there is no such group)."""
    if group is None:
        return False
    return dist.get_world_size(group) > 1 or (os.environ.get(ALWAYS_ALL_REDUCE) == "1" and dist.get_backend(group) == "xla")


def all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup | None, op: str = "sum") -> torch.Tensor:
    """In-place all-reduce (sum or max); a no-op on a group of one."""
    if _reduces(group):
        dist.all_reduce(tensor, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op], group=group)
    return tensor


def all_reduce_async(tensor: torch.Tensor, group: dist.ProcessGroup | None):
    """Start a sum all-reduce in place and return its handle (wait() before using the tensor)."""
    return dist.all_reduce(tensor, group=group, async_op=True)


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


def copy_to_group(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    return x if size(group) == 1 else _CopyToGroup.apply(x, group)


def reduce_from_group(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    return x if size(group) == 1 else _ReduceFromGroup.apply(x, group)


def _gather_first_dim(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    n = size(group)
    if n == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=0)


def _reduce_scatter_first_dim(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    n = size(group)
    if n == 1:
        return x
    parts = [p.contiguous() for p in x.chunk(n, dim=0)]
    out = torch.empty_like(parts[0])
    dist.reduce_scatter(out, parts, group=group)
    return out


def _split_first_dim(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    n = size(group)
    if n == 1:
        return x
    return x.chunk(n, dim=0)[dist.get_rank(group)].contiguous()


class _GatherSequence(torch.autograd.Function):
    """Forward: all-gather the sequence shards. Backward: reduce-scatter (entry of a column-parallel
    region under sequence parallelism: every rank's partial gradient for every position is summed)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_first_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_first_dim(grad, ctx.group), None


class _ReduceScatterSequence(torch.autograd.Function):
    """Forward: reduce-scatter partial sums into sequence shards. Backward: all-gather (exit of a
    row-parallel region under sequence parallelism)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter_first_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_first_dim(grad, ctx.group), None


class _ScatterSequence(torch.autograd.Function):
    """Forward: keep this rank's sequence shard of a replicated tensor. Backward: all-gather."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_first_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_first_dim(grad, ctx.group), None


def gather_sequence(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    return x if size(group) == 1 else _GatherSequence.apply(x, group)


def reduce_scatter_sequence(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    return x if size(group) == 1 else _ReduceScatterSequence.apply(x, group)


def scatter_sequence(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    return x if size(group) == 1 else _ScatterSequence.apply(x, group)


def _all_to_all(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    x = x.contiguous()  # (empty_like would copy a transposed gradient's strides)
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    """Forward: chunk j of the first dimension goes to rank j, which keeps it as its chunk i (i: the sender).
    Backward: the same exchange of the gradients (the exchange is its own adjoint)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_to_all(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad, ctx.group), None


def all_to_all(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """The experts' token exchange: x's first dimension has one equal chunk per rank of `group`."""
    return x if size(group) == 1 else _AllToAll.apply(x, group)


def all_reduce_grads(tensors: list[torch.Tensor], group: dist.ProcessGroup | None) -> None:
    """Sum gradients of replicated parameters over a group (sequence-parallel norms, tied embeddings)."""
    if not _reduces(group) or not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


def all_reduce_among_copies(tensors: list[torch.Tensor], copies: int, rank: int,
                            group: dist.ProcessGroup | None) -> None:
    """Sum gradients over each run of `copies` neighbouring ranks of `group` (the ranks that hold the same
    key/value heads): one all-reduce of a buffer with a slot per run, which the other runs leave at zero."""
    if copies == 1 or not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    slots = flat.new_zeros(size(group) // copies, flat.numel())
    slots[rank // copies] = flat
    dist.all_reduce(slots, group=group)
    offset = 0
    for t in tensors:
        t.copy_(slots[rank // copies, offset:offset + t.numel()].view_as(t))
        offset += t.numel()


def reduce_scatter_flat(flat: torch.Tensor, shard: torch.Tensor, group: dist.ProcessGroup | None) -> None:
    """Sum a flat buffer over the group and keep this rank's contiguous shard (ZeRO-1 gradients)."""
    if size(group) == 1:
        shard.copy_(flat)
        return
    dist.reduce_scatter(shard, list(flat.chunk(size(group))), group=group)


def all_gather_flat(shard: torch.Tensor, flat: torch.Tensor, group: dist.ProcessGroup | None) -> None:
    """Every rank's shard into the full flat buffer (ZeRO-1 parameters after the step)."""
    if size(group) == 1:
        flat.copy_(shard)
        return
    dist.all_gather(list(flat.chunk(size(group))), shard, group=group)


def send_recv(send_next: torch.Tensor | None, send_prev: torch.Tensor | None, recv_next: torch.Tensor | None,
              recv_prev: torch.Tensor | None, next_rank: int, prev_rank: int) -> None:
    """Pipeline point-to-point: any of the four transfers at once, so neighbours never deadlock.

    With pp 2 the next and the previous rank are the same rank, so an activation and a gradient may
    travel between the same two ranks in one call: activations go first and carry their own tag, on
    both sides, so the two can never be swapped.
    """
    ops = []
    if send_next is not None:
        ops.append(dist.P2POp(dist.isend, send_next.contiguous(), next_rank, tag=_ACTIVATION))
    if recv_prev is not None:
        ops.append(dist.P2POp(dist.irecv, recv_prev, prev_rank, tag=_ACTIVATION))
    if send_prev is not None:
        ops.append(dist.P2POp(dist.isend, send_prev.contiguous(), prev_rank, tag=_GRADIENT))
    if recv_next is not None:
        ops.append(dist.P2POp(dist.irecv, recv_next, next_rank, tag=_GRADIENT))
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()


_ACTIVATION, _GRADIENT = 1, 2


def any_true(flag: bool, group: dist.ProcessGroup) -> bool:
    """True on every rank if it is true on any rank of `group`, a group for host numbers (ProcessGroups.host)."""
    t = torch.tensor([1.0 if flag else 0.0])
    all_reduce(t, group, "max")
    return bool(t.item())


def any_on_device(flag: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """`flag` (1.0 or 0.0, on the device) made 1.0 on every rank if it is 1.0 on any rank of `group`, without
    reading it on the host: the step's graph carries it to the update."""
    return all_reduce(flag.float().reshape(1), group, "max")
