"""Time the Triton norm kernels over launch settings on one GPU against torch eager, forward and backward,
and print the fastest setting of each width in the form NLP_BENCH_NORM_LAUNCH and kernels.py
--norm-launch take; the defaults in nlp_bench.kernels.norm_settings come from this.

Settings: warps per program; whole rows (one or a tile of a few per program, optionally with the next tile
loaded ahead) or chunks of the row read twice; programs per multiprocessor (0: one program per tile, no
persistent loop); for the backward, the fused kernel (parameter-gradient sums in registers) or dx and the
tiled parameter-gradient kernel apart, and then, over the best dx setting, that kernel's tiles, warps and
rows per program. Every setting's output and gradients are first checked against an
fp32 reference; a wrong one is reported and never chosen.

Times are GPU times, replayed from CUDA graphs: the forward alone, and forward + backward with the default
forward (the backward's figure is that minus the default forward's). benchmark/perf/norm_registers.py
shows, without a GPU, which settings spill.

    python benchmark/perf/norm_launch.py [--widths 4096,12288] [--warps 0,8,16,32] [--tile-rows 1,2]
                                         [--prefetch 0,1] [--chunks 2048,4096] [--per-processor 0,1,2,4]
                                         [--param-tiles 16x128,32x64] [--param-warps 4,8] [--param-rows 256]
                                         [--norms layer_norm,rms_norm] [--rows 8192] [--out FILE]

Without a GPU, under TRITON_INTERPRET=1 and at a small shape (say --rows 5 --widths 40 --chunks 16), it
checks every setting on CPU and runs the whole script; its times are then the interpreter's, not a GPU's.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def candidates(n: int, args: argparse.Namespace) -> Iterator[tuple[str, str, dict, bool, str]]:
    """(phase, variant, LAUNCH keys to set, persistent, label) for every setting worth timing at width n."""
    layouts = [(rows, 0, ahead) for rows in _ints(args.tile_rows) for ahead in _ints(args.prefetch)]
    layouts += [(1, c, 0) for c in _ints(args.chunks) if 0 < c < n]
    grid = list(itertools.product(_ints(args.warps), layouts, _ints(args.per_processor)))
    for phase, variant in (("forward", ""), ("backward", "fused"), ("backward", "split")):
        for warps, (rows, chunk, ahead), per in grid:
            if variant == "fused" and (n > 16384 or per == 0 or chunk):
                continue  # accumulators too wide for registers; the fused backward is persistent, whole rows
            if ahead and per == 0:
                continue  # one program per tile has no next tile to load
            keys = {f"{phase}_warps": warps, f"{phase}_rows": rows, f"{phase}_chunk": chunk,
                    f"{phase}_prefetch": ahead, f"{phase}_per_processor": max(per, 1)}
            if phase == "backward":
                keys["fused_backward_max"] = n if variant == "fused" else 0
            layout = f"chunks of {chunk}" if chunk else f"rows {rows}{' ahead' if ahead else ''}"
            label = f"{phase} {variant} warps {warps or 'default'}, {layout}, {f'per-SM {per}' if per else 'per tile'}"
            yield phase, variant, keys, per > 0, " ".join(label.split())


def param_settings(args: argparse.Namespace) -> Iterator[tuple[int, int, int, int]]:
    """(tile rows, columns, warps, rows per program) of the parameter-gradient kernel."""
    for shape, warps, rows in itertools.product(args.param_tiles.split(","), _ints(args.param_warps),
                                                _ints(args.param_rows)):
        tile, cols = (int(v) for v in shape.split("x"))
        yield tile, cols, warps, rows


def wrong(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> str:
    """Empty if every tensor matches its fp32 reference to within bf16 rounding (1% of the largest
    value), else which one does not and by how much."""
    for name, a, b in zip(("y", "dx", "dw", "db"), got, want, strict=False):
        err, scale = (a.float() - b).abs().max().item(), b.abs().max().item()
        if not err <= 1e-2 * scale:
            return f"{name} off by {err:.3g} (largest value {scale:.3g})"
    return ""


class Case:
    """One norm at one width: its inputs and fp32 reference, and the ops to time on them."""

    def __init__(self, rms: bool, rows: int, n: int, device: str):
        from nlp_bench.kernels import norms

        self.rms, self.n, self.norms = rms, n, norms
        self.kind = "rms_norm" if rms else "layer_norm"
        self.x = torch.randn(rows, n, device=device, dtype=torch.bfloat16, requires_grad=True)
        self.w = (1 + 0.1 * torch.randn(n, device=device, dtype=torch.bfloat16)).requires_grad_()
        self.b = None if rms else (0.1 * torch.randn(n, device=device, dtype=torch.bfloat16)).requires_grad_()
        self.dy = torch.randn_like(self.x)
        self.inputs = tuple(t for t in (self.x, self.w, self.b) if t is not None)
        fp32 = [t.detach().float().requires_grad_() for t in self.inputs]
        ref = self.eager(*fp32)
        self.want = (ref.detach(), *torch.autograd.grad(ref, fp32, self.dy.float()))

    def eager(self, x=None, w=None, b=None) -> torch.Tensor:
        x, w, b = (x, w, b) if x is not None else (self.x, self.w, self.b)
        return F.rms_norm(x, (self.n,), w, 1e-5) if self.rms else F.layer_norm(x, (self.n,), w, b, 1e-5)

    def ours(self, persistent: bool = True) -> torch.Tensor:
        if self.rms:
            return self.norms.triton_rms_norm(self.x, self.w, 1e-5, persistent)
        return self.norms.triton_layer_norm(self.x, self.w, self.b, 1e-5, persistent)

    def both(self, forward: Callable[[], torch.Tensor]) -> Callable[[], object]:
        """Forward and backward, as one closure to time."""
        return lambda: torch.autograd.grad(forward(), self.inputs, self.dy)

    def problem(self, persistent: bool) -> str:
        """What is wrong with the current launch settings' output and gradients, or empty."""
        out = self.ours(persistent)
        return wrong((out, *torch.autograd.grad(out, self.inputs, self.dy)), self.want)


