"""Parsers for Megatron-shaped iteration logs: this project's trainer, JUPITER-patched Megatron-LM
(torchrun `[defaultN]:` prefixes, seconds, samples/s and TFLOPs), and older Megatron in milliseconds.

Lines are found wherever they sit in a job.out full of NCCL, Slurm and Python noise; an iteration
printed by several ranks counts once, and a torn last line (a killed job) is skipped.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

MEGATRON = "megatron"

_ITERATION = re.compile(r"iteration\s+(\d+)\s*/\s*(\d+)\s*\|")
_FIELD = re.compile(r"\s*([A-Za-z][A-Za-z /()\-]*?)\s*:\s*([-+0-9.eEinfa]+)\s*$")


@dataclass
class Record:
    """One logged interval (Megatron logs the mean over the last log-interval iterations)."""

    iteration: int
    total_iterations: int
    iteration_time_s: float
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

    def to_dict(self) -> dict:
        return asdict(self)


_KEYS = {
    "consumed samples": ("consumed_samples", int),
    "learning rate": ("learning_rate", float),
    "global batch size": ("global_batch_size", int),
    "lm loss": ("loss", float),
    "loss scale": ("loss_scale", float),
    "grad norm": ("grad_norm", float),
    "number of skipped iterations": ("skipped_iterations", int),
    "number of nan iterations": ("nan_iterations", int),
    "samples per second": ("samples_per_s", float),
    "tokens per second": ("tokens_per_s", float),
    "TFLOPs": ("tflops_per_gpu", float),
    "throughput per GPU (TFLOP/s/GPU)": ("tflops_per_gpu", float),
}


def parse_line(line: str) -> Record | None:
    """The record in one Megatron iteration line, or None if the line is not a complete one."""
    match = _ITERATION.search(line)
    if not match:
        return None
    fields: dict[str, float | int] = {}
    seconds = None
    # only fields closed by "|" count: a line cut off mid-number must not yield a wrong number
    for part in line[match.end():].split("|")[:-1]:
        field = _FIELD.match(part)
        if not field:
            continue
        key, raw = field.group(1).strip(), field.group(2)
        try:
            if key == "elapsed time per iteration (s)":
                seconds = float(raw)
            elif key == "elapsed time per iteration (ms)":
                seconds = float(raw) / 1000.0
            elif key in _KEYS:
                name, kind = _KEYS[key]
                fields[name] = kind(float(raw)) if kind is int else float(raw)
        except ValueError:
            continue
    if seconds is None or seconds <= 0:
        return None
    return Record(int(match.group(1)), int(match.group(2)), seconds, **fields)


def parse_text(text: str) -> list[Record]:
    """All iteration records in a log, in iteration order, each iteration once."""
    seen: dict[int, Record] = {}
    for line in text.replace("\r", "\n").splitlines():
        record = parse_line(line)
        if record is not None and record.iteration not in seen:
            seen[record.iteration] = record
    return [seen[i] for i in sorted(seen)]


def parse_file(path: Path) -> list[Record]:
    return parse_text(Path(path).read_text(errors="replace"))
