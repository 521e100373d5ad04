"""The planner's time predictions against published sweeps it was never fitted on: the layouts of
results/reference/planner-memory.yaml that ran, each with its TFLOP/s per GPU, predicted with the corpus fit
(`bench plan validate`'s constants) on a system profile per table. A check outside the corpus: these rows
are in no fit, and their throughput is not part of `bench plan validate`.

Fujii et al.'s figures are what their Megatron-LM fork logs (okoge-kaz/Megatron-LM, branch v0.9.0-abci at
e4e8c218 and v0.9.0-tsubame, megatron/training/training.py `num_floating_point_operations`: Megatron-LM
core 0.9's count, 12·B·s·L·h²·((1 + g/n + s/h)·q/h + ffn/h·(3/2 with SwiGLU) + V/(2·L·h)), the attention
scores counted whole), so an iteration lasted that count over (TFLOP/s · GPUs). Prints each layout with its
error (predicted / measured tokens/s − 1) and, per context-parallel size, the median absolute error, the
mean error and how many lie inside the planner's own interval.

    python benchmark/perf/planner_sweeps.py \
        --system fujii-a100-40gb-8k=benchmark/perf/profiles/abci-a.yaml \
        --system fujii-h100-94gb-8k=benchmark/perf/profiles/tsubame4.yaml [--rows]
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

from nlp_bench.plan import outcomes, timing, validation
from nlp_bench.plan.candidate import Candidate
from nlp_bench.spec.layout import Layout
from nlp_bench.spec.models import ModelSpec, get_model, pad_vocab
from nlp_bench.spec.systems import load_system_file
from nlp_bench.spec.yamlio import load_yaml


def megatron_09_flops(m: ModelSpec, batch: int, vocab_padded: int) -> float:
    """Megatron-LM core 0.9's FLOPs per iteration (the fork's log): no causal halving of the scores."""
    h, s, n = m.hidden_size, m.seq_length, m.num_attention_heads
    q = m.head_dim * n / h
    gated = 1.5 if m.swiglu else 1.0
    return 12 * batch * s * m.num_layers * h * h * (
        (1 + m.query_groups / n + s / h) * q + m.ffn_hidden_size / h * gated + vocab_padded / (2 * m.num_layers * h))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", action="append", required=True, metavar="TABLE=PROFILE.yaml",
                    help="the system profile a table ran on (repeat per table)")
    ap.add_argument("--rows", action="store_true", help="print every layout")
    args = ap.parse_args()
    trust = validation.corpus_trust(None)
    low, high = trust.error_low, trust.error_high
    tables = {t["id"]: t for t in load_yaml(outcomes.outcomes_path(), "planner memory file")["tables"]}
    print(f"corpus fit {trust.efficiency}; interval {low:+.3f}..{high:+.3f}")
    for spec in args.system:
        table_id, _, profile = spec.partition("=")
        if table_id not in tables or not profile:
            ap.error(f"--system {spec!r}: give TABLE=PROFILE.yaml with TABLE one of {', '.join(tables)}")
        table, system = tables[table_id], load_system_file(Path(profile))
        model = get_model(table["model"]["preset"], **{k: v for k, v in table["model"].items() if k != "preset"})
        by_cp: dict[int, list[float]] = defaultdict(list)
        for tp, cp, pp, mbs, gpus, figure in table["cells"]:
            if figure is None or gpus % system.devices_per_node:
                continue
            nodes = gpus // system.devices_per_node
            gas = Layout(nodes, system.devices_per_node, tp, pp, mbs, 1, cp=cp).steps_for(table["global_batch_size"])
            c = Candidate.of(nodes=nodes, devices_per_node=system.devices_per_node, tp=tp, pp=pp, cp=cp, mbs=mbs,
                             gas=gas, recompute=table["recompute"], sequence_parallel=table["sequence_parallel"],
                          distributed_optimizer=table["distributed_optimizer"], precision=table["precision"],
                          flash_attention=True)
            vocab = pad_vocab(model.vocab_size, tp)
            predicted = timing.estimate(model, vocab, c, system, trust.efficiency).iteration_s
            measured = megatron_09_flops(model, c.layout.global_batch_size, vocab) / (figure * 1e12 * gpus)
            error = measured / predicted - 1
            by_cp[cp].append(error)
            if args.rows:
                print(f"  tp {tp} cp {cp} pp {pp} mbs {mbs} {gpus:5d} GPUs: {figure:7.2f} TFLOP/s, "
                      f"{measured:8.2f} s measured, {predicted:8.2f} s predicted, {error:+.1%}")
        for cp, errors in sorted(by_cp.items()):
            inside = sum(low <= e <= high for e in errors)
            print(f"{table_id} on {system.name}, cp {cp}: {len(errors)} layouts, median |error| "
                  f"{statistics.median(map(abs, errors)):.1%}, mean {statistics.mean(errors):+.1%}, "
                  f"{inside}/{len(errors)} inside")


if __name__ == "__main__":
    main()
