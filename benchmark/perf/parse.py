"""Parse throughput on a ~200 MB Megatron log (issue 5: goal >= 100 MB/s on the 2-core development machine).

The log is what a long JUPITER job leaves: iteration lines from two ranks with torchrun `[defaultN]:`
prefixes, NCCL and Python noise between them, and a torn last line. The script writes it once to a
temporary folder, then times (median of --repeats) reading it from disk and parsing it with
`nlp_bench.analysis.parsers`, and, as the reference measured in the same run, reading and decoding the
same file and counting its lines (the floor any parser pays). It prints MB/s for both and their ratio.

    python benchmark/perf/parse.py [--megabytes 200] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from nlp_bench.analysis import parsers

NOISE = [
    "[default0]:jwb0001:12345:12399 [0] NCCL INFO Channel 03/24 : 0[0] -> 1[1] via P2P/IPC/read\n",
    "[default1]:/p/software/lib/python3.11/site-packages/torch/utils/checkpoint.py:90: UserWarning: None of the inputs have requires_grad=True\n",
    "[default2]:[rank2]:[W1122 10:00:00.000000 ProcessGroupNCCL.cpp:4115] Warning: TORCH_NCCL_AVOID_RECORD_STREAMS\n",
]


def write_log(path: Path, megabytes: int) -> int:
    """Write the log in 4 MB chunks; returns the number of iteration records it holds."""
    target = megabytes * 1_000_000
    written, iteration = 0, 0
    with path.open("w") as fh:
        while written < target:
            chunk = []
            for _ in range(2000):
                iteration += 10
                t = 5.3 + (iteration % 7) * 0.01
                line = (f" iteration {iteration:8d}/ 3125000 | consumed samples: {iteration * 96:12d} | "
                        f"elapsed time per iteration (s): {t:.4f} | learning rate: 1.000E-04 | global batch size:    96 |"
                        f" lm loss: 8.110270E+00 | loss scale: 4096.0 | grad norm: 5.662 | number of skipped iterations:"
                        f"   0 | number of nan iterations:   0 | samples per second: {96 / t:.3f} | TFLOPs: 137.89 |\n")
                chunk.append("[default3]:" + line)
                chunk.append("[default7]:" + line)
                chunk.append(NOISE[iteration % 3])
            text = "".join(chunk)
            fh.write(text)
            written += len(text)
        fh.write("[default3]: iteration 99999999/ 3125000 | consumed samples:   96 | elapsed time per it")
    return iteration // 10


def median_time(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--megabytes", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        log = Path(tmp) / "job.out"
        expected = write_log(log, args.megabytes)
        size_mb = log.stat().st_size / 1e6
        floor_s, lines = median_time(lambda: parsers.read_log(log).count("\n"), args.repeats)
        parse_s, records = median_time(lambda: parsers.parse_file(log), args.repeats)
    assert len(records) == expected, (len(records), expected)
    print(f"log {size_mb:.0f} MB, {len(records):,} iteration records ({lines:,} lines), medians over {args.repeats} runs")
    print(f"  read + decode + count lines (reference): {floor_s:.2f} s = {size_mb / floor_s:,.0f} MB/s")
    print(f"  read + parse (nlp_bench.analysis.parsers): {parse_s:.2f} s = {size_mb / parse_s:,.0f} MB/s "
          f"(goal >= 100 MB/s); {parse_s / floor_s:.1f}x the reference's time")


if __name__ == "__main__":
    main()
