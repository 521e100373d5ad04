"""Iteration logs of every training stack the benchmark meets, read into one record type.

Formats (names as `bench parse --format` takes them; `detect` picks one from the text):

- Megatron-shaped lines, one parser for all their variants: this project's trainer (`nlp-bench`),
  JUPITER-patched Megatron-LM with torchrun `[defaultN]:` prefixes, seconds, samples/s and TFLOPs
  (`megatron-jupiter`), older Megatron in milliseconds (`megatron`), current Megatron-LM with a timestamp
  and `throughput per GPU (TFLOP/s/GPU)` (`megatron-current`), Megatron-DeepSpeed with `consumed tokens`
  (`megatron-deepspeed`), and the AWS Neuron reference with a trailing `throughput:` in sequences/s
  (`neuron-megatron`).
- `nxdt`: NxD Training's PyTorch-Lightning progress bars, redrawn with carriage returns.
- `hf-bert`: the Hugging Face BERT pretraining script's `LOG ... throughput :` lines on Neuron.

Lines are found wherever they sit in a job.out full of NCCL, Slurm and Python noise; an iteration
printed by several ranks counts once. A value is only trusted when its field is closed (by `|`, `]`
or the end of a finished line): the last line of a killed job's log is cut anywhere.
"""

from __future__ import annotations

import contextlib
import gc
import math
import multiprocessing
import operator
import os
import re
import statistics
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import NamedTuple

from nlp_bench.errors import ResultError

MEGATRON = "megatron"


class ParseError(ResultError):
    """A log that cannot be read, or holds no iteration record of the asked (or any) format."""


class NoRecords(ParseError):
    """The log was read but holds no iteration record."""


class Record(NamedTuple):
    """One logged interval (Megatron logs the mean over the last log-interval iterations). A named tuple:
    a long log holds hundreds of thousands, each made in one C call (the parse speed goal)."""

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

    def to_dict(self) -> dict:
        return self._asdict()


def _number(raw: str) -> float | None:
    """A finite number, or None."""
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


