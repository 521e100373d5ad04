"""Log parsing: throughput on a ~200 MB Megatron log (issue 5: goal >= 100 MB/s on the 2-core development
machine), time per MB on single lines of 1-100 MB, and peak memory on a 1 GB file of random bytes.

--mode throughput (the default): the log is what a long JUPITER job leaves: iteration lines from two ranks
with torchrun `[defaultN]:` prefixes, NCCL and Python noise between them, and a torn last line (or, with
--log, another framework's step lines with the same noise between them: every step logged). The script
writes it once to a temporary folder, then times (median of --repeats) reading it from disk and parsing it
with `nlp_bench.analysis.parsers`, and, as the reference measured in the same run, reading and decoding the
same file and counting its lines (the floor any parser pays). It prints MB/s for both and their ratio.

--mode linear: for each shape (an ordinary iteration line repeated without line breaks, and lines crafted
against the patterns a parser could use: spaces after an iteration header, `LOG ` repeated, progress bars
nested in a bar's elapsed time) and each size of --line-megabytes, one log holding a good line, the long line
and another good line: the seconds `parse_log` takes (the long line is skipped and counted), and the seconds
the line-level parsers, each run alone, take on it with no length limit at all. Seconds per MB that stay
flat (or fall) from 1 to 100 MB are linear time.

--mode memory: a file of --memory-megabytes random bytes; in a child process each: the peak resident memory
of reading it in 4 MiB chunks and counting line breaks (the reference: what any streaming reader holds), and
of `parse_log` on it (no records: NoRecords), with its forked workers' peak beside it.

    python benchmark/perf/parse.py [--megabytes 200] [--repeats 3] [--log megatron|torchtitan|nanotron|nemo2|mlperf|progress-bar]
    python benchmark/perf/parse.py --mode linear [--line-megabytes 1,10,100]
    python benchmark/perf/parse.py --mode memory [--memory-megabytes 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nlp_bench.analysis import parsers
from nlp_bench.analysis.formats import FORMATS

NOISE = [
    "[default0]:jwb0001:12345:12399 [0] NCCL INFO Channel 03/24 : 0[0] -> 1[1] via P2P/IPC/read\n",
    "[default1]:/p/software/lib/python3.11/site-packages/torch/utils/checkpoint.py:90: UserWarning: None of the inputs have requires_grad=True\n",
    "[default2]:[rank2]:[W1122 10:00:00.000000 ProcessGroupNCCL.cpp:4115] Warning: TORCH_NCCL_AVOID_RECORD_STREAMS\n",
]
LINE = (" iteration {iteration:8d}/ 3125000 | consumed samples: {consumed:12d} |"
        " elapsed time per iteration (s): {t:.4f} |"
        " learning rate: 1.000E-04 | global batch size:    96 | lm loss: 8.110270E+00 | loss scale: 4096.0 |"
        " grad norm: 5.662 | number of skipped iterations:   0 | number of nan iterations:   0 |"
        " samples per second: {rate:.3f} | TFLOPs: 137.89 |")


def iteration_line(iteration: int) -> str:
    t = 5.3 + (iteration % 7) * 0.01
    return LINE.format(iteration=iteration, consumed=iteration * 96, t=t, rate=96 / t)


def _megatron(step: int) -> str:
    line = iteration_line(step * 10) + "\n"
    return "[default3]:" + line + "[default7]:" + line + NOISE[step % 3]


def _torchtitan(step: int) -> str:
    return (f"[rank0]:[titan] 2026-03-{2 + step // 86400:02d} {step // 3600 % 24:02d}:{step // 60 % 60:02d}:"
            f"{step % 60:02d},480 - root - "
            "INFO - \x1b[31mstep: "
            f"{step:2}  \x1b[32mloss: {8 + step % 7 / 10:8.5f}  \x1b[38;2;180;60;0mgrad_norm:  1.2004  "
            "\x1b[38;2;54;234;195mmemory: 61.20GiB(77.31%)  \x1b[34mtps: 3,571  \x1b[36mtflops: 164.66  "
            "\x1b[35mmfu: 16.65%\x1b[39m\n" + NOISE[step % 3])


def _nanotron(step: int) -> str:
    return (f"12/03/2025 09:12:36 [INFO|DP=0|PP=0|TP=0|gpu-node-17]: iteration: {step} / 99999999 | consumed_tokens: "
            "2.1M | elapsed_time_per_iteration_ms: 4.81K | tokens_per_sec: 218K | tokens_per_sec_per_gpu: 6.81K | "
            "global_batch_size: 256 | lm_loss: 10.9 | lr: 6e-06 | model_tflops_per_gpu: 397 | "
            "hardware_tflops_per_gpu: 397 | grad_norm: 9.87\n" + NOISE[step % 3])


def _nemo2(step: int) -> str:
    return (f"Training epoch 0, iteration {step}/99999999 | lr: 1.5e-05 | global_batch_size: 128 | global_step: {step} | "
            f"reduced_train_loss: 7.012 | train_step_timing in s: 47.12 | consumed_samples: {128 * step}\n"
            + NOISE[step % 3])


def _mlperf(step: int) -> str:
    return (':::MLLOG {"namespace": "", "time_ms": 1745771834642, "event_type": "POINT_IN_TIME", "key": '
            '"tracked_stats", "value": {"train_step_time": 8.437116622924805, "reduced_train_loss": '
            f'7.711245536804199}}, "metadata": {{"file": "/workspace/llm/custom_callbacks.py", "lineno": 495, '
            f'"step": {768 * step}}}}}\n' + NOISE[step % 3])


def _bar(step: int) -> str:
    post = f"loss=4.47, v_num=2, reduced_train_loss=5.47, lr=7.5e-9, global_step={step - 1}.0, consumed_samples={1024 * step}.0"
    clock = f"{step * 5 // 3600}:{step * 5 // 60 % 60:02d}:{step * 5 % 60:02d}"
    redraw = f"Epoch 0:   4%|▍         | {step}/99999999 [{clock}<7:44:18, 5.00s/it, {post}]"
    return redraw + "\r" + redraw + ("\n" if step % 500 == 0 else "\r")


#: the log each --log writes: one step's text, and the records a log of n steps gives
LOGS = {"megatron": (_megatron, lambda n: n), "torchtitan": (_torchtitan, lambda n: n),
        "nanotron": (_nanotron, lambda n: n), "nemo2": (_nemo2, lambda n: n), "mlperf": (_mlperf, lambda n: n),
        "progress-bar": (_bar, lambda n: n)}


def write_log(path: Path, megabytes: float, kind: str = "megatron") -> int:
    """Write the log in chunks; returns the number of iteration records it holds."""
    step_text, records = LOGS[kind]
    target = megabytes * 1_000_000
    written, step = 0, 0
    with path.open("w") as fh:
        while written < target:
            text = "".join(step_text(step) for step in range(step + 1, step + 2001))
            step += 2000
            fh.write(text)
            written += len(text.encode())
        if kind == "megatron":
            fh.write("[default3]: iteration 99999999/ 3125000 | consumed samples:   96 | elapsed time per it")
    return records(step)


def median_time(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def throughput(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        log = Path(tmp) / "job.out"
        expected = write_log(log, args.megabytes, args.log)
        size_mb = log.stat().st_size / 1e6
        floor_s, lines = median_time(lambda: parsers.read_log(log).count("\n"), args.repeats)
        parse_s, records = median_time(lambda: parsers.parse_file(log), args.repeats)
    assert abs(len(records) - expected) <= 1, (len(records), expected)
    print(f"{args.log} log {size_mb:.0f} MB, {len(records):,} iteration records ({lines:,} lines), "
          f"medians over {args.repeats} runs")
    print(f"  read + decode + count lines (reference): {floor_s:.2f} s = {size_mb / floor_s:,.0f} MB/s")
    print(f"  read + parse (nlp_bench.analysis.parsers): {parse_s:.2f} s = {size_mb / parse_s:,.0f} MB/s "
          f"(goal >= 100 MB/s); {parse_s / floor_s:.1f}x the reference's time")


def _repeat(unit: str, size: int) -> str:
    """Whole copies of unit, about size characters."""
    return unit * max(1, size // len(unit))


#: single long lines: (name, text of about n characters)
SHAPES = {
    "ordinary iteration lines, no line breaks": lambda n: _repeat(iteration_line(10), n),
    "iteration header, then spaces": lambda n: "[default3]: iteration       15/ 3125000 |" + " " * n + "x",
    "'LOG ' repeated, then a BERT tail": lambda n: _repeat("LOG ", n - 40) + "- (0, 1) step_loss : x",
    "progress bars nested in a bar's elapsed time": lambda n: (_repeat("Epoch 0: 1%|| 1/2 [", n // 2) + ", 1s/it"
                                                              + _repeat(", a=1", n // 2)),
    "bar starts, each with a postfix and no `]`": lambda n: _repeat("Epoch 0: 1%|| 1/2 [00:01, a=", n),
    "torchtitan `step:` repeated": lambda n: _repeat("step: 1  loss: ", n),
    "NeMo 2 fields without end": lambda n: "Training epoch 0, iteration 1/2" + _repeat(" | a: 1", n),
    "MLLOG of nested brackets": lambda n: ":::MLLOG " + "[" * n,
}


def linear(args: argparse.Namespace) -> None:
    sizes = [float(x) for x in args.line_megabytes.split(",")]
    good = iteration_line(10) + "\n"
    print(f"one log per shape and size: a good line, the long line, a good line; median of {args.repeats} runs")
    print(f"{'shape':46s} {'MB':>6s} {'parse_log s':>12s} {'s/MB':>8s} {'no limit s':>11s} {'s/MB':>8s}")
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        log = Path(tmp) / "job.out"
        for name, shape in SHAPES.items():
            for mb in sizes:
                text = good + shape(int(mb * 1_000_000)) + "\n" + good.replace(" 10/", " 20/")
                log.write_text(text)
                size_mb = log.stat().st_size / 1e6
                parse_s, parsed = median_time(lambda: parsers.parse_log(log), args.repeats)
                assert parsed.skipped_long_lines == 1 and [r.iteration for r in parsed.records] == [10, 20], parsed

                def unlimited(text: str = text) -> list:
                    """Each parser alone (together, the first to find records would stop the others)."""
                    return [parsers._read(parsers._text_pieces(text, parsers.CHUNK_BYTES), [name],
                                          limit=len(text))[0][0].result()[0] for name in FORMATS.names()]
                free_s, found = median_time(unlimited, args.repeats)
                assert [r.iteration for r in found[0]] == [10, 20], found[0]
                print(f"{name:46s} {size_mb:6.1f} {parse_s:12.3f} {parse_s / size_mb:8.4f} {free_s:11.3f} "
                      f"{free_s / size_mb:8.4f}", flush=True)


CHILD = r"""
import json, resource, sys, time
mode, path = sys.argv[1], sys.argv[2]
start = time.perf_counter()
if mode == "read":
    lines = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            lines += chunk.count(b"\n")
    outcome = f"{lines} line breaks"
