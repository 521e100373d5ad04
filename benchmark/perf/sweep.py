"""Time `bench sweep --dry-run` on a 10,000-point grid: expand, validate, render and write every jobscript.

Goal (issue 4): expand, validate and render in under 5 s on the 2-core development machine. Prints the
medians of: expansion (expand + validate), expansion plus rendering every jobscript in memory, and the
whole CLI dry run, which also starts a process and writes every point folder (that last part is bound
by the disk). Run it from the repository root: it writes under ./results, as runs do.

    python benchmark/perf/sweep.py [--repeats 3]
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    from nlp_bench.launch.render import render_jobscript
    from nlp_bench.sweep.grid import expand, load_grid

    # under ./results, where runs go: /tmp on these machines creates files ~20x slower than the work disk
    Path("results").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".perf-sweep-", dir="results"))
    grid = work / "grid.yaml"
    grid.write_text(GRID.format(nodes=", ".join(str(n) for n in range(48, 48 + 100 * 8, 8))))
    expand_times, render_times, total_times, kept = [], [], [], 0
    try:
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            points = expand(load_grid(grid)).points
            expand_times.append(time.perf_counter() - t0)
            scripts = [render_jobscript(p) for p in points]
            render_times.append(time.perf_counter() - t0)
            kept = len(scripts)
            results = work / "results"
            t0 = time.perf_counter()
            subprocess.run([str(Path(sys.executable).parent / "bench"), "--results-dir", str(results), "sweep",
                            str(grid), "--dry-run"], check=True, stdout=subprocess.DEVNULL)
            total_times.append(time.perf_counter() - t0)
            shutil.rmtree(results)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"10000 combinations, {kept} valid points, medians over {a.repeats} runs: expand+validate "
          f"{statistics.median(expand_times):.2f} s; expand+validate+render {statistics.median(render_times):.2f} s; "
          f"whole `bench sweep --dry-run` (process start, render, write {kept} point folders) "
          f"{statistics.median(total_times):.2f} s")


if __name__ == "__main__":
    main()
