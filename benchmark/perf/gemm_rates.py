"""The matrix-multiply rate a device reaches, in BF16 and FP8: on large square GEMMs (the "best square"
lines: the figure a system profile gives as `matmul_tflops` / `matmul_fp8_tflops`, which the planner times
GEMMs against rather than the datasheet peak, which no GEMM reaches and which devices miss by different
amounts) and on a transformer layer's GEMMs by width and tensor-parallel split (how far below that rate
narrower GEMMs fall: the planner's GEMM curve; do not give the layer rate as `matmul_tflops`, the curve and
the fitted GEMM efficiency already take the layer's loss).

A layer is GPT's four linear layers (qkv h -> 3h/tp, projection h/tp -> h, fc1 h -> 4h/tp, fc2 4h/tp -> h),
each run as Megatron runs it on one device: the forward (tokens x k by k x n), the input gradient and the
weight gradient, 12 GEMMs. FLOPs are 2·m·n·k each; the rate is the layer's FLOPs over its summed time. FP8
is torch._scaled_mm on E4M3 operands with per-tensor scales into BF16 (what Transformer Engine's delayed
scaling runs), the casts not counted: they are element-wise work, which the planner times on memory
bandwidth. Also printed: the best rate of a few large square GEMMs (the "maximum achievable" figure) and
device-memory bandwidth of a large copy.

    python benchmark/perf/gemm_rates.py [--device cuda] [--dtypes bf16,fp8] [--tokens 4096,8192]
        [--hidden 2048,4096,8192,12288,16384] [--tp 1,2,4,8] [--in-a-row 1] [--json OUT.json]

Medians of `--repeats` timed runs after a warm-up; CUDA events on a GPU, the wall clock elsewhere. Each run
is one GEMM launched alone, or `--in-a-row` of them back to back (the host's launch gaps hidden as in a
training step, though a GEMM repeated on the same operands finds the small ones in L2 where a step's next
GEMM would not; the longer load also lowers a power-capped device's clock, so give a profile the best square
of single launches).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gputime import median_seconds, save_json  # noqa: E402


def positive_int(text: str) -> int:
    """An argparse type: a whole number above 0 (one clear error, not a crash deep in torch)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number above 0")
    return value


def positive_ints(text: str) -> list[int]:
    """An argparse type: a comma-separated list of whole numbers above 0."""
    values = [positive_int(x) for x in text.split(",") if x]
    if not values:
        raise argparse.ArgumentTypeError("an empty list")
    return values


