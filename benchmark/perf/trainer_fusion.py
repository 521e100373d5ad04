"""The trainer's tokens/s with the fused ops (nlp_bench.kernels on Triton) over the same run with every op
in eager torch (NLP_BENCH_KERNELS=torch), on one GPU, alternated in one session.

Model: a ~1.3B GPT (24 layers, hidden 2048, 16 heads, sequence 2048, vocab 50304), bf16, micro-batch 4,
global batch 16, flash attention, mock data; the median tokens/s of the iterations after the warm-up
(as `bench parse` counts it) for each repeat. Prints each run and the ratio of medians.

    python benchmark/perf/trainer_fusion.py [--repeats 2] [--iters 12] [--layers 24]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

from nlp_bench.analysis import metrics, parsers


def run(kernels: str, iters: int, layers: int) -> tuple[float, float, str]:
    flags = ["--num-layers", str(layers), "--hidden-size", "2048", "--num-attention-heads", "16",
             "--seq-length", "2048", "--max-position-embeddings", "2048", "--micro-batch-size", "4",
             "--global-batch-size", "16", "--train-iters", str(iters), "--lr", "1e-4", "--mock-data",
             "--vocab-size", "50257", "--bf16", "--use-flash-attn", "--log-interval", "1", "--eval-iters", "0",
             "--distributed-backend", "nccl"]
    env = dict(os.environ, NLP_BENCH_KERNELS=kernels)
    out = subprocess.run([sys.executable, "-m", "nlp_bench.train", *flags], env=env, capture_output=True,
                         text=True, check=False)
    if out.returncode:
        raise SystemExit(f"trainer failed ({kernels}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    records = parsers.parse(out.stdout).records
    _, summary = metrics.steady_summary(records, seq_length=2048)
    fused = next((line for line in out.stdout.splitlines() if "fused ops:" in line), "")
    tflops = statistics.median(r.tflops_per_gpu for r in records[summary["warmup_excluded"]:])
    return summary["tokens_per_s"]["median"], tflops, fused


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--iters", type=int, default=12)
    ap.add_argument("--layers", type=int, default=24)
    args = ap.parse_args()
    results: dict[str, list[float]] = {"triton": [], "torch": []}
    for _ in range(args.repeats):
        for kernels in ("torch", "triton"):
            tokens, tflops, fused = run(kernels, args.iters, args.layers)
            results[kernels].append(tokens)
            print(f"{kernels:6} {tokens:10.0f} tokens/s  {tflops:6.1f} TFLOP/s/GPU (jupiter convention)  {fused}",
                  flush=True)
    fused, eager = statistics.median(results["triton"]), statistics.median(results["torch"])
    print(f"median tokens/s: fused {fused:.0f}, eager {eager:.0f}, ratio {fused / eager:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