@contextlib.contextmanager
def _collector_paused():
    """Parsing builds hundreds of thousands of tuples that all stay alive; the cyclic garbage collector
    would scan them again and again for nothing (a fifth of the parse time of a large log)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# --- Megatron-shaped lines ---------------------------------------------------------------------------

_ITERATION = re.compile(r"iteration\s+(\d+)\s*/\s*(\d+)\s*\|([^\n\r]*)")
_FIELD = re.compile(r"\s*([A-Za-z][A-Za-z /()\-]*?)\s*:\s*([-+0-9.eEinfa]+)\s*(\||$)")
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
    "throughput": ("samples_per_s", float),  # the Neuron reference: sequences/s
    "tokens per second": ("tokens_per_s", float),
    "TFLOPs": ("tflops_per_gpu", float),
    "throughput per GPU (TFLOP/s/GPU)": ("tflops_per_gpu", float),
    "energy (J)": ("energy_j", float),
}
_TIME = {"elapsed time per iteration (s)": 1.0, "elapsed time per iteration (ms)": 1e-3}
_POSITIVE = {"global_batch_size", "samples_per_s", "tokens_per_s", "tflops_per_gpu"}


def _handler(key: str) -> tuple[str, float, bool] | None:
    """What a field becomes: (Record attribute or "seconds", scale, keep only if > 0), or None to ignore."""
    if key in _TIME:
        return "seconds", _TIME[key], True
    if key in _KEYS:
        name, kind = _KEYS[key]
        return name, (0 if kind is int else 1.0), name in _POSITIVE
    return None


def _assign(fields: dict, handler: tuple[str, float, bool], raw: str) -> None:
    name, scale, positive = handler
    value = _number(raw)
    if value is None or (positive and value <= 0):
        return  # nan, inf, or a rate or batch of zero: a broken line, not a measurement
    fields[name] = int(value) if scale == 0 else value * scale


def _megatron_fields(rest: str, terminated: bool) -> tuple[dict, list[str], bool]:
    """The fields of a line, the keys in order, and whether every field was closed."""
    fields: dict = {}
    keys = []
    whole = True
    for key, raw, closer in _FIELD.findall(rest):
        if not closer and not terminated:
            whole = False
            continue  # the field ran into the end of a line that was cut off
        keys.append(key)
        whole = whole and bool(closer)
        handler = _handler(key)
        if handler is not None:
            _assign(fields, handler, raw)
    return fields, keys, whole


_VALUE = "[-+0-9.eEinfa]+"
_ORDER = Record._fields[3:]  # the optional fields, in Record's order


def _column(raw: list[str], handler: tuple[str, float, bool]) -> list:
    """One field of many lines, converted as _assign does one value (None where it would not assign)."""
    _, scale, positive = handler
    try:
        values = list(map(float, raw))
        clean = all(map(math.isfinite, values)) and (not positive or min(values) > 0)
    except ValueError:
        values, clean = [_number(r) for r in raw], False
    if not clean:  # the rare column with a broken value: check each one
        values = [v if v is not None and math.isfinite(v) and (v > 0 or not positive) else None for v in values]
    if scale == 0:
        return [None if v is None else int(v) for v in values] if not clean else list(map(int, values))
    return values if scale == 1.0 else [None if v is None else v * scale for v in values]


class _Layout:
    """The field sequence of a complete line compiled into one regex over whole lines. A log repeats one
    layout, so one findall matches all its lines and their numbers are converted a column at a time
    (the parse speed goal); a line of another shape goes field by field."""

    def __init__(self, keys: list[str]) -> None:
        self.handlers = [h for h in map(_handler, keys) if h is not None]
        # [ \t], never \s: a match must not run on into the next line
        parts = [rf"[ \t]*{re.escape(k)}[ \t]*:[ \t]*{f'({_VALUE})' if _handler(k) else _VALUE}[ \t]*\|" for k in keys]
        self.regex = re.compile(r"^[^\n]*?iteration[ \t]+(\d+)[ \t]*/[ \t]*(\d+)[ \t]*\|" + "".join(parts) + r"[ \t]*$",
                                re.M)

    def records(self, lines: list[str]) -> tuple[list[Record], int]:
        """The records of the lines that have this layout, and how many lines had it."""
        rows = self.regex.findall("\n".join(lines))
        if not rows:
            return [], 0
        # one flat list of every captured string, read a column at a time by slicing: all in C
        width, flat, empty = len(rows[0]), list(chain.from_iterable(rows)), [None] * len(rows)
        by_name = {handler[0]: _column(flat[k::width], handler) for k, handler in enumerate(self.handlers, 2)}
        values = zip(map(int, flat[0::width]), map(int, flat[1::width]), by_name.get("seconds", empty),
                     *(by_name.get(name, empty) for name in _ORDER), strict=False)
        return [record for record in map(Record._make, values) if record.iteration_time_s], len(rows)


def _record(iteration: int, total: int, fields: dict) -> Record | None:
    seconds = fields.pop("seconds", None)
    if seconds is None or seconds <= 0:
        return None
    return Record(iteration, total, seconds, **fields)


def parse_line(line: str, terminated: bool = False) -> Record | None:
    """The record in one Megatron iteration line, or None. `terminated`: the line ended with a newline,
    so a last field not closed by `|` (the Neuron reference's `throughput:`) is whole."""
    match = _ITERATION.search(line)
    if not match:
        return None
    return _record(int(match.group(1)), int(match.group(2)), _megatron_fields(match.group(3), terminated)[0])


def _megatron_variant(keys: set[str], line: str) -> str:
    """Which Megatron the first record's line comes from."""
    if "tokens per second" in keys:
        return "nlp-bench"
    if "throughput" in keys:
        return "neuron-megatron"
    if "consumed tokens" in keys:
        return "megatron-deepspeed"
    if "throughput per GPU (TFLOP/s/GPU)" in keys or re.search(r"\[\d{4}-\d\d-\d\d [\d:.]+\] iteration", line):
        return "megatron-current"
    if "TFLOPs" in keys:
        return "megatron-jupiter"
    return MEGATRON


def _megatron_serial(text: str) -> tuple[list[Record], list[str], str]:
    """Records of one stretch of log, with the first record's field keys and line (for the variant)."""
    lines = text.split("\n")
    torn = lines.pop() if not text.endswith("\n") else ""  # a last line without its newline may be cut
    # one line per iteration header: other ranks print the same line again
    unique: dict[str, str] = {}
    for line in [line for line in lines if "iteration" in line]:
        at = line.find("iteration")
        unique.setdefault(line[at:line.find("|", at)], line)
    seen: dict[int, Record] = {}
    first_keys: list[str] = []
    first_line = ""
    candidates = list(unique.values())
    matched = 0
    probe = next((m for m in map(_ITERATION.search, candidates) if m), None)
    if probe is not None:
        first_line = probe.string
        fields, first_keys, whole = _megatron_fields(probe.group(3), terminated=True)
        if whole and "seconds" in fields:
            records, matched = _Layout(first_keys).records(candidates)
            for record in records:
                seen.setdefault(record.iteration, record)
    # lines of another shape than the first, field by field (all of them, unless every line had the
    # layout), and the torn last line
    rest = [] if matched == len(candidates) else [(line, True) for line in candidates]
    for line, terminated in [*rest, (torn, False)]:
        for match in _ITERATION.finditer(line):
            iteration = int(match.group(1))
            if iteration in seen:
                continue
            fields, keys, _ = _megatron_fields(match.group(3), terminated)
            record = _record(iteration, int(match.group(2)), fields)
            if record is not None:
                seen[iteration] = record
                if not first_keys:
                    first_keys, first_line = keys, line
    return [seen[i] for i in sorted(seen)], first_keys, first_line


def _parse_megatron(text: str) -> tuple[list[Record], str | None]:
    records, keys, line = _megatron_serial(text)
    return records, (_megatron_variant(set(keys), line) if records else None)


#: Log files at least this large are parsed in byte ranges by forked workers, one per core (up to 8),
#: each reading its own range: one process reads and parses 60-70 MB/s here.
PARALLEL_BYTES = 32_000_000


@_collector_paused()
def _megatron_range(task: tuple[str, int, int]) -> tuple[list[list], list[str], str]:
    path, start, end = task
    with open(path, "rb") as fh:
        fh.seek(start)
        text = fh.read(end - start).decode("utf-8", errors="replace")
    records, keys, line = _megatron_serial(text)
    return [list(column) for column in zip(*records, strict=False)], keys, line  # columns cross the pipe fastest


def _megatron_file(path: Path) -> Parsed | None:
    """The Megatron records of a large log file, parsed in parallel; None where that does not apply."""
    try:
        size = path.stat().st_size
    except OSError:
        return None
    workers = min(os.cpu_count() or 1, 8, size // PARALLEL_BYTES)
    if workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return None
    cuts = [0]
    with path.open("rb") as fh:
        for k in range(1, workers):  # cut after a newline: no line is split, only the file's last may be torn
            fh.seek(size * k // workers)
            window = fh.read(1 << 20)
            newline = window.find(b"\n")
            if newline >= 0:
                cuts.append(size * k // workers + newline + 1)
    cuts.append(size)
    with ProcessPoolExecutor(len(cuts) - 1, mp_context=multiprocessing.get_context("fork")) as pool:
        parts = list(pool.map(_megatron_range, [(str(path), a, b) for a, b in zip(cuts, cuts[1:], strict=False)]))
    records: list[Record] = []
    seen: set[int] = set()
    for columns, _, _ in parts:  # earlier ranges first: the first complete copy of an iteration counts
        if not columns:
            continue
        rows = map(Record._make, zip(*columns, strict=False))
        records += rows if seen.isdisjoint(columns[0]) else (r for r in rows if r.iteration not in seen)
        seen.update(columns[0])
    if not records:
        return None
    records.sort(key=operator.itemgetter(0))
    keys, line = next(((k, ln) for _, k, ln in parts if k), ([], ""))
    return Parsed(_megatron_variant(set(keys), line), records)


# --- NxD Training progress bars ----------------------------------------------------------------------

_BAR = re.compile(r"Epoch\s+\d+:\s*\d+%\|[^|\r\n]*\|\s*(\d+)/(\d+)\s*\[[^,\]\r\n]*,\s*([0-9.]+)(s/it|it/s)"
                  r"((?:,\s*[A-Za-z_][\w.]*=[^,\]\r\n]*)*)\]")
_POSTFIX = re.compile(r"([A-Za-z_][\w.]*)=([^,\]]*)")


def _parse_nxdt(text: str) -> tuple[list[Record], str | None]:
    latest: dict[int, tuple[Record, float | None]] = {}
    for match in _BAR.finditer(text):
        rate = _number(match.group(3))
        if not rate:
            continue
        seconds = rate if match.group(4) == "s/it" else 1.0 / rate
        post = {k: _number(v) for k, v in _POSTFIX.findall(match.group(5))}
        step = post.get("global_step")
        iteration = int(step) if step is not None and step >= 0 else int(match.group(1))
        loss = post.get("reduced_train_loss", post.get("loss"))
        throughput = post.get("throughput")
        record = Record(iteration, int(match.group(2)), seconds, loss=loss, learning_rate=post.get("lr"),
                        samples_per_s=throughput if throughput and throughput > 0 else None)
        consumed = post.get("consumed_samples")
        latest[iteration] = (record, consumed)  # a redraw refines the same step: the last one counts
    steps = sorted(latest)
    deltas = [(latest[b][1] - latest[a][1]) / (b - a) for a, b in zip(steps, steps[1:], strict=False)
              if latest[a][1] is not None and latest[b][1] is not None and latest[b][1] > latest[a][1]]
    gbs = int(round(statistics.median(deltas))) if deltas else None
    records = []
    for step in steps:
        record, consumed = latest[step]
        samples = record.samples_per_s if record.samples_per_s is not None or not gbs else gbs / record.iteration_time_s
        records.append(record._replace(global_batch_size=gbs, samples_per_s=samples,
                                       consumed_samples=int(consumed) if consumed is not None else None))
    return records, ("nxdt" if records else None)


# --- Hugging Face BERT on Neuron ---------------------------------------------------------------------

_BERT = re.compile(r"LOG [^\n\r]*?- \((\d+), (\d+)\) step_loss : (\S+)\s+learning_rate : (\S+)\s+"
                   r"throughput : ([0-9.eE+-]+)([^\n\r]*)")


def _parse_hf_bert(text: str) -> tuple[list[Record], str | None]:
    seen: dict[int, Record] = {}
    end = len(text)
    for match in _BERT.finditer(text):
        if match.end() == end:
            continue  # the throughput may have been cut
        throughput = _number(match.group(5))
        if throughput is None or throughput <= 0:
            continue
        step = int(match.group(2))
        seen.setdefault(step, Record(step, None, None, loss=_number(match.group(3)),
                                     learning_rate=_number(match.group(4)), samples_per_s=throughput))
    records = [seen[i] for i in sorted(seen)]
    return records, ("hf-bert" if records else None)


# --- detection and the public entry points -----------------------------------------------------------

_PARSERS = {"megatron": _parse_megatron, "nxdt": _parse_nxdt, "hf-bert": _parse_hf_bert}
#: the names `--format` accepts: the three parsers and the Megatron variants (which select the Megatron parser)
FORMATS = ("megatron", "megatron-jupiter", "megatron-current", "megatron-deepspeed", "neuron-megatron",
           "nlp-bench", "nxdt", "hf-bert")


@dataclass
class Parsed:
    format: str | None
    records: list[Record]


@_collector_paused()
def parse(text: str, fmt: str | None = None) -> Parsed:
    """Records of a log in the given format, or in the format the text shows (the one yielding records,
    Megatron first). Raises ParseError when there are none."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise ParseError(f"unknown log format {fmt!r}; formats: {', '.join(FORMATS)}")
        parser = _PARSERS["megatron" if fmt not in _PARSERS else fmt]
        records, found = parser(text)
        if not records:
            raise NoRecords(f"no {fmt} iteration records in the log")
        return Parsed(found if fmt in _PARSERS else fmt, records)
    for parser in _PARSERS.values():
        records, found = parser(text)
        if records:
            return Parsed(found, records)
    raise NoRecords("no iteration records in the log (formats tried: " + ", ".join(_PARSERS) + ")")


def parse_text(text: str) -> list[Record]:
    """All iteration records of a log, in iteration order, each iteration once ([] when there are none)."""
    try:
        return parse(text).records
    except NoRecords:
        return []


def read_log(path: Path) -> str:
    """A log's text; bytes that are not UTF-8 (a torn multi-byte character) become U+FFFD."""
    try:
        return Path(path).read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        raise ParseError(f"log not found: {path}") from None
    except IsADirectoryError:
        raise ParseError(f"{path} is a folder, not a log") from None
    except OSError as exc:
        raise ParseError(f"cannot read {path}: {exc.strerror}") from None


@_collector_paused()
def parse_log(path: Path, fmt: str | None = None) -> Parsed:
    """parse() for a log file; a large Megatron log is read and parsed in parallel byte ranges."""
    path = Path(path)
    if fmt is None or (fmt in FORMATS and fmt not in ("nxdt", "hf-bert")):  # a Megatron variant, or detect
        parsed = _megatron_file(path)
        if parsed is not None:
            return parsed if fmt in (None, "megatron") else Parsed(fmt, parsed.records)
    return parse(read_log(path), fmt)


def parse_file(path: Path) -> list[Record]:
    """All iteration records of a log file ([] when there are none)."""
    try:
        return parse_log(path).records
    except NoRecords:
        return []
