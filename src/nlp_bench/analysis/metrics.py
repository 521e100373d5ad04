"""Throughput metrics from parsed records: tokens/s, TFLOPs per GPU, MFU and the time to report.

A log gives two throughputs, each defined once here and quoted under its own name by every view (the
progress bar, `bench status`, the result table and its exports, `bench parse`, the comparisons, the report):

- JUBE's figure (`jube_tokens_per_s`): the tokens of one global batch over the mean iteration time of every
  logged interval, nothing excluded, as the JUPITER result table computes it; our figure for a reference
  log is the figure the reference table shows, and it is the one the 560 s rule is judged on.
- The steady state (`steady_state`): the same formula, by the same function, over the intervals after the
  warm-up (leading intervals slower than WARMUP_FRACTION of the rest), with its spread. Where no interval is
  warm-up, the two are the same number to the last bit.

Both are time-weighted means of the intervals' rates (tokens over seconds, each interval's mean iteration
counted once), never plain means of rates; samples/s is the same formula over one batch's samples, and the
time to report is REPORT_TOKENS over the tokens/s it is quoted beside. The one plain mean is Avg_TFLOPs/GPU,
the mean of the TFLOPs the log prints, as JUBE computes it; the one median is the median interval's rate.
"""

from __future__ import annotations

import math
import operator
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass

from nlp_bench import flops
from nlp_bench.analysis.log_record import AUX_LOSSES
from nlp_bench.analysis.parsers import Record
from nlp_bench.spec.peaks import choose_peak


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
    #: what the MFU divides: the FLOPs formula and the peak (device, precision, source); or why there is none
    mfu_basis: dict | None = None
    mfu_note: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def mfu_basis(system: str, system_info: dict, shape: flops.Shape | None = None,
              precision: str | None = None) -> tuple[dict | None, str | None]:
    """The peak an MFU divides by, named, or why the system gives none: an MFU against a guessed peak (an
    unknown GPU taken for an A100, a sparse figure taken for a dense one, the BF16 peak for an FP8 run) reads
    as 100%+ or as half the truth. `precision` is what the run's GEMMs run in (Switches.compute_precision):
    its own peak where the profile has one (spec/peaks.py); None: the profile's single peak, as before peaks
    per precision. A model with experts (`shape`) says its FLOPs count the active parameters only: its MFU is
    not comparable with one over all its parameters."""
    device = system_info.get("device_name") or system_info.get("device") or "?"
    if not system_info.get("peak_tflops") and not system_info.get("peaks"):
        return None, f"no MFU: system profile {system} gives no peak_tflops for its device ({device})"
    main = system_info.get("peak_precision", "bf16")
    table = system_info.get("peaks") or {main: {"tflops": system_info["peak_tflops"], "source": system_info.get("peak_source")}}
    peak, why = choose_peak(table, precision or main, main)
    if peak is None:
        return None, f"no MFU: system profile {system}: {why} ({device})"
    experts = shape is not None and shape.moe_layers > 0
    counts = {"formula": flops.MOE_FORMULA, "parameters": "active", "counts": flops.MOE_MFU_BASIS} if experts \
        else {"formula": flops.FORMULAS[flops.MEGATRON_MODEL]}
    return {"flops": flops.MEGATRON_MODEL, **counts, "peak_tflops": peak.tflops,
            "device": device, "precision": peak.precision, "run_precision": peak.run_precision, "dense": True,
            **({"peak_note": peak.note} if peak.note else {}),
            "source": peak.source or f"system profile {system} (no source recorded)"}, None


def tokens_per_s(global_batch_size: int, seq_length: int, iteration_time_s: float) -> float:
    return global_batch_size * seq_length / iteration_time_s


# A log can print any finite number, and rates derived from them can overflow. What these figures feed
# (the JSON contract, tables, means) takes a finite number or None, never inf or nan, and never raises.

