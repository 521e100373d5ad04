"""Time the planner ranking a layout space of at least 10,000 layouts (issue 7: goal < 5 s on the 2-core
development machine): the 175B model on JUWELS Booster, every tp, pp, vp, micro-batch size, recompute
choice and optimizer sharding on 64, 96 and 128 nodes, with gradient accumulation pinned to several values
(so the global batch varies, as in a sweep). Prints the layouts evaluated, how many fit, the median
time of --repeats rankings, and the rate; the reference is the same space's enumeration alone. Each
prediction carries its interval and extrapolation flag (issue 16), as `bench plan` computes them; the
planner's leave-one-out validation itself runs once before the timing (and is kept on disk by `bench plan`).

    python benchmark/perf/plan.py [--repeats 5] [--tag deepseek-v3]

`--tag deepseek-v3` ranks the same node counts and gas for an MoE model, ep and expert tp among the axes.
"""

from __future__ import annotations

import argparse
import statistics
import time

from nlp_bench.plan import points, ranking, validation
from nlp_bench.spec.benchmark import load_benchmark

SPACE = ranking.Space(nodes=(64, 96, 128), gas=(8, 16, 32))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tag", default="175", help="the tag whose model, system and switches are ranked")
    args = ap.parse_args()
    base = points.from_point(load_benchmark("nlp").point(args.tag))
    trust = validation.corpus_trust(None)
    count = sum(1 for _ in ranking.candidates(base.model, base.system, SPACE, base.candidate))
    enum_times, rank_times = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        for _ in ranking.candidates(base.model, base.system, SPACE, base.candidate):
            pass
        enum_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        good, pruned = ranking.rank(base.model, base.system, SPACE, base.candidate, trust.efficiency,
                                     trust=trust)
        rank_times.append(time.perf_counter() - start)
    t_enum, t_rank = statistics.median(enum_times), statistics.median(rank_times)
    print(f"{count:,} layouts ({len(good) + len(pruned):,} distinct): {len(good):,} fit and run, {len(pruned):,} pruned")
    print(f"  enumerate only (reference): {t_enum:.3f} s")
    print(f"  enumerate + predict memory and time + rank: {t_rank:.3f} s = {count / t_rank:,.0f} layouts/s "
          f"(goal < 5 s); median of {args.repeats}")


if __name__ == "__main__":
    main()
