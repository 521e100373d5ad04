"""Throughput metrics from parsed records: tokens/s, TFLOPs per GPU, MFU and the time to report.

Tokens/s follows the JUPITER JUBE result: the mean of every logged interval's iteration time, with
nothing excluded, so our figure for a reference log is the figure the reference table shows.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from nlp_bench import flops
from nlp_bench.analysis.parsers import Record


@dataclass
class Summary:
    intervals: int
    iterations: int
    mean_iteration_time_s: float
    global_batch_size: int
    seq_length: int
    tokens_per_s: float
    samples_per_s: float
    time_to_report_s: float
    report_tokens: int
    avg_tflops_per_gpu: float | None
    tflops_convention: str
    mfu: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def tokens_per_s(global_batch_size: int, seq_length: int, iteration_time_s: float) -> float:
    return global_batch_size * seq_length / iteration_time_s


def summarise(records: list[Record], seq_length: int, global_batch_size: int | None = None,
              shape: flops.Shape | None = None, devices: int | None = None, peak_tflops: float | None = None,
              report_tokens: int = flops.REPORT_TOKENS) -> Summary | None:
    """Summary over all intervals, or None when the log has no complete iteration line.

    TFLOPs per GPU is the mean of the logged values when the log has them (JUPITER convention);
    otherwise it is computed with that convention from `shape` and `devices`. MFU uses Megatron's
    model FLOPs against the device's peak.
    """
    if not records:
        return None
    gbs = global_batch_size or records[-1].global_batch_size
    if not gbs:
        raise ValueError("the log does not give the global batch size; pass it")
    mean_time = statistics.fmean(r.iteration_time_s for r in records)
    tps = tokens_per_s(gbs, seq_length, mean_time)
    logged = [r.tflops_per_gpu for r in records if r.tflops_per_gpu is not None]
    if logged:
        avg_tflops = statistics.fmean(logged)
    elif shape is not None and devices:
        avg_tflops = flops.tflops_per_device(flops.jupiter_flops(shape), mean_time, devices)
    else:
        avg_tflops = None
    mfu = None
    if shape is not None and devices and peak_tflops:
        mfu = flops.tflops_per_device(flops.megatron_model_flops(shape), mean_time, devices) / peak_tflops
    return Summary(len(records), records[-1].iteration, mean_time, gbs, seq_length, tps, gbs / mean_time,
                   flops.time_to_report(tps, report_tokens), report_tokens, avg_tflops, flops.JUPITER, mfu)
