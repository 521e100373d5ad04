"""Time the trainer's MoE layer (nlp_bench.train.moe: one batched GEMM over padded expert groups) against a
plain PyTorch MoE of the same shape and weights (a router, then a Python loop over the experts, each its own
nn.Linear pair over the tokens routed to it, as Hugging Face's Mixtral block does), forward and backward on
CPU, and print the tokens/s of each and their ratio (median of --repeats, after a warm-up). Both are first
checked to give the same output.

Then the peak memory of the trainer layer's dispatch (routing, the padded expert groups, the combine; the
expert GEMMs left out) at a few token counts: the most bytes of tensors the dispatch allocated that were
alive at once, counted by a TorchDispatchMode (tracemalloc cannot see torch's allocator), so growth with
tokens shows whether the dispatch stays linear.

    python benchmark/perf/moe_layer.py [--tokens 4096] [--hidden 512] [--ffn 1024] [--experts 8] [--topk 2]
                                       [--repeats 7] [--memory-tokens 1024,4096,16384] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time
import weakref

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from nlp_bench.train.config import GPTConfig, MoEConfig
from nlp_bench.train.layers import TensorParallel
from nlp_bench.train.moe import MoELayer, capacity, dispatch, route


class LoopMoE(nn.Module):
    """A plain MoE: softmax router, top-k renormalised, a loop over the experts."""

    def __init__(self, ours: MoELayer) -> None:
        super().__init__()
        self.topk = ours.moe.topk
        self.router = nn.Linear(ours.router.shape[1], ours.router.shape[0], bias=False)
        self.router.weight.data.copy_(ours.router.data)
        self.fc1 = nn.ModuleList()
        self.fc2 = nn.ModuleList()
        for e in range(ours.moe.num_experts):
            a = nn.Linear(*ours.experts.fc1.shape[1:], bias=False)
            a.weight.data.copy_(ours.experts.fc1.data[e].t())
            b = nn.Linear(*ours.experts.fc2.shape[1:], bias=False)
            b.weight.data.copy_(ours.experts.fc2.data[e].t())
            self.fc1.append(a)
            self.fc2.append(b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen = torch.topk(torch.softmax(self.router(flat), dim=-1, dtype=torch.float32), self.topk)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(flat.dtype)
        out = torch.zeros_like(flat)
        for e, (fc1, fc2) in enumerate(zip(self.fc1, self.fc2, strict=True)):
            token, slot = torch.where(chosen == e)
            if token.numel():
                gate, up = fc1(flat[token]).chunk(2, dim=-1)
                out.index_add_(0, token, fc2(F.silu(gate) * up) * weights[token, slot, None])
        return out.view(x.shape)


class PeakTensors(TorchDispatchMode):
    """The most bytes of tensors created under this mode that were alive at once."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.now = self.peak = 0

    def _release(self, key: int) -> None:
        self.now -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes():
                key = t.untyped_storage().data_ptr()
                if key not in self.live:
                    self.live[key] = t.untyped_storage().nbytes()
                    self.now += self.live[key]
                    self.peak = max(self.peak, self.now)
                    weakref.finalize(t, self._release, key)
        return out


def build(args: argparse.Namespace) -> MoELayer:
    moe = MoEConfig(args.experts, args.topk, args.ffn, (True,), "softmax", 0.0, None, "probs", None)
    cfg = GPTConfig(num_layers=1, hidden_size=args.hidden, num_attention_heads=8, ffn_hidden_size=args.ffn,
                    seq_length=args.tokens, max_position_embeddings=args.tokens, vocab_padded=128,
                    num_query_groups=8, swiglu=True, add_bias_linear=False, moe=moe)
    return MoELayer(cfg, TensorParallel(1, 0, None), index=0)


def seconds(layer: nn.Module, x: torch.Tensor, repeats: int) -> float:
    """Median seconds of one forward and backward."""
    times = []
    for i in range(repeats + 1):
        x.grad = None
        start = time.perf_counter()
        layer(x).sum().backward()
        if i:  # the first is a warm-up
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def dispatch_peak(layer: MoELayer, tokens: int, hidden: int) -> int:
    """Peak bytes of the dispatch and combine of `tokens` tokens (the experts' GEMMs replaced by identity)."""
    x = torch.randn(tokens, hidden)
    m = layer.moe
    with torch.no_grad(), PeakTensors() as mode:
        routing = route(F.linear(x, layer.router), m.topk)
        plan = dispatch(routing, m.num_experts, capacity(tokens, m.num_experts, m.topk, m.capacity_factor))
        groups = x.new_zeros(m.num_experts, plan.slots, hidden)
        groups[plan.expert, plan.slot] = x[plan.token]
        out = groups[plan.expert, plan.slot] * plan.weight.unsqueeze(-1)
        torch.zeros_like(x).index_add_(0, plan.token, out)
    return mode.peak


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in {"tokens": 4096, "hidden": 512, "ffn": 1024, "experts": 8, "topk": 2, "repeats": 7,
                          "threads": None}.items():
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--memory-tokens", default="1024,4096,16384")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ours = build(args)
    plain = LoopMoE(ours)
    x = torch.randn(args.tokens, 1, args.hidden, requires_grad=True)
    with torch.no_grad():
        assert torch.allclose(ours(x), plain(x), atol=1e-5), "the two layers disagree"
    t_ours, t_plain = seconds(ours, x, args.repeats), seconds(plain, x, args.repeats)
    print(f"MoE layer, {args.tokens} tokens, hidden {args.hidden}, expert ffn {args.ffn} (SwiGLU), {args.experts} "
          f"experts, top-{args.topk}, fp32, {torch.get_num_threads()} threads, forward + backward, median of "
          f"{args.repeats}")
    print(f"  trainer (batched GEMM): {args.tokens / t_ours:12.0f} tokens/s ({t_ours * 1e3:.1f} ms)")
    print(f"  plain loop over experts: {args.tokens / t_plain:11.0f} tokens/s ({t_plain * 1e3:.1f} ms)")
    print(f"  ratio: {t_plain / t_ours:.2f}x")
    print("dispatch and combine, peak bytes of live tensors (no grad):")
    for tokens in (int(v) for v in args.memory_tokens.split(",")):
        peak = dispatch_peak(ours, tokens, args.hidden)
        print(f"  {tokens:7d} tokens: {peak / 2**20:9.2f} MiB  ({peak / tokens:.0f} bytes per token)")


if __name__ == "__main__":
    main()
