"""GPU time of a closure for the benchmark scripts here: its median replayed from a CUDA graph, so that
Python and kernel-launch overhead on the host (which, at these sizes, can exceed the kernels' own time)
do not decide which of two kernels looks faster."""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable

import torch


def bench(fn: Callable[[], object], rep_ms: int = 50) -> float:
    """Median milliseconds of fn() called back to back from Python (triton.testing.do_bench)."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=10, rep=rep_ms, return_mode="median")


def graphed(run: Callable[[], object], rep_ms: int = 50) -> float:
    """Median milliseconds of run() replayed from a CUDA graph; the graph and its memory are freed after."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and allocate outside the capture
        for _ in range(3):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    try:
        return bench(graph.replay, rep_ms)
    finally:
        graph.reset()


def host(run: Callable[[], object], repeats: int = 3) -> float:
    """Median milliseconds of run() on the host (for checking a script on CPU; not a GPU figure)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def median_seconds(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median seconds of fn() after one warm-up call: CUDA events on a GPU (what the device spent, each
    call synchronised), the wall clock elsewhere."""
    fn()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            began = time.perf_counter()
            fn()
            times.append(time.perf_counter() - began)
    return statistics.median(times)


def save_json(path: str | None, data: dict) -> None:
    """Write a script's findings where --json asked for them (nowhere when it did not); a path that cannot be
    written (a missing or read-only folder, a full disk) ends the script with one line and exit status 2,
    after its figures were printed."""
    if not path:
        return
    try:
        with open(path, "w") as fh:
            json.dump(data, fh, indent=1)
    except OSError as exc:
        print(f"{path}: cannot write the JSON: {exc.strerror or exc}", file=sys.stderr)
        raise SystemExit(2) from None