def sweep(case: Case, args: argparse.Namespace, time_of: Callable[[Callable[[], object]], float],
          reset: Callable[[], None]) -> str | None:
    """Check and time every setting for one norm at one width; the fastest as an NLP_BENCH_NORM_LAUNCH value."""
    from nlp_bench.kernels import norm_settings

    n = case.n
    eager_f, eager_fb = time_of(case.eager), time_of(case.both(case.eager))
    reset()
    ours_f = {persistent: time_of(lambda p=persistent: case.ours(p)) for persistent in (True, False)}
    print(f"{args.rows}x{n} {case.kind}: eager forward {eager_f:.3f} ms, backward {eager_fb - eager_f:.3f} ms;"
          f" the default forward {ours_f[True]:.3f} ms (one program per tile {ours_f[False]:.3f} ms)", flush=True)
    best: dict[str, tuple[float, str, str, bool]] = {}  # forward, backward, split: (ms, label, flags, persistent)

    def measure(phase: str, variant: str, label: str, flags: str, persistent: bool) -> None:
        reset()
        norm_settings.override(flags)  # over the defaults, as NLP_BENCH_NORM_LAUNCH would be

        def forward():
            return case.ours(persistent)
        try:
            problem = case.problem(persistent)
            ms = None if problem else time_of(forward if phase == "forward" else case.both(forward))
        except Exception as exc:  # a launch the hardware refuses (too many registers, say)
            problem = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
        if problem:
            print(f"  {label}: WRONG OR FAILED, {problem}", flush=True)
            return
        if phase == "backward":
            ms -= ours_f[persistent]
        eager_ms = eager_f if phase == "forward" else eager_fb - eager_f
        print(f"  {label}: {ms:.3f} ms ({eager_ms / ms:.2f}x eager)", flush=True)
        for kept in (phase, variant) if variant == "split" else (phase,):
            if ms < best.get(kept, (float("inf"),))[0]:
                best[kept] = (ms, label, flags, persistent)

    for phase, variant, keys, persistent, label in candidates(n, args):
        measure(phase, variant, label, ",".join(f"{n}:{key}={int(value)}" for key, value in keys.items()), persistent)
    if "split" in best:  # the split backward's parameter-gradient kernel, over its best dx setting
        _, label, flags, persistent = best["split"]
        for tile, cols, warps, rows in param_settings(args):
            keys = {"param_tile": tile, "param_cols": cols, "param_warps": warps, "param_rows": rows}
            measure("backward", "split", f"{label}, parameter tiles {tile}x{cols} warps {warps} rows {rows}",
                    flags + "".join(f",{n}:{key}={value}" for key, value in keys.items()), persistent)
    if "forward" not in best or "backward" not in best:
        return None
    (f_ms, f_label, f_flags, f_persistent), (b_ms, b_label, b_flags, b_persistent) = best["forward"], best["backward"]
    note = "" if f_persistent and b_persistent else "  (one program per tile: as with --no-persist-layer-norm)"
    print(f"  best {case.kind}: {f_label} + {b_label}: {f_ms + b_ms:.3f} ms,"
          f" {eager_fb / (f_ms + b_ms):.2f}x eager forward+backward\n"
          f"    NLP_BENCH_NORM_LAUNCH={f_flags},{b_flags}{note}", flush=True)
    return f"{f_flags},{b_flags}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="4096,12288")
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--warps", default="0,8,16,32", help="0: the default for the block width")
    ap.add_argument("--tile-rows", default="1,2")
    ap.add_argument("--chunks", default="2048,4096", help="columns per chunk for the chunked kernels")
    ap.add_argument("--prefetch", default="0,1", help="whole rows without (0) and with (1) the next tile loaded ahead")
    ap.add_argument("--per-processor", default="0,1,2,4", help="0: one program per tile")
    ap.add_argument("--param-tiles", default="16x128,32x128,32x64,16x256",
                    help="ROWSxCOLUMNS tiles of the split backward's parameter-gradient kernel")
    ap.add_argument("--param-warps", default="4,8")
    ap.add_argument("--param-rows", default="128,256", help="rows per parameter-gradient program")
    ap.add_argument("--norms", default="layer_norm", help="layer_norm, rms_norm or both, comma-separated")
    ap.add_argument("--out", help="write the best settings of every width here, as one NLP_BENCH_NORM_LAUNCH value")
    args = ap.parse_args()
    on_gpu = torch.cuda.is_available()
    if not on_gpu and os.environ.get("TRITON_INTERPRET") != "1":
        print("benchmark/perf/norm_launch.py needs a CUDA GPU, or TRITON_INTERPRET=1 to check its settings on CPU"
              " (norm_registers.py shows register use without either)", file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gputime

    from nlp_bench.kernels import norm_settings

    if on_gpu:
        print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}; GPU times from CUDA graphs")
    else:
        print("TRITON_INTERPRET=1 on CPU: every setting is checked; times are the interpreter's, not a GPU's")
    default = dict(norm_settings.LAUNCH), {w: dict(keys) for w, keys in norm_settings.LAUNCH_BY_WIDTH.items()}

    def reset() -> None:
        """The defaults, before each setting is applied over them."""
        norm_settings.LAUNCH.update(default[0])
        norm_settings.LAUNCH_BY_WIDTH.clear()
        norm_settings.LAUNCH_BY_WIDTH.update({w: dict(keys) for w, keys in default[1].items()})

    chosen: dict[bool, list[str]] = {}  # rms -> the best setting of each width
    for n in _ints(args.widths):
        for rms in (name.strip() == "rms_norm" for name in args.norms.split(",")):
            case = Case(rms, args.rows, n, "cuda" if on_gpu else "cpu")
            flags = sweep(case, args, gputime.graphed if on_gpu else gputime.host, reset)
            if flags:
                chosen.setdefault(rms, []).append(flags)
    reset()
    if chosen:  # LayerNorm's choice where both were timed: the norms share the kernels and their settings
        every_width = ",".join(chosen.get(False) or chosen[True])
        print(f"every width: NLP_BENCH_NORM_LAUNCH={every_width}")
        if args.out:
            with open(args.out, "w") as out:
                out.write(every_width + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
