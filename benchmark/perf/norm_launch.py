"""Time the Triton norm kernels over launch settings on one GPU, forward and backward apart, against torch
eager, and print the fastest setting of each; the defaults in nlp_bench.kernels.norms.LAUNCH (and
LAUNCH_BY_WIDTH) come from this. Settings: warps per program; whole rows (one or a tile of a few per
program, optionally with the next tile loaded ahead) or chunks of the row read twice; programs per
multiprocessor (0: one program per tile, no persistent loop); for the backward, the fused kernel
(parameter-gradient sums in registers) or dx and the tiled parameter-gradient kernel apart.
benchmark/perf/norm_registers.py shows, without a GPU, which of these spill.

    python benchmark/perf/norm_launch.py [--widths 4096,12288] [--warps 0,8,16,32] [--tile-rows 1,2]
                                         [--prefetch 0,1] [--chunks 2048,4096] [--per-processor 0,1,2,4]
                                         [--norms layer_norm,rms_norm]
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch
import torch.nn.functional as F


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="4096,12288")
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--warps", default="0,8,16,32", help="0: the default for the block width")
    ap.add_argument("--tile-rows", default="1,2")
    ap.add_argument("--chunks", default="2048,4096", help="columns per chunk for the chunked kernels")
    ap.add_argument("--prefetch", default="0,1", help="whole rows without (0) and with (1) the next tile loaded ahead")
    ap.add_argument("--per-processor", default="0,1,2,4", help="0: one program per tile")
    ap.add_argument("--norms", default="layer_norm", help="layer_norm, rms_norm or both, comma-separated")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("benchmark/perf/norm_launch.py needs a CUDA GPU (norm_registers.py runs without one)", file=sys.stderr)
        return 2
    from triton.testing import do_bench

    from nlp_bench.kernels import norms

    default = dict(norms.LAUNCH)
    for n in _ints(args.widths):
        layouts = [(rows, 0, ahead) for rows in _ints(args.tile_rows) for ahead in _ints(args.prefetch)]
        layouts += [(1, c, 0) for c in _ints(args.chunks) if 0 < c < n]
        settings = list(itertools.product(_ints(args.warps), layouts, _ints(args.per_processor)))
        x = torch.randn(args.rows, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.ones(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        b = torch.zeros(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn_like(x)
        y = F.layer_norm(x, (n,), w, b)
        eager_f = do_bench(lambda: F.layer_norm(x, (n,), w, b), return_mode="median")
        eager_b = do_bench(lambda: torch.autograd.grad(y, (x, w, b), dy, retain_graph=True), return_mode="median")
        print(f"{args.rows}x{n} eager layer_norm: forward {eager_f:.3f} ms, backward {eager_b:.3f} ms")
        for rms in (name == "rms_norm" for name in args.norms.split(",")):
            inputs = (x, w) if rms else (x, w, b)
            best = {}
            for phase, variant, (warps, (rows, chunk, ahead), per) in itertools.chain(
                    (("forward", "", s) for s in settings),
                    (("backward", v, s) for v in ("fused", "split") for s in settings)):
                if variant == "fused" and (n > 16384 or per == 0 or chunk):
                    continue  # accumulators too wide for registers; the fused backward is persistent, whole rows
                if ahead and per == 0:
                    continue  # one program per tile has no next tile to load
                setting = {f"{phase}_warps": warps, f"{phase}_rows": rows, f"{phase}_chunk": chunk,
                           f"{phase}_prefetch": ahead, f"{phase}_per_processor": max(per, 1)}
                if phase == "backward":
                    setting["fused_backward_max"] = n if variant == "fused" else 0
                norms.LAUNCH.update(default)
                norms.LAUNCH.update(setting, **{f"{phase}_warps": warps or None})

                def run():
                    if rms:
                        return norms.rms_norm(x, w, 1e-5, per > 0)
                    return norms.layer_norm(x, w, b, 1e-5, per > 0)

                layout = f"chunks of {chunk}" if chunk else f"rows {rows}{' ahead' if ahead else ''}"
                label = (f"{phase:8} {variant:5} warps {warps or 'default':>7}, {layout},"
                         f" {f'per-SM {per}' if per else 'per tile'}")
                kind = "rms" if rms else "ln "
                try:
                    if phase == "forward":
                        ms = do_bench(run, return_mode="median")
                    else:
                        out = run()
                        ms = do_bench(lambda: torch.autograd.grad(out, inputs, dy, retain_graph=True),
                                      return_mode="median")
                except Exception as exc:  # a launch the hardware refuses (too many registers, say)
                    print(f"  {kind} {label}: {type(exc).__name__}")
                    continue
                eager = eager_f if phase == "forward" else eager_b
                print(f"  {kind} {label}: {ms:.3f} ms ({eager / ms:.2f}x eager)", flush=True)
                if ms < best.get(phase, (float("inf"),))[0]:
                    best[phase] = (ms, " ".join(label.split()), setting, per > 0)
            if len(best) == 2:
                total = best["forward"][0] + best["backward"][0]
                flags = ",".join(f"{n}:{k}={v}" for k, v in {**best["forward"][2], **best["backward"][2]}.items())
                persistent = best["forward"][3] and best["backward"][3]
                print(f"  best {'rms' if rms else 'ln'}: {best['forward'][1]} + {best['backward'][1]}:"
                      f" {total:.3f} ms, {(eager_f + eager_b) / total:.2f}x eager forward+backward\n"
                      f"    kernels.py --norm-launch {flags}"
                      f"{'' if persistent else '  (one program per tile: as with --no-persist-layer-norm)'}",
                      flush=True)
    norms.LAUNCH.update(default)
    return 0


if __name__ == "__main__":
    sys.exit(main())
