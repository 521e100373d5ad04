"""Our trainer's tokens/s divided by a plain single-file PyTorch GPT's, same shapes, same machine, one run.

Shapes (issue 3): 4 layers, hidden 256, 4 heads, seq 256, micro-batch 8, vocab 50304, fp32, 1 rank,
2 threads, learned positions, dropout 0, AdamW. Both sides run as separate processes, alternated
(reference, ours, reference, ours, ...), and each reports the median over its timed iterations after
warm-up; the printed ratio is median(ours) / median(reference). Usage:

    python benchmark/perf/trainer_cpu.py [--repeats 3] [--iters 12] [--warmup 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

LAYERS, HIDDEN, HEADS, SEQ, MBS, VOCAB, THREADS = 4, 256, 4, 256, 8, 50304, 2


def reference_worker(iters: int, warmup: int) -> None:
    """The plain GPT (plain_gpt.py): the yardstick, not our code."""
    import torch
    from plain_gpt import plain_gpt

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    model = plain_gpt(LAYERS, HIDDEN, HEADS, SEQ, VOCAB)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    times = []
    for i in range(iters):
        data = torch.randint(VOCAB, (MBS, SEQ + 1))
        t0 = time.perf_counter()
        loss = model(data[:, :-1], data[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    print(f"TOKENS_PER_S {MBS * SEQ / statistics.median(times):.2f}")


def reference(iters: int, warmup: int) -> float:
    out = subprocess.run([sys.executable, __file__, "--reference-worker", "--iters", str(iters), "--warmup",
                          str(warmup)], capture_output=True, text=True, check=True, env=_env()).stdout
    return float(out.split("TOKENS_PER_S")[1])


def ours(iters: int, warmup: int) -> float:
    from nlp_bench.analysis.parsers import parse_text

    cmd = [sys.executable, "-m", "nlp_bench.train", "--num-layers", str(LAYERS), "--hidden-size", str(HIDDEN),
           "--num-attention-heads", str(HEADS), "--seq-length", str(SEQ), "--micro-batch-size", str(MBS),
           "--vocab-size", str(VOCAB), "--mock-data", "--train-iters", str(iters), "--log-interval", "1",
           "--lr", "1e-4", "--hidden-dropout", "0", "--attention-dropout", "0", "--distributed-backend", "gloo",
           "--weight-decay", "0.1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env())
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-2000:])
    records = parse_text(proc.stdout)[warmup:]
    return MBS * SEQ / statistics.median(r.iteration_time_s for r in records)


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(THREADS)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iters", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--reference-worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.reference_worker:
        reference_worker(a.iters, a.warmup)
        return
    refs, mine = [], []
    for r in range(a.repeats):
        refs.append(reference(a.iters, a.warmup))
        mine.append(ours(a.iters, a.warmup))
        print(f"repeat {r + 1}: reference {refs[-1]:.1f} tokens/s, nlp-bench {mine[-1]:.1f} tokens/s", flush=True)
    ratio = statistics.median(mine) / statistics.median(refs)
    print(f"median reference {statistics.median(refs):.1f} tokens/s, median nlp-bench {statistics.median(mine):.1f} "
          f"tokens/s, ratio nlp-bench / plain PyTorch = {ratio:.3f}")


if __name__ == "__main__":
    main()