def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _figure(formula: Callable[..., float], *args: float) -> float | None:
    """formula(*args), or None where that is no finite number."""
    try:
        return _finite(formula(*args))
    except (OverflowError, ZeroDivisionError):  # an int too large for a float, or a zero
        return None


def _mean(values: list[float]) -> float | None:
    """The mean, or None where the values' sum overflows."""
    try:
        return _finite(statistics.fmean(values))
    except OverflowError:
        return None


def timed_records(records: list[Record]) -> list[Record]:
    """The records a rate can be drawn from: those with a time or a printed rate. A framework's first line
    of an excerpt (torchtitan's, with nothing before it to time it against) is a record of its loss, never
    a zero-second interval to divide by."""
    return [r for r in records if r.iteration_time_s or r.tokens_per_s or r.samples_per_s]


class JubeFigure:
    """JUBE's figure, fed one interval at a time (a growing log is not read twice): the tokens of one global
    batch (the last interval's) over the mean iteration time of every logged interval, warm-up included; for
    a log without times, the same formula over the rates it prints."""

    def __init__(self, seq_length: int | None, global_batch_size: int | None = None) -> None:
        self.seq_length, self.global_batch_size = seq_length, global_batch_size
        # sums: iteration times; seconds per token and per sample of the printed rates
        self._times = self._per_token = self._per_sample = 0.0
        self._count = 0
        self._timed = self._rated = self._sampled = True
        self._last: Record | None = None

    def add(self, record: Record) -> None:
        if not (record.iteration_time_s or record.tokens_per_s or record.samples_per_s):
            return  # an untimed record (see timed_records) is no interval of the figure
        self._count += 1
        self._last = record
        if record.iteration_time_s:
            self._times += record.iteration_time_s
        else:
            self._timed = False
        view = record_view(record, self.seq_length)
        if view["tokens_per_s"]:
            self._per_token += 1.0 / view["tokens_per_s"]
        else:
            self._rated = False
        if view["samples_per_s"]:
            self._per_sample += 1.0 / view["samples_per_s"]
        else:
            self._sampled = False

    @property
    def value(self) -> float | None:
        """Tokens/s so far; None where the log cannot give it."""
        if not self._count:
            return None
        gbs = self.global_batch_size or self._last.global_batch_size
        seq = self.seq_length or self._last.seq_length
        if gbs and seq and self._timed:
            return _figure(lambda t: gbs * seq * self._count / t, self._times)
        return _figure(lambda s: self._count / s, self._per_token) if self._rated else None

    @property
    def samples_per_s(self) -> float | None:
        """The same formula over one batch's samples (sequences): the tokens/s over the sequence length."""
        if not self._count:
            return None
        gbs = self.global_batch_size or self._last.global_batch_size
        if gbs and self._timed:
            return _figure(lambda t: gbs * self._count / t, self._times)
        return _figure(lambda s: self._count / s, self._per_sample) if self._sampled else None


def jube_figure(records: list[Record], seq_length: int | None, global_batch_size: int | None = None) -> JubeFigure:
    """JUBE's formula over `records`: every interval's for the table's figures, the steady intervals' for the
    steady state's."""
    figure = JubeFigure(seq_length, global_batch_size)
    for record in records:
        figure.add(record)
    return figure


def jube_tokens_per_s(records: list[Record], seq_length: int | None,
                      global_batch_size: int | None = None) -> float | None:
    """JUBE's figure over `records` (see JubeFigure): what every view quotes as Tokens/sec."""
    return jube_figure(records, seq_length, global_batch_size).value


def time_to_report_s(tokens_per_s: float | None, report_tokens: int = flops.REPORT_TOKENS) -> float | None:
    """The benchmark's metric at this throughput; None where there is none."""
    return _figure(flops.time_to_report, tokens_per_s, report_tokens) if tokens_per_s else None