else:
    from nlp_bench.analysis import parsers
    try:
        parsed = parsers.parse_log(path)
        outcome = f"{len(parsed.records)} records, {getattr(parsed, 'skipped_long_lines', '?')} long lines skipped"
    except parsers.ParseError as exc:
        outcome = type(exc).__name__ + ": " + str(exc)
print(json.dumps({"seconds": time.perf_counter() - start, "outcome": outcome,
                  "self_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "children_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def memory(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        path = Path(tmp) / "random.bin"
        with path.open("wb") as fh:
            for _ in range(args.memory_megabytes):
                fh.write(os.urandom(1_000_000))
        print(f"{args.memory_megabytes:,} MB of random bytes; peak resident memory of a child process "
              "(and of its forked workers)")
        for mode, label in (("read", "read in 4 MiB chunks, count line breaks (reference)"),
                            ("parse", "parsers.parse_log")):
            proc = subprocess.run([sys.executable, "-c", CHILD, mode, str(path)], capture_output=True, text=True,
                                  check=True)
            got = json.loads(proc.stdout)
            print(f"  {label}: {got['self_mb']:,.0f} MB (workers {got['children_mb']:,.0f} MB), "
                  f"{got['seconds']:.1f} s; {got['outcome']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("throughput", "linear", "memory"), default="throughput")
    ap.add_argument("--megabytes", type=float, default=200)
    ap.add_argument("--log", choices=sorted(LOGS), default="megatron", help="whose log (throughput mode)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--line-megabytes", default="1,10,100", help="sizes of the single long lines (linear mode)")
    ap.add_argument("--memory-megabytes", type=int, default=1000, help="size of the random file (memory mode)")
    args = ap.parse_args()
    {"throughput": throughput, "linear": linear, "memory": memory}[args.mode](args)


if __name__ == "__main__":
    main()
