"""Time `bench sweep --dry-run`: a 10,000-combination grid written out in full, and 5-axis grids of 10^4 to
5·10^6 combinations streamed through expansion, validation and the planner.

Goals: expand, validate and render the 10,000-combination grid in under 5 s (issue 4); peak resident
memory under 1 GB and time linear in the combination count up to 5·10^6 (issue 18). Large grids have more
runnable points than the sweep writes without --max-points (here --max-points 1, so that the smallest
grid takes the same path), so each ends in the one-line refusal after counting every point: the work
measured is expanding, validating and predicting every combination. Peak memory is the child process's own maximum
resident set (getrusage). The reference for "linear" is the 10^4 case: each larger case prints its time
per combination and its ratio to that.

    python benchmark/perf/sweep.py [--repeats 3] [--sizes 1e4,1e5,1e6,5e6]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GRID = """\
tag: "175"
matrix:
  nodes: [{nodes}]
  tp: [1, 2, 4, 8]
  pp: [1, 2, 4, 8, 12]
  mbs: [1, 2, 3, 4, 8]
derived:
  gas: "max(1, 1536 // (nodes * 4 // (tp * pp) * mbs)) if nodes * 4 % (tp * pp) == 0 else 1"
"""

#: 10^4 combinations per node count (64, 65, ...; at most 5·10^6 / 10^4 = 500 of them, all within JUWELS
#: Booster's 936 nodes): tp and pp as a user would list them, mbs and gas wide
LARGE = """\
tag: "175"
matrix:
  nodes: [{nodes}]
  tp: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
  pp: [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
  mbs: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
  gas: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
"""

_MEASURE = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
            "code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True); "
            "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, code.returncode, "
            "code.stderr.strip().splitlines()[-1] if code.stderr.strip() else '', sep='\\t')")


def measure(args: list[str]) -> tuple[float, float, int, str]:
    """(seconds, peak resident MB, exit code, last stderr line) of one bench process."""
    out = subprocess.run([sys.executable, "-c", _MEASURE, *args], capture_output=True, text=True, check=True)
    seconds, kib, code, last = out.stdout.rstrip("\n").split("\t")
    return float(seconds), int(kib) / 1024, int(code), last


def full_grid(work: Path, repeats: int) -> None:
    from nlp_bench.launch.render import render_jobscript
    from nlp_bench.sweep.grid import expand, load_grid

    grid = work / "grid.yaml"
    grid.write_text(GRID.format(nodes=", ".join(str(n) for n in range(48, 48 + 100 * 8, 8))))
    expand_times, render_times, total_times, kept = [], [], [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        points = expand(load_grid(grid)).points
        expand_times.append(time.perf_counter() - t0)
        scripts = [render_jobscript(p) for p in points]
        render_times.append(time.perf_counter() - t0)
        kept = len(scripts)
        results = work / "results"
        seconds, _, code, last = measure([bench(), "--results-dir", str(results), "sweep", str(grid), "--dry-run",
                                          "--no-plan", "--max-points", "10000"])
        assert code == 0, last
        total_times.append(seconds)
        shutil.rmtree(results)
    print(f"10000 combinations, {kept} valid points, medians over {repeats} runs: expand+validate "
          f"{statistics.median(expand_times):.2f} s; expand+validate+render {statistics.median(render_times):.2f} s; "
          f"whole `bench sweep --dry-run --no-plan --max-points 10000` (process start, render, write {kept} point "
          f"folders) {statistics.median(total_times):.2f} s")


def bench() -> str:
    return str(Path(sys.executable).parent / "bench")


def large_grids(work: Path, sizes: list[int], repeats: int) -> None:
    print("| combinations | runnable points | median time | per combination | vs 10^4 per combination | peak RSS |")
    print("|---:|---:|---:|---:|---:|---:|")
    reference = None
    for size in sizes:
        nodes = size // 10_000
        grid = work / f"large-{size}.yaml"
        grid.write_text(LARGE.format(nodes=", ".join(str(64 + i) for i in range(nodes))))
        times, peaks, last = [], [], ""
        for _ in range(repeats):
            seconds, peak, code, last = measure([bench(), "--results-dir", str(work / "results"), "sweep", str(grid),
                                                 "--dry-run", "--max-points", "1"])
            assert code == 2 and "nothing was written" in last, last
            times.append(seconds)
            peaks.append(peak)
        runnable = last.split(" has ")[1].split(" runnable")[0]
        per = statistics.median(times) / size
        reference = reference or per
        print(f"| {size:,} | {runnable} | {statistics.median(times):.1f} s | {per * 1e6:.1f} µs | "
              f"{per / reference:.2f}x | {max(peaks):.0f} MB |", flush=True)
        assert not (work / "results").exists() or not any((work / "results").rglob("run.json"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sizes", default="1e4,1e5,1e6,5e6",
                   help="combination counts of the large grids (multiples of 10^4)")
    a = p.parse_args()
    sizes = [int(float(s)) for s in a.sizes.split(",") if s]
    if any(s % 10_000 for s in sizes):
        p.error("--sizes must be multiples of 10^4")
    # under ./results, where runs go: /tmp on these machines creates files ~20x slower than the work disk
    Path("results").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".perf-sweep-", dir="results"))
    try:
        full_grid(work, a.repeats)
        large_grids(work, sizes, a.repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