def logged_tflops_mean(records: list[Record]) -> float | None:
    """Avg_TFLOPs/GPU as JUBE computes it: the plain mean of the TFLOPs the log prints, every interval."""
    logged = [r.tflops_per_gpu for r in records if r.tflops_per_gpu is not None]
    return _mean(logged) if logged else None


def summarise(records: list[Record], seq_length: int, global_batch_size: int | None = None,
              shape: flops.Shape | None = None, devices: int | None = None, peak_tflops: float | None = None,
              report_tokens: int = flops.REPORT_TOKENS) -> Summary | None:
    """Summary over all intervals, or None when the log has no complete iteration line (or only times so
    large that their mean overflows).

    TFLOPs per GPU is the mean of the logged values when the log has them; otherwise it is computed from
    `shape` and `devices`, in the convention a log of this model uses (flops.log_convention). MFU uses Megatron's
    model FLOPs against the device's peak.
    """
    records = timed_records(records)
    if not records:
        return None
    gbs = global_batch_size or records[-1].global_batch_size
    if not gbs:
        raise ValueError("the log does not give the global batch size; pass it")
    mean_time = _mean([r.iteration_time_s for r in records])
    figure = jube_figure(records, seq_length, gbs)
    tps = figure.value
    if mean_time is None or tps is None:
        return None  # times so large their sum overflows: no figure to report
    convention = flops.JUPITER if shape is None else flops.log_convention(shape)
    avg_tflops = logged_tflops_mean(records)
    if avg_tflops is None and shape is not None and devices:
        avg_tflops = flops.tflops_per_device(flops.CONVENTIONS[convention](shape), mean_time, devices)
    mfu = None
    if shape is not None and devices and peak_tflops:
        mfu = flops.tflops_per_device(flops.megatron_model_flops(shape), mean_time, devices) / peak_tflops
    return Summary(len(records), records[-1].iteration, mean_time, gbs, seq_length, tps, figure.samples_per_s,
                   time_to_report_s(tps, report_tokens), report_tokens, avg_tflops, convention, mfu)


# --- steady state: what `bench parse` reports -----------------------------------------------------------

