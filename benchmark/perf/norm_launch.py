"""Time the Triton norm kernels over launch settings (fused or split backward, warps, programs per
multiprocessor), forward and backward apart, against torch eager, on one GPU; the chosen defaults in
nlp_bench.kernels.norms.LAUNCH come from this.

    python benchmark/perf/norm_launch.py [--widths 4096,12288]
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch
import torch.nn.functional as F


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="4096,12288")
    ap.add_argument("--rows", type=int, default=8192)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("benchmark/perf/norm_launch.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from triton.testing import do_bench

    from nlp_bench.kernels import norms

    for n in map(int, args.widths.split(",")):
        x = torch.randn(args.rows, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.ones(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        b = torch.zeros(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn_like(x)
        y = F.layer_norm(x, (n,), w, b)
        fwd = do_bench(lambda: F.layer_norm(x, (n,), w, b), return_mode="median")
        bwd = do_bench(lambda: torch.autograd.grad(y, (x, w, b), dy, retain_graph=True), return_mode="median")
        print(f"{args.rows}x{n} eager layer_norm: forward {fwd:.3f} ms, backward {bwd:.3f} ms")
        for rms, variant, warps, per in itertools.product((False, True), ("fused", "split"), (None, 8, 16), (1, 4)):
            if variant == "fused" and n > 16384:
                continue  # the accumulators cannot fit beside the row
            norms.LAUNCH.update(forward_warps=warps, backward_warps=warps, forward_per_processor=per,
                                backward_per_processor=per, fused_backward_max=n if variant == "fused" else 0)
            label = f"  {'rms' if rms else 'ln '} {variant:5} backward, warps {warps or 'default':>7}, per-SM {per}"
            try:
                run = (lambda: norms.rms_norm(x, w, 1e-5)) if rms else (lambda: norms.layer_norm(x, w, b, 1e-5))
                out = run()
                inputs = (x, w) if rms else (x, w, b)
                f = do_bench(run, return_mode="median")
                g = do_bench(lambda: torch.autograd.grad(out, inputs, dy, retain_graph=True), return_mode="median")
            except Exception as exc:  # a launch the hardware refuses (too many registers, say)
                print(f"{label}: {type(exc).__name__}")
                continue
            print(f"{label}: forward {f:.3f} ms ({fwd / f:.2f}x eager), backward {g:.3f} ms ({bwd / g:.2f}x eager),"
                  f" both {(fwd + bwd) / (f + g):.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
