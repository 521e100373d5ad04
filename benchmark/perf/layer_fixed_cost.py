"""The fixed cost of a transformer layer: the intercept of its forward-and-backward time against the tokens
it runs. The planner times a layer as work over rates (GEMMs on the measured curve, attention, element-wise
work on memory bandwidth), all proportional to tokens; kernel launches, synchronisation and the gaps
between kernels are not, and show as the intercept of a line through the layer's time at a few micro-batch
sizes (sequence fixed, so attention stays linear in tokens). The same fit is printed for the layer's 12
GEMMs alone (gemm_rates' timing: each launched alone, so their intercept holds their launches), so the
non-GEMM part's intercept is visible too; a split that is within the runs' noise where the line is long.

A layer here is one tensor-parallel rank's slice with Megatron's shapes, run eager and unfused (not as
Megatron runs it, which fuses LayerNorm, bias and GeLU, and gradient accumulation): LayerNorm, qkv h -> 3h/tp,
causal SDPA over heads/tp heads, projection h/tp -> h, LayerNorm, fc1 h -> 4h/tp, GeLU, fc2 4h/tp -> h, the
residuals; BF16 weights, no dropout, no tensor-parallel collectives, gradients cleared before each step.
`--layers` of them run forward then backward, timed with CUDA events; times are per layer.

    python benchmark/perf/layer_fixed_cost.py [--hidden 4096,12288] [--heads 32,96] [--tp 1,8]
        [--seq 2048] [--mbs 1,2,4,8] [--layers 4] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm_rates import Timer, gemm_seconds, layer_gemms, positive_int, positive_ints  # noqa: E402
from gputime import save_json  # noqa: E402


class Slice(nn.Module):
    """One tensor-parallel rank's share of a GPT layer."""

    def __init__(self, hidden: int, heads: int, tp: int) -> None:
        super().__init__()
        self.heads = heads // tp
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden // tp), nn.Linear(hidden // tp, hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden // tp), nn.Linear(4 * hidden // tp, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


def layer_seconds(hidden: int, heads: int, tp: int, seq: int, mbs: int, layers: int, device: torch.device,
                  repeats: int) -> float:
    """Median seconds of one layer's forward and backward, from `layers` run together."""
    model = nn.Sequential(*(Slice(hidden, heads, tp) for _ in range(layers))).to(device, torch.bfloat16)
    x = torch.randn(mbs, seq, hidden, device=device, dtype=torch.bfloat16, requires_grad=True)

    params = [x, *model.parameters()]

    def step() -> None:
        for p in params:  # no accumulation into last step's gradients: Megatron fuses that into the GEMM
            p.grad = None
        model(x).float().sum().backward()

    step()
    return Timer(device, repeats)(step) / layers


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--hidden", type=positive_ints, default=[4096, 12288])
    ap.add_argument("--heads", type=positive_ints, default=[32, 96])
    ap.add_argument("--tp", type=positive_ints, default=[1, 8])
    ap.add_argument("--seq", type=positive_int, default=2048)
    ap.add_argument("--mbs", type=positive_ints, default=[1, 2, 4, 8])
    ap.add_argument("--layers", type=positive_int, default=4)
    ap.add_argument("--repeats", type=positive_int, default=10)
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if not (len(args.hidden) == len(args.heads) == len(args.tp)) or len(set(args.mbs)) < 2:
        print("layer_fixed_cost: --hidden, --heads and --tp need one entry each per layer shape, "
              "--mbs two sizes or more", file=sys.stderr)
        return 2
    bad = [(h, a, t) for h, a, t in zip(args.hidden, args.heads, args.tp, strict=True) if h % a or a % t]
    if bad:
        print(f"layer_fixed_cost: heads must divide hidden and tp divide heads: {bad}", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"# device {name}, torch {torch.__version__}, seq {args.seq}, {args.layers} layers a run, "
          f"repeats {args.repeats}; ms per layer, forward + backward")
    found: dict = {"device": name, "torch": torch.__version__, "seq": args.seq, "shapes": []}
    timer = Timer(device, args.repeats)
    for hidden, heads, tp in zip(args.hidden, args.heads, args.tp, strict=True):
        rows = []
        for mbs in args.mbs:
            tokens = mbs * args.seq
            layer = layer_seconds(hidden, heads, tp, args.seq, mbs, args.layers, device, args.repeats)
            if device.type == "cuda":  # the layers' memory, freed on return, back to the device for the next size
                torch.cuda.empty_cache()
            gemms = sum(gemm_seconds(timer, "bf16", *s, device) for s in layer_gemms(hidden, tp, tokens))
            rows.append({"mbs": mbs, "tokens": tokens, "layer_ms": layer * 1e3, "gemm_ms": gemms * 1e3})
            print(f"hidden {hidden} tp {tp} mbs {mbs} tokens {tokens}: layer {layer * 1e3:.4g} ms, "
                  f"its GEMMs {gemms * 1e3:.4g} ms")
        tokens = [r["tokens"] for r in rows]
        fits = {key: statistics.linear_regression(tokens, [r[f"{key}_ms"] for r in rows]) for key in ("layer", "gemm")}
        rest = statistics.linear_regression(tokens, [r["layer_ms"] - r["gemm_ms"] for r in rows])
        print(f"hidden {hidden} tp {tp}: intercept layer {fits['layer'].intercept:.3g} ms, GEMMs {fits['gemm'].intercept:.3g} "
              f"ms, the rest {rest.intercept:.3g} ms; slope layer {fits['layer'].slope * 1e3:.4g} ms a thousand tokens")
        found["shapes"].append({"hidden": hidden, "heads": heads, "tp": tp, "rows": rows,
                                "intercept_ms": {"layer": fits["layer"].intercept, "gemm": fits["gemm"].intercept,
                                                 "rest": rest.intercept}})
    save_json(args.json_out, found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