#: Leading intervals slower than this fraction of the steady median count as warm-up (compilation,
#: allocator growth, the first pipeline fill); they are excluded, at most half of the intervals.
WARMUP_FRACTION = 0.9
#: The fewest logged intervals that decide warm-up: the first of two is warm-up where it ran slower than
#: WARMUP_FRACTION of the second; a single interval has nothing to be compared with.
WARMUP_DECIDED_FROM = 2
# two-sided 95% Student t quantiles for 1..30 degrees of freedom (published tables)
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t95(df: int) -> float:
    """The 97.5% quantile of Student's t: the table up to 30 degrees of freedom, then the first two
    terms of its Cornish-Fisher expansion around the normal quantile (within 1e-4 beyond 30)."""
    if df < 1:
        raise ValueError("a confidence interval needs at least two values")
    if df <= len(_T95):
        return _T95[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


#: where the aux losses sit in a Record (in a row, AUX_LOSSES' order), and a dense record's values there: one C comparison
_AUX_AT = Record._fields.index(AUX_LOSSES[0])
_NO_AUX = (None,) * len(AUX_LOSSES)


def record_view(record: Record, seq_length: int | None) -> dict:
    """One record as the documented JSON contract has it; null where the log cannot say, and where a rate
    derived from it is no finite number (a time so short, or a batch so large, that it overflows). The
    sequence length is the caller's, or the one the log states. A mixture-of-experts run's auxiliary losses
    are keys only where the line prints them: a dense log's records keep the keys they always had."""
    gbs, seconds = record.global_batch_size, record.iteration_time_s
    seq_length = seq_length or record.seq_length
    if gbs and seconds:  # one formula for every figure (the log's own rates where it cannot)
        samples = _figure(operator.truediv, gbs, seconds)
    else:
        samples = record.samples_per_s
    if gbs and seq_length and seconds:
        tokens = _figure(tokens_per_s, gbs, seq_length, seconds)
    elif record.tokens_per_s is not None:
        tokens = record.tokens_per_s
    else:
        tokens = _figure(operator.mul, samples, seq_length) if samples is not None and seq_length else None
    return {"iteration": record.iteration, "iteration_time_s": seconds, "global_batch_size": gbs,
            "seq_length": seq_length, "tokens_per_s": tokens, "samples_per_s": samples,
            "tflops_per_gpu": record.tflops_per_gpu, "mfu_percent": record.mfu_percent, "loss": record.loss,
            **({} if record[_AUX_AT:_AUX_AT + len(_NO_AUX)] == _NO_AUX else
               {name: value for name in AUX_LOSSES if (value := getattr(record, name)) is not None})}


def last_aux_losses(records: list[Record]) -> dict[str, float]:
    """Each auxiliary loss the log prints (a mixture-of-experts run's) at the last record that has it: where
    the run's balancing ended up; empty for a dense run."""
    found: dict[str, float] = {}
    for record in reversed(records):
        for name in AUX_LOSSES:
            value = getattr(record, name)
            if value is not None and name not in found:
                found[name] = value
        if len(found) == len(AUX_LOSSES):
            break
    return {name: found[name] for name in AUX_LOSSES if name in found}


def warmup_decided(intervals: int) -> bool:
    """Whether so many intervals can tell warm-up from the steady state (see WARMUP_DECIDED_FROM)."""
    return intervals >= WARMUP_DECIDED_FROM


def warmup_count(rates: list[float]) -> int:
    """How many leading intervals are warm-up: slower than WARMUP_FRACTION of the median of the rest, at most
    half of them; 0 where warm-up cannot be decided."""
    if not warmup_decided(len(rates)):
        return 0
    reference = statistics.median(rates[1:])
    count = 0
    while count < len(rates) // 2 and rates[count] < WARMUP_FRACTION * reference:
        count += 1
    return count


def spread(values: list[float]) -> dict | None:
    """Mean, median, sample standard deviation and the 95% confidence interval of the mean; None (or a None
    figure) where the values are so large that a figure overflows."""
    mean = _mean(values) if values else None
    if mean is None:
        return None
    if len(values) < 2:
        return {"mean": mean, "median": mean, "std": None, "ci95": None}
    try:
        std = _finite(statistics.stdev(values))
    except (OverflowError, ValueError):
        std = None
    ci95 = None
    if std is not None:
        half = t95(len(values) - 1) * std / len(values) ** 0.5
        if math.isfinite(mean - half) and math.isfinite(mean + half):
            ci95 = [mean - half, mean + half]
    return {"mean": mean, "median": _finite(statistics.median(values)), "std": std, "ci95": ci95}


def steady_rates(records: list[Record], seq_length: int | None) -> tuple[int, list[float]]:
    """How many leading intervals are warm-up, and the tokens/s of each interval after them (of the
    records with a time or a rate: see timed_records)."""
    records = timed_records(records)
    views = [record_view(r, seq_length) for r in records]
    tokens = [v["tokens_per_s"] for v in views]
    samples = [v["samples_per_s"] for v in views]
    rates = tokens if all(t is not None for t in tokens) else samples
    skip = warmup_count(rates) if all(r is not None for r in rates) else 0
    return skip, [t for t in tokens[skip:] if t]


def steady_state(records: list[Record], seq_length: int | None, global_batch_size: int | None = None) -> dict:
    """The steady state: the warm-up intervals left out, JUBE's formula over the rest by JUBE's function
    (`mean`: the time-weighted mean of the intervals' rates, one batch's tokens over the mean iteration time;
    `median`: the median interval's rate), the spread of the intervals' rates (`std`) and the 95% confidence
    interval of `mean` (Student's t on the time per token, carried over to tokens/s). `tokens_per_s` is None
    where the log cannot give tokens; `samples_per_s` is the same formula over one batch's samples."""
    skip, steady = steady_rates(records, seq_length)
    figure = jube_figure(timed_records(records)[skip:], seq_length, global_batch_size)
    out = {"intervals": len(records), "warmup_excluded": skip, "tokens_per_s": None,
           "samples_per_s": figure.samples_per_s}
    mean = figure.value
    if mean is None or not steady:
        return out
    per_token = spread([1.0 / t for t in steady]) or {}
    ci95 = None
    if per_token.get("ci95") and per_token["ci95"][0] > 0:
        ci95 = [_figure(operator.truediv, 1.0, per_token["ci95"][1]), _figure(operator.truediv, 1.0, per_token["ci95"][0])]
        ci95 = ci95 if None not in ci95 else None
    out["tokens_per_s"] = {"mean": mean, "median": _finite(statistics.median(steady)),
                           "std": (spread(steady) or {}).get("std"), "ci95": ci95}
    return out


def steady_summary(records: list[Record], seq_length: int | None, report_tokens: int = flops.REPORT_TOKENS,
                   global_batch_size: int | None = None) -> tuple[list[dict], dict]:
    """The contract's records and summary: the steady state (warm-up excluded, spread reported) and JUBE's
    every-interval figures beside it under their own names (`*_all_intervals`: the table's figures, by the
    table's functions)."""
    views = [record_view(r, seq_length) for r in records]
    steady = steady_state(records, seq_length, global_batch_size)
    every = jube_figure(records, seq_length, global_batch_size)
    tokens_spread = steady["tokens_per_s"]
    summary = {
        "iterations": records[-1].iteration if records else 0,
        "intervals": len(records),
        "warmup_excluded": steady["warmup_excluded"],
        "tokens_per_s": tokens_spread,
        "tokens_per_s_all_intervals": every.value,
        "samples_per_s": steady["samples_per_s"],
        "samples_per_s_all_intervals": every.samples_per_s,
        "report_tokens": report_tokens,
        "time_to_report_s": time_to_report_s(tokens_spread["mean"] if tokens_spread else None, report_tokens),
        "time_to_report_s_all_intervals": time_to_report_s(every.value, report_tokens),
        "avg_tflops_per_gpu_all_intervals": logged_tflops_mean(records),
        "aux_losses": last_aux_losses(records),
    }
    return views, summary


JOULES_PER_KWH = 3.6e6


def energy_summary(records: list[Record], seq_length: int, report_tokens: int = flops.REPORT_TOKENS,
                   why_not: str | None = None) -> dict:
    """Joules per token over the steady intervals (warm-up excluded, as for the steady tokens/s) and the
    kWh the report's training would take at that rate; nulls with the reason where the log has no energy."""
    records = timed_records(records)
    if not [r for r in records if r.energy_j is not None and r.global_batch_size]:
        return {"joules_per_token": None, "report_kwh": None, "source": None,
                "reason": why_not or "the log has no energy figures"}
    skip = steady_rates(records, seq_length)[0]
    # iterations per interval: since the previous record (the first one: as many as the second interval had)
    spans = [b.iteration - a.iteration for a, b in zip(records, records[1:], strict=False)]
    spans = [spans[0] if spans else records[0].iteration, *spans]
    steady = [(r, span) for r, span in zip(records[skip:], spans[skip:], strict=True)
              if r.energy_j is not None and r.global_batch_size]
    tokens = sum(span * r.global_batch_size * seq_length for r, span in steady)
    joules = sum(r.energy_j for r, _ in steady)
    per_token = joules / tokens if tokens else None
    return {"joules_per_token": per_token,
            "report_kwh": per_token * report_tokens / JOULES_PER_KWH if per_token is not None else None,
            "source": "NVML, the job's GPUs, steady intervals", "intervals": len(steady), "reason": None}
