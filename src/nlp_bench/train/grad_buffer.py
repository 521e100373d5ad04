"""Data parallelism's gradient buffer: every parameter's gradient in one fp32 buffer, reduced over the
data-parallel ranks in buckets while the backward pass still runs, or reduce-scattered into shards for
Megatron's distributed optimizer (ZeRO-1).

In fp32 the parameters and their gradients are themselves views of the flat buffers, so autograd
accumulates in place and an update needs no copy; in bf16/fp16 a hook moves each half-precision gradient
into the fp32 buffer as soon as it exists, and the fp32 weights are a separate copy.

The buffer holds the parameters in reverse order of creation, roughly the order in which the backward
pass finishes them, cut into buckets of at least `bucket_size` elements. Without the distributed
optimizer, a bucket is all-reduced over dp (asynchronously) as soon as each of its parameters has
received the gradient of the iteration's last micro-batch, so the reduction overlaps the rest of the
backward pass.
"""

from __future__ import annotations

import torch
from torch import nn

from nlp_bench.train import collectives
from nlp_bench.train.process_groups import ProcessGroups


class GradBuffer:
    def __init__(self, model: nn.Module, groups: ProcessGroups, *, shards: int, micro_batches: int = 1,
                 bucket_size: int = 40_000_000) -> None:
        self.groups, self.shards, self.micro_batches = groups, shards, micro_batches
        tied = {id(p) for p in model.tied_weights()} if hasattr(model, "tied_weights") else set()
        backward_order = [p for p in model.parameters() if p.requires_grad][::-1]
        experts = [p for p in backward_order if getattr(p, "expert_parallel", False)]
        # tied copies go last, outside every bucket: they are summed over the embedding group first; the
        # experts' shards after them, summed over their own group (ProcessGroups.experts)
        dense = [p for p in backward_order if id(p) not in tied and not getattr(p, "expert_parallel", False)]
        self.params = dense + [p for p in backward_order if id(p) in tied] + experts
        self.numel = sum(p.numel() for p in self.params)
        padded = -(-self.numel // shards) * shards
        self.fp32 = all(p.dtype == torch.float32 for p in self.params)
        device = self.params[0].device
        self.main_grad = torch.zeros(padded, dtype=torch.float32, device=device)
        #: the fp32 weights, whole (each dp rank updates its own shard, see `range`)
        self.weights = torch.zeros(padded, dtype=torch.float32, device=device)
        self.offsets: list[int] = []
        self.buckets: list[tuple[int, int, int]] = []  # (start, end, number of parameters)
        self._bucket_of: dict[int, int] = {}
        self._late: list[nn.Parameter] = []
        self._experts = experts
        counted = self._lay_out(tied, bucket_size)
        #: the experts' shards within the buffer: their norm is summed over expert tp x ep apart from the rest
        self.expert_range = slice(self.numel - sum(p.numel() for p in experts), self.numel)
        self.overlap = shards == 1 and groups.dp > 1
        self._fired: dict[int, int] = {}
        self._ready = [0] * len(self.buckets)
        self._pending: dict[int, object] = {}
        self.overlapped = 0  # buckets reduced during the backward pass, over the whole run
        self.shard_size = padded // shards
        lo = (groups.dp_rank if shards > 1 else 0) * self.shard_size
        self.range = slice(lo, lo + self.shard_size)
        counted = counted[self.range]
        #: which elements of this rank's shard count in the global gradient norm (None: all of them)
        self.counted = None if bool(counted.all()) else counted.bool()
        self.grad_shard = self.main_grad if shards == 1 else torch.zeros(self.shard_size, device=device)

    def _lay_out(self, tied: set[int], bucket_size: int) -> torch.Tensor:
        """Place every parameter in the buffers and cut the buckets; the mask of elements the norm counts."""
        counted = torch.zeros_like(self.main_grad)
        offset = bucket_start = bucket_params = 0
        for p in self.params:
            n = p.numel()
            self.offsets.append(offset)
            self.weights[offset:offset + n] = p.detach().reshape(-1).float()
            p.main_grad = self.main_grad[offset:offset + n].view_as(p)
            if self.fp32:
                p.data = self.weights[offset:offset + n].view_as(p)
                p.grad = p.main_grad  # autograd adds into the buffer in place
            p.register_post_accumulate_grad_hook(self._on_grad)
            # the global norm counts tp shards on every rank (a shard several ranks hold, on the first of
            # them), replicated tensors and tied copies once
            copies = getattr(p, "tp_copies", 1)
            once = (getattr(p, "tensor_parallel", False) and self.groups.tp_rank % copies == 0
                    or self.groups.tp_rank == 0)
            expert = getattr(p, "expert_parallel", False)
            counted[offset:offset + n] = 1.0 if once and not getattr(p, "shared_copy", False) and not expert else 0.0
            offset += n
            if expert:
                continue
            if id(p) in tied:
                self._late.append(p)
                continue
            self._bucket_of[id(p)] = len(self.buckets)
            bucket_params += 1
            if offset - bucket_start >= bucket_size:
                self.buckets.append((bucket_start, offset, bucket_params))
                bucket_start, bucket_params = offset, 0
        if bucket_params:  # the tied copies and the experts' shards, last in the buffer, stay outside
            outside = sum(p.numel() for p in self._late) + sum(p.numel() for p in self._experts)
            self.buckets.append((bucket_start, offset - outside, bucket_params))
        return counted

    def _on_grad(self, p: torch.Tensor) -> None:
        if not self.fp32:
            p.main_grad.add_(p.grad)  # fp32 accumulation of a half-precision gradient
            p.grad = None
        if not self.overlap or id(p) not in self._bucket_of:
            return
        fired = self._fired.get(id(p), 0) + 1
        self._fired[id(p)] = fired
        if fired == self.micro_batches:  # this parameter's gradient for the iteration is complete
            b = self._bucket_of[id(p)]
            self._ready[b] += 1
            if self._ready[b] == self.buckets[b][2]:
                start, end, _ = self.buckets[b]
                self._pending[b] = collectives.all_reduce_async(self.main_grad[start:end], self.groups.dp_group)

    def zero(self) -> None:
        self.main_grad.zero_()
        self._fired.clear()
        self._ready = [0] * len(self.buckets)

    def reduce(self, loss_scale: float) -> None:
        """Sum the gradients over dp (and the tied copies over the embedding group) into this rank's shard,
        and take the mean, unscaled."""
        groups = self.groups
        if self.shards > 1:
            collectives.all_reduce_grads([p.main_grad for p in self._late], groups.embedding_group)
            collectives.reduce_scatter_flat(self.main_grad, self.grad_shard, groups.dp_group)
        else:
            for b, (start, end, _) in enumerate(self.buckets):
                if b in self._pending:
                    self._pending.pop(b).wait()
                    self.overlapped += 1
                else:  # a bucket the backward pass did not complete (e.g. a parameter without gradient)
                    collectives.all_reduce(self.main_grad[start:end], groups.dp_group)
            late = [p.main_grad for p in self._late]
            collectives.all_reduce_grads(late, groups.embedding_group)
            collectives.all_reduce_grads(late, groups.dp_group)
            if self._experts:  # every rank's tokens reached them: the sum over their copies is over all tokens
                collectives.all_reduce_grads([p.main_grad for p in self._experts], groups.experts.edp_group)
        # sums commute: summing sequence-parallel gradients over tp after dp gives the same numbers
        collectives.all_reduce_grads(self._grads_of(lambda p: getattr(p, "sequence_parallel", False)), groups.tp_group)
        copies = max((getattr(p, "tp_copies", 1) for p in self.params), default=1)
        collectives.all_reduce_among_copies(self._grads_of(lambda p: getattr(p, "tp_copies", 1) > 1), copies,
                                            groups.tp_rank, groups.tp_group)
        self.grad_shard.div_(groups.dp * loss_scale)

    def _grads_of(self, chosen) -> list[torch.Tensor]:
        """This rank's part of the gradients of the `chosen` parameters (in the shard, if sharded). The ranks of
        a tp group lay their buffers out alike, so each gets the same parts."""
        out = []
        lo, hi = self.range.start, self.range.stop
        for p, offset in zip(self.params, self.offsets, strict=True):
            a, b = max(offset, lo), min(offset + p.numel(), hi)
            if chosen(p) and b > a:
                out.append(self.grad_shard[a - lo:b - lo])
        return out

    def write_back(self, shard: torch.Tensor) -> None:
        """The updated fp32 shard into the whole weights on every dp rank, then into the parameters."""
        if self.shards > 1:
            collectives.all_gather_flat(shard.clone(), self.weights, self.groups.dp_group)
        if self.fp32:
            return  # the parameters are views of self.weights
        with torch.no_grad():
            for p, offset in zip(self.params, self.offsets, strict=True):
                p.copy_(self.weights[offset:offset + p.numel()].view_as(p))
