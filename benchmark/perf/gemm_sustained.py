"""Whether a device holds its GEMM rate under a long load. The planner divides a layer's FLOPs by rates
gemm_rates.py measured in a run of seconds; a training step keeps the device busy for minutes, and a
power-capped device may lower its clock once it warms. This runs one transformer layer's 12 GEMMs
(gemm_rates.layer_gemms) back to back for `--seconds`, and prints the rate of each window of about
`--window` seconds beside the device's power, SM clock and temperature at the window's end (where torch can
read them through NVML), then those rates over a short run timed first, gemm_rates' way. The short run
comes right after the device was idle, a burst that may run at a higher clock than gemm_rates' own figures
(which follow its square GEMMs): compare the windows with those too.

    python benchmark/perf/gemm_sustained.py [--dtype bf16] [--hidden 12288] [--tp 8] [--tokens 8192]
        [--seconds 60] [--window 5] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm_rates import Timer, fp8_available, gemm_call, layer_gemms, positive_int  # noqa: E402
from gputime import save_json  # noqa: E402


def device_state(device: torch.device) -> dict:
    """Power (W), SM clock (MHz) and temperature (C) now, or {} where they cannot be read (torch maps the
    device to its NVML handle, so CUDA_VISIBLE_DEVICES cannot make it read another GPU)."""
    if device.type != "cuda":
        return {}
    try:
        return {"watts": torch.cuda.power_draw(device) / 1e3, "sm_mhz": torch.cuda.clock_rate(device),
                "celsius": torch.cuda.temperature(device)}
    except Exception:  # noqa: BLE001 - the figures are extras; without NVML they are left out
        return {}


def sustained(runs: list, flops: float, seconds: float, window: float, device: torch.device,
              clock: Callable[[], float] = time.perf_counter) -> list[dict]:
    """Rate (TFLOP/s) of each window of back-to-back layer runs; the device is synchronised a few times a
    window (after a batch sized from the previous one, growing at most fourfold, so that one slow batch does
    not swallow the window) so the queue never runs dry nor far ahead."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    windows: list[dict] = []
    batch, began = 1, clock()
    while clock() - began < seconds:
        start, done = clock(), 0
        while clock() - start < window:
            t0 = clock()
            for _ in range(batch):
                for run in runs:
                    run()
            sync()
            done += batch
            took = clock() - t0
            batch = max(1, min(4 * batch, int(batch * window / 5 / max(took, 1e-6))))
        elapsed = clock() - start
        windows.append({"at_s": round(clock() - began, 2),
                        "tflops": float(f"{flops * done / elapsed / 1e12:.4g}"), **device_state(device)})
    return windows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp8"])
    ap.add_argument("--hidden", type=positive_int, default=12288)
    ap.add_argument("--tp", type=positive_int, default=8)
    ap.add_argument("--tokens", type=positive_int, default=8192)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--window", type=float, default=5.0)
    ap.add_argument("--repeats", type=positive_int, default=10)
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if args.hidden % args.tp or args.seconds <= 0 or args.window <= 0:
        print("gemm_sustained: --hidden must divide by --tp, --seconds and --window be positive", file=sys.stderr)
        return 2
    if args.dtype == "fp8" and (args.hidden % (16 * args.tp) or args.tokens % 16):
        print("gemm_sustained: FP8 GEMMs need every side a multiple of 16 (hidden / tp and tokens)", file=sys.stderr)
        return 2
    if args.dtype == "fp8" and (why := fp8_available(device)):
        print(f"gemm_sustained: fp8 does not run on {device}: {why}", file=sys.stderr)
        return 2
    shapes = layer_gemms(args.hidden, args.tp, args.tokens)
    runs = [gemm_call(args.dtype, m, n, k, device) for m, n, k in shapes]
    flops = sum(2 * m * n * k for m, n, k in shapes)
    timer = Timer(device, args.repeats)
    short = flops / sum(timer(run) for run in runs) / 1e12
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"# device {name}, torch {torch.__version__}, {args.dtype} layer hidden {args.hidden} tp {args.tp} "
          f"tokens {args.tokens}; short run after idle {short:.4g} TFLOP/s; idle {device_state(device)}")
    windows = sustained(runs, flops, args.seconds, args.window, device)
    for w in windows:
        extra = "  ".join(f"{k} {v}" for k, v in w.items() if k not in ("at_s", "tflops"))
        print(f"{w['at_s']:7.1f} s  {w['tflops']:8.4g} TFLOP/s  {extra}")
    last, rest = windows[-1]["tflops"], [w["tflops"] for w in windows]
    print(f"last window / short run: {last / short:.3f}; median window / short run: "
          f"{statistics.median(rest) / short:.3f}; first window {rest[0]:.4g}, last {last:.4g} TFLOP/s")
    save_json(args.json_out, {"device": name, "torch": torch.__version__, "dtype": args.dtype, "hidden": args.hidden,
                              "tp": args.tp, "tokens": args.tokens, "short_tflops": float(f"{short:.4g}"),
                              "windows": windows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
