"""The one record every log format is read into, and the small number rules all formats share.

Every parser in `formats/` turns its framework's lines into `Record`s; `parsers` detects the format and
feeds the text. A value read from a log is trusted only when it is a finite number: a broken line is not
a number to average.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import NamedTuple

from nlp_bench.errors import ResultError

#: Characters a line may have (without its line break) to be read: a Megatron iteration line is under
#: 1 KB even with every optional field, a progress-bar redraw under 400 characters.
MAX_LINE = 1 << 16
#: The names frameworks give their own step timer: NeMo's (in a progress bar, its text progress and its
#: MLPerf callbacks) and MLPerf's common callbacks'.
STEP_TIMERS = ("train_step_timing in s", "train_step_timing", "train_step_time")
#: An iteration time at or below this (seconds) is a broken line, not a measurement: no training step
#: takes a nanosecond, and rates derived from such a time overflow to infinity.
MIN_SECONDS = 1e-9
#: The auxiliary losses of mixture-of-experts runs, in Record's order: the JSON keeps them as logged.
AUX_LOSSES = ("load_balancing_loss", "seq_load_balancing_loss", "global_load_balancing_loss", "z_loss", "mtp_loss")
#: A count (batch size, samples, iterations) this large is a broken field: no trainer counts past int64.
MAX_COUNT = 1 << 63


class ParseError(ResultError):
    """A log that cannot be read, or holds no iteration record of the asked (or any) format."""


class NoRecords(ParseError):
    """The log was read but holds no iteration record."""


class Record(NamedTuple):
    """One logged interval (Megatron logs the mean over the last log-interval iterations; a framework that
    logs every step gives one record per step). A named tuple: a long log holds hundreds of thousands,
    each made in one C call (the parse speed goal). Rates are the whole job's, never one device's."""

    iteration: int
    total_iterations: int | None
    iteration_time_s: float | None
    global_batch_size: int | None = None
    consumed_samples: int | None = None
    learning_rate: float | None = None
    loss: float | None = None
    loss_scale: float | None = None
    grad_norm: float | None = None
    skipped_iterations: int | None = None
    nan_iterations: int | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    tflops_per_gpu: float | None = None
    energy_j: float | None = None  # joules the job's GPUs used over the interval (this trainer, with NVML)
    seq_length: int | None = None  # where the log states it (Megatron's lines never do)
    mfu_percent: float | None = None  # model FLOPs utilisation as the framework printed it, in percent
    # a mixture-of-experts run's auxiliary losses, as Megatron-LM and Megatron-Bridge print them (each the
    # mean over the MoE layers and the interval); None in a dense run's log
    load_balancing_loss: float | None = None  # the router's auxiliary loss (`--moe-router-load-balancing-type aux_loss`)
    seq_load_balancing_loss: float | None = None  # its per-sequence variant (`seq_aux_loss`, DeepSeek-V3)
    global_load_balancing_loss: float | None = None  # its global-batch variant (`global_aux_loss`)
    z_loss: float | None = None  # the router's z-loss (`--moe-z-loss-coeff`)
    mtp_loss: float | None = None  # the first multi-token-prediction depth's loss (`mtp_1 loss`)

    def to_dict(self) -> dict:
        """The stored form: an aux loss the log does not print is no key, so a dense run's results keep the
        keys they always had."""
        found = self._asdict()
        for name in AUX_LOSSES:
            if found[name] is None:
                del found[name]
        return found


def number(raw: str) -> float | None:
    """A finite number, or None."""
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def count(value: float | None) -> int | None:
    """A float read from a log as a count, or None where it cannot be one (negative, or past int64)."""
    return int(value) if value is not None and 0 <= value < MAX_COUNT else None


def positive(value: float | None) -> float | None:
    """A rate or a time as a measurement: None where it is zero or less (no step takes no time)."""
    return value if value is not None and value > MIN_SECONDS else None


class Warnings(Counter):
    """What a parser recognised but could not read, by what it was (`{reason: times}`: the lines, steps or
    events it concerns): a format that knows a line and drops a field of it says so, and the parse summary
    counts it."""