def layer_gemms(hidden: int, tp: int, tokens: int) -> list[tuple[int, int, int]]:
    """(m, n, k) of the 12 GEMMs one device runs for one layer's linear layers, forward and backward."""
    out = []
    for k, n in ((hidden, 3 * hidden // tp), (hidden // tp, hidden), (hidden, 4 * hidden // tp),
                 (4 * hidden // tp, hidden)):
        out += [(tokens, n, k), (tokens, k, n), (k, n, tokens)]  # forward, input gradient, weight gradient
    return out


class Timer:
    """Median seconds of a callable on one device (gputime.median_seconds). With `in_a_row` > 1 each timing
    runs it that many times back to back and divides: the device then waits for the host only where the
    host launches slower than the device computes, as in a training step, not for every launch."""

    def __init__(self, device: torch.device, repeats: int, in_a_row: int = 1) -> None:
        self.device, self.repeats, self.in_a_row = device, repeats, in_a_row

    def __call__(self, fn) -> float:
        if self.in_a_row == 1:
            return median_seconds(fn, self.device, self.repeats)

        def run() -> None:
            for _ in range(self.in_a_row):
                fn()

        return median_seconds(run, self.device, self.repeats) / self.in_a_row


def gemm_call(dtype: str, m: int, n: int, k: int, device: torch.device):
    """A callable that runs one m x n x k GEMM in `dtype`."""
    if dtype == "bf16":
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
        return lambda: torch.matmul(a, b)
    a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants it
    one = torch.ones((), device=device)
    return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def gemm_seconds(timer: Timer, dtype: str, m: int, n: int, k: int, device: torch.device) -> float:
    return timer(gemm_call(dtype, m, n, k, device))


def fp8_available(device: torch.device) -> str | None:
    """None where FP8 GEMMs run here, else why not."""
    try:
        gemm_seconds(Timer(device, 1), "fp8", 16, 16, 16, device)
    except (RuntimeError, AttributeError, TypeError) as exc:
        return str(exc).splitlines()[0][:120]
    return None


def copy_bandwidth(timer: Timer, device: torch.device, mib: int) -> float:
    """Bytes/s a large device-to-device copy moves (read plus write)."""
    src = torch.empty(mib << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() / timer(lambda: dst.copy_(src))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtypes", default="bf16,fp8")
    ap.add_argument("--tokens", type=positive_ints, default=[2048, 8192], help="tokens per micro-batch (mbs x seq)")
    ap.add_argument("--hidden", type=positive_ints, default=[2048, 4096, 8192, 12288, 16384])
    ap.add_argument("--tp", type=positive_ints, default=[1, 2, 4, 8])
    ap.add_argument("--square", type=positive_ints, default=[4096, 8192, 16384], help="square GEMM sides")
    ap.add_argument("--copy-mib", type=positive_int, default=2048)
    ap.add_argument("--repeats", type=positive_int, default=10)
    ap.add_argument("--in-a-row", type=positive_int, default=1, help="GEMMs launched back to back per timing")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    timer = Timer(device, args.repeats, args.in_a_row)
    dtypes = [d for d in args.dtypes.split(",") if d]
    unknown = set(dtypes) - {"bf16", "fp8"}
    if unknown:
        print(f"gemm_rates: unknown dtype {', '.join(sorted(unknown))} (bf16, fp8)", file=sys.stderr)
        return 2
    if "fp8" in dtypes and (why := fp8_available(device)):
        print(f"# fp8 skipped on {device}: {why}")
        dtypes.remove("fp8")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"# device {name}, torch {torch.__version__}, cuda {torch.version.cuda}, repeats {args.repeats}, "
          f"{args.in_a_row} in a row")
    found: dict = {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda, "in_a_row": args.in_a_row,
                   "square": [], "layers": []}
    for dtype in dtypes:
        for side in args.square:
            tflops = 2 * side ** 3 / gemm_seconds(timer, dtype, side, side, side, device) / 1e12
            found["square"].append({"dtype": dtype, "side": side, "tflops": float(f"{tflops:.4g}")})
            print(f"square {dtype} {side}: {tflops:.4g} TFLOP/s")
    print("dtype tokens hidden tp  width  TFLOP/s")
    for dtype in dtypes:
        for tokens in args.tokens:
            for hidden in args.hidden:
                for tp in args.tp:
                    if hidden % (tp * 16):
                        continue
                    shapes = layer_gemms(hidden, tp, tokens)
                    seconds = sum(gemm_seconds(timer, dtype, *s, device) for s in shapes)
                    tflops = sum(2 * m * n * k for m, n, k in shapes) / seconds / 1e12
                    found["layers"].append({"dtype": dtype, "tokens": tokens, "hidden": hidden, "tp": tp,
                                            "tflops": float(f"{tflops:.4g}")})
                    print(f"{dtype:5} {tokens:6} {hidden:6} {tp:2} {hidden // tp:6} {tflops:8.4g}")
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
    found["copy_gbps"] = float(f"{copy_bandwidth(timer, device, args.copy_mib) / 1e9:.4g}")
    print(f"copy {args.copy_mib} MiB: {found['copy_gbps']} GB/s")
    for dtype in dtypes:
        best = max((s["tflops"] for s in found["square"] if s["dtype"] == dtype), default=None)
        key = "matmul_tflops" if dtype == "bf16" else "matmul_fp8_tflops"
        use = f"a system profile's {key}" if args.in_a_row == 1 else f"in a row: not a profile's {key}"
        print(f"best square {dtype}: {best} TFLOP/s  ({use})")
    save_json(args.json_out, found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
