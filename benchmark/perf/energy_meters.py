"""The trainer's two NVML energy readings side by side on the same GPU work: the GPU's own energy counter
(what the trainer uses where the GPU has one, Volta and later) and the fallback it uses elsewhere, power
samples every 100 ms integrated by trapezoids. Both meters run over one command (a training run, say);
every `--window` seconds each is read, so the table compares them window by window and in total.

    python benchmark/perf/energy_meters.py [--window 5] [--json OUT.json] -- COMMAND [ARGS...]

The fallback's error on real work is what a figure from a GPU without the counter carries. The exit code
is the command's.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import time

from nlp_bench.train.energy import EnergyMeter


class _NoCounter:
    """pynvml without the total-energy counter, so a meter falls back to power samples."""

    def __init__(self, nvml) -> None:
        self._nvml = nvml

    def __getattr__(self, name):
        if name == "nvmlDeviceGetTotalEnergyConsumption":
            raise AttributeError(name)
        return getattr(self._nvml, name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=float, default=5.0, help="seconds between readings")
    ap.add_argument("--json", dest="json_out", default=None)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command to measure after --")
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError:
        print("energy_meters: pynvml is not installed (pip install nvidia-ml-py): running the command unmeasured")
        return subprocess.call(command)
    counter, sampled = EnergyMeter(nvml), EnergyMeter(_NoCounter(nvml))
    if counter.mode != "energy counter" or sampled.mode != "power samples":
        print(f"energy_meters: cannot compare (counter: {counter.reason or counter.mode}; samples: "
              f"{sampled.reason or sampled.mode}): running the command unmeasured")
        counter.close()
        sampled.close()
        return subprocess.call(command)
    windows: list[dict] = []
    started = last = time.monotonic()
    proc = subprocess.Popen(command)
    while True:
        try:
            code = proc.wait(timeout=args.window)
        except subprocess.TimeoutExpired:
            code = None
        now = time.monotonic()
        windows.append({"seconds": now - last, "counter_j": counter.read(), "samples_j": sampled.read()})
        last = now
        if code is not None:
            break
    counter.close()
    sampled.close()
    total_c = sum(w["counter_j"] for w in windows)
    total_s = sum(w["samples_j"] for w in windows)
    seconds = now - started
    deviations = [w["samples_j"] / w["counter_j"] - 1 for w in windows if w["counter_j"] > 0]
    print(f"{'window':>6} {'s':>6} {'counter J':>11} {'samples J':>11} {'samples/counter':>16}")
    for i, w in enumerate(windows, 1):
        ratio = f"{w['samples_j'] / w['counter_j']:.4f}" if w["counter_j"] > 0 else "-"
        print(f"{i:>6} {w['seconds']:6.1f} {w['counter_j']:11.1f} {w['samples_j']:11.1f} {ratio:>16}")
    print(f"total over {seconds:.1f} s: counter {total_c:.0f} J (mean {total_c / seconds:.0f} W), power samples "
          f"{total_s:.0f} J; samples/counter {total_s / total_c:.4f}" if total_c > 0 else "no energy counted")
    if deviations:
        print(f"per window: samples/counter - 1 from {min(deviations):+.2%} to {max(deviations):+.2%}")
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump({"command": command, "seconds": seconds, "counter_j": total_c, "samples_j": total_s,
                       "windows": windows, "exit": code}, fh, indent=2)
    return code


if __name__ == "__main__":
    sys.exit(main())
