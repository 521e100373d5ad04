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
printed by several ranks counts once (the first line, in the log's order, that gives a record). A value
is only trusted when its field is closed (by `|`, `]` or the end of a finished line): the last line of a
killed job's log is cut anywhere.

A job.out is written by programs that can print anything, so reading one must cost time in proportion to
its size and memory in proportion to its records, whatever it holds. A log is read in chunks and cut into
lines at `\n` and at `\r` (a progress bar's redraw is a line of its own; a carriage return ends a Megatron
line as it ends what the terminal shows); a line longer than MAX_LINE characters is skipped and counted,
and never held whole: no training stack prints one. No pattern here can be made to scan a part of a line
again and again (no lazy prefix that a failing match retries from every later start, no `key: value`
search that every position of a long run of letters restarts), nor to keep a backtracking record per
repetition of a group (memory in proportion to the line).
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import gc
import math
import multiprocessing
import operator
import os
import re
import statistics
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from itertools import chain, filterfalse
from pathlib import Path
from typing import IO, NamedTuple

from nlp_bench.errors import ResultError

MEGATRON = "megatron"
#: Characters a line may have (without its line break) to be read: a Megatron iteration line is under
#: 1 KB even with every optional field, a progress-bar redraw under 400 characters.
MAX_LINE = 1 << 16
#: Bytes read from a log file at a time: large enough that the per-chunk work is noise, small enough
#: that the text held at once is a few MB whatever the log's size.
CHUNK_BYTES = 1 << 22
#: An iteration time at or below this (seconds) is a broken line, not a measurement: no training step
#: takes a nanosecond, and rates derived from such a time overflow to infinity.
MIN_SECONDS = 1e-9
#: A count (batch size, samples, iterations) this large is a broken field: no trainer counts past int64.
MAX_COUNT = 1 << 63


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


def _count(value: float | None) -> int | None:
    """A float read from a log as a count, or None where it cannot be one."""
    return int(value) if value is not None and abs(value) < MAX_COUNT else None


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


# --- lines -------------------------------------------------------------------------------------------


#: whole lines of a log: text[start:end], which ends with a line break (a view, to copy no text)
_Span = tuple[str, int, int]


class _Lines:
    """Text fed in pieces, handed on as spans of whole lines: the unfinished last line is held back until
    its line break comes, and a line longer than `limit` is dropped (and counted) as soon as it is known to
    be, so no more than `limit` characters of it are ever held. Spans point into the pieces themselves:
    copying a chunk of text costs as much as reading it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.skipped = 0
        self._pieces: list[str] = []  # the unfinished line, in pieces: joining once costs less than growing
        self._held = 0
        self._skipping = False  # inside a line already known to be too long

    def feed(self, text: str) -> list[_Span]:
        """The whole lines this piece completes ([] when it completes none)."""
        cut = text.rfind("\n")
        if cut < 0:
            self._hold(text)
            return []
        first = text.find("\n") + 1
        if self._skipping:  # the piece ends the long line
            self.skipped += 1
            self._skipping = False
            spans, start = [], first
        elif self._pieces:  # the piece ends the held line
            head = "".join(self._pieces) + text[:first]
            spans, start = self._short(head, 0, len(head)), first
        else:
            spans, start = [], 0
        spans += self._short(text, start, cut + 1)
        self._pieces, self._held = [], 0
        self._hold(text[cut + 1:])
        return spans

    def finish(self) -> str:
        """The last line when the text does not end with a line break: it may have been cut anywhere."""
        if self._skipping:
            self.skipped += 1
            self._skipping = False
            return ""
        torn = "".join(self._pieces)
        self._pieces, self._held = [], 0
        return torn

    def _hold(self, text: str) -> None:
        if self._skipping or not text:
            return
        self._held += len(text)
        if self._held > self.limit:
            self._pieces, self._held, self._skipping = [], 0, True
        else:
            self._pieces.append(text)

    def _short(self, text: str, start: int, end: int) -> list[_Span]:
        """text[start:end] as spans without its lines longer than the limit. Any such line holds one of the
        positions start + limit, start + 2·limit, ... (or the first `limit` after the end of a long one), so
        looking at the line around each of those finds them all while reading every other line not at all."""
        limit = self.limit
        if end - start <= limit:
            return [(text, start, end)] if end > start else []
        spans: list[_Span] = []
        keep, at = start, start + limit
        while at < end:
            before = text.rfind("\n", start, at)
            begin = start if before < 0 else before + 1
            stop = text.find("\n", at, end)  # the span ends with a line break: always found
            if stop - begin > limit:
                if begin > keep:
                    spans.append((text, keep, begin))
                self.skipped += 1
                keep, at = stop + 1, stop + 1 + limit
            else:
                at += limit
        if keep < end:
            spans.append((text, keep, end))
        return spans


def _text_pieces(text: str, size: int) -> Iterator[str]:
    for start in range(0, len(text), size):
        yield text[start:start + size]


def _file_pieces(fh: IO[bytes], size: int, end: int | None = None) -> Iterator[str]:
    """A file's text a chunk at a time, up to byte `end`; bytes that are not UTF-8 (a torn multi-byte
    character) become U+FFFD, exactly as decoding the whole file at once would make them."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    left = None if end is None else end - fh.tell()
    while left is None or left > 0:
        data = fh.read(size if left is None else min(size, left))
        if not data:
            break
        if left is not None:
            left -= len(data)
        yield decoder.decode(data)
    yield decoder.decode(b"", final=True)


# --- Megatron-shaped lines ---------------------------------------------------------------------------

# at most 18 digits: int() of a longer run is refused by Python (and slow); no log counts that far
_ITERATION = re.compile(r"iteration\s+(\d{1,18})\s*/\s*(\d{1,18})\s*\|([^\n\r]*)")
#: the text of each line from its first "iteration" on: the part that decides its record
_SUFFIX = re.compile(r"iteration[^\n]*")
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


class _Handler(NamedTuple):
    name: str  # a Record attribute, or "seconds"
    is_count: bool
    scale: float
    low: float | None  # values at or below it are no measurement (a rate of zero, a nanosecond iteration)


def _handler(key: str) -> _Handler | None:
    """What a field becomes, or None to ignore it."""
    if key in _TIME:
        return _Handler("seconds", False, _TIME[key], MIN_SECONDS)
    if key in _KEYS:
        name, kind = _KEYS[key]
        return _Handler(name, kind is int, 1.0, 0.0 if name in _POSITIVE else None)
    return None


def _value(raw: str, handler: _Handler) -> float | int | None:
    """A field's value, or None where it is no measurement (nan, inf, a rate or batch of zero, an
    impossible count or time): a broken line is not a number to average."""
    value = _number(raw)
    if value is None:
        return None
    value *= handler.scale
    if handler.low is not None and value <= handler.low:
        return None
    return _count(value) if handler.is_count else value


#: the longest start of a key's text that ends with a character a key cannot hold (letters, spaces, / ( ) -)
_KEY_END = re.compile(r".*[^A-Za-z /()\-]", re.S)
_LETTER = re.compile(r"[A-Za-z]")
_VALUE_CHARS = "-+0123456789.eEinfa"


def _field(segment: str) -> tuple[str, str] | None:
    """The key and raw value of one `key: value` stretch between two `|`, or None. The key is the
    longest run of key characters before the last colon that starts with a letter; the value is all that
    follows the colon, spaces aside, and must look like a number."""
    colon = segment.rfind(":")
    if colon < 0:
        return None
    raw = segment[colon + 1:].strip()
    if not raw or raw.strip(_VALUE_CHARS):
        return None
    body = segment[:colon].rstrip()
    end = _KEY_END.match(body)
    letter = _LETTER.search(body, end.end() if end else 0)
    return (body[letter.start():], raw) if letter else None


def _megatron_fields(rest: str, terminated: bool) -> tuple[dict, list[str], bool]:
    """The fields of a line after its iteration header, the keys in order, and whether every field was
    closed. Split at `|`, each stretch read once: a search for `key: value` pairs anywhere in the text
    would restart at every position of a long run of letters or spaces."""
    fields: dict = {}
    keys = []
    whole = True
    segments = rest.split("|")
    last = len(segments) - 1
    for at, segment in enumerate(segments):
        found = _field(segment)
        if found is None:
            continue
        key, raw = found
        if at == last and not terminated:
            whole = False
            continue  # the field ran into the end of a line that was cut off
        keys.append(key)
        whole = whole and at < last
        handler = _handler(key)
        if handler is not None:
            value = _value(raw, handler)
            if value is not None:
                fields[handler.name] = value
    return fields, keys, whole


def _megatron_record(text: str, terminated: bool) -> tuple[Record | None, list[str], bool]:
    """The record of one line (or None), its field keys and whether all its fields were closed."""
    match = _ITERATION.search(text)
    if match is None:
        return None, [], False
    fields, keys, whole = _megatron_fields(match.group(3), terminated)
    seconds = fields.pop("seconds", None)
    record = None if seconds is None else Record(int(match.group(1)), int(match.group(2)), seconds, **fields)
    return record, keys, whole


def parse_line(line: str, terminated: bool = False) -> Record | None:
    """The record in one Megatron iteration line, or None. `terminated`: the line ended with a newline,
    so a last field not closed by `|` (the Neuron reference's `throughput:`) is whole."""
    if len(line) > MAX_LINE:
        return None
    return _megatron_record(line, terminated)[0]


_VALUE = "[-+0-9.eEinfa]+"
_ORDER = Record._fields[3:]  # the optional fields, in Record's order
#: a line of another shape, in a layout's findall: matched (so every line gives one row) but captures nothing
_UNMATCHED = object()
_LAYOUT_FIELDS = 64  # a line with more fields is no Megatron line worth a compiled pattern
_LAYOUTS = 8
_NEW_LAYOUT_LINES = 16  # lines of another shape in one block that make it worth compiling theirs
_EXACT = 1 << 53  # integers a float holds exactly
#: Record._make without its Python frame: a C call per record
_MAKE_RECORD = functools.partial(tuple.__new__, Record)
_ITERATION_OF = operator.itemgetter(0)


def _column(raw: list[str], handler: _Handler) -> list:
    """One field of many lines, converted as _value does one value: a whole column in a few C passes
    where every value is plain, value by value only in the rare column with a broken one."""
    low = handler.low
    if handler.is_count:
        try:
            counts = list(map(int, raw))  # a plain integer below 2**53 is what int(float(raw)) gives
        except ValueError:
            pass
        else:
            if -_EXACT < min(counts) and max(counts) < _EXACT and (low is None or min(counts) > low):
                return counts
        return [_value(r, handler) for r in raw]
    try:
        values = list(map(float, raw))
    except ValueError:
        return [_value(r, handler) for r in raw]
    if handler.scale != 1.0:
        values = [v * handler.scale for v in values]
    # the sum is finite only if every value is (a sum that overflows sends the column the careful way)
    if math.isfinite(sum(values)) and (low is None or min(values) > low):
        return values
    return [_value(r, handler) for r in raw]


class _Layout:
    """The field sequence of a complete line compiled into one regex over many lines. A log repeats one
    layout, so one findall matches all its lines and their numbers are converted a column at a time
    (the parse speed goal). Every line is matched from its first "iteration" (as _megatron_record reads
    it), so a line of this layout gets exactly the record the field-by-field reading would give it."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        self.handlers = [h for h in map(_handler, keys) if h is not None]
        # [ \t], never \s: a match must not run on into the next line
        parts = [rf"[ \t]*{re.escape(k)}[ \t]*:[ \t]*{f'({_VALUE})' if _handler(k) else _VALUE}[ \t]*\|" for k in keys]
        # a line of another shape matches the second branch and gives a row of empty strings: one row per line
        self.regex = re.compile(r"^(?:iteration[ \t]+(\d{1,18})[ \t]*/[ \t]*(\d{1,18})[ \t]*\|" + "".join(parts)
                                + r"[ \t]*$|[^\n]*)", re.M)

    @staticmethod
    def fits(keys: list[str]) -> bool:
        names = [h.name for h in map(_handler, keys) if h is not None]
        return 0 < len(keys) <= _LAYOUT_FIELDS and len(set(names)) == len(names)

    def records(self, lines: list[str]) -> tuple[list, list[int]]:
        """For each line its record (None where its time is no measurement), or _UNMATCHED where the line
        has another shape; and the positions of those."""
        rows = self.regex.findall("\n".join(lines))
        if len(rows) != len(lines):  # cannot happen with lines that each start with "iteration"; be safe
            return [_UNMATCHED] * len(lines), list(range(len(lines)))
        width = len(rows[0])
        misses = rows.count(("",) * width)
        if misses == len(rows):
            return [_UNMATCHED] * len(lines), list(range(len(lines)))
        good = [row for row in rows if row[0]] if misses else rows
        # one flat list of every captured string, read a column at a time by slicing: all in C
        flat, empty = list(chain.from_iterable(good)), [None] * len(good)
        by_name = {handler.name: _column(flat[k::width], handler) for k, handler in enumerate(self.handlers, 2)}
        seconds = by_name.get("seconds", empty)
        values = zip(map(int, flat[0::width]), map(int, flat[1::width]), seconds,
                     *(by_name.get(name, empty) for name in _ORDER), strict=False)
        made = list(map(_MAKE_RECORD, values))
        if None in seconds:
            made = [record if record[2] is not None else None for record in made]
        if not misses:
            return made, []
        found = iter(made)
        out = [next(found) if row[0] else _UNMATCHED for row in rows]
        return out, [k for k, row in enumerate(rows) if not row[0]]


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


class _MegatronScan:
    """The Megatron records of a log fed a block of whole lines at a time. For each iteration the first
    line in the log's order that gives a record counts, so the result does not depend on where the blocks
    were cut. Lines identical from their first "iteration" on (several ranks printing one iteration) are
    read once."""

    def __init__(self) -> None:
        self.seen: dict[int, Record] = {}
        self.layouts: list[_Layout] = []
        self.keys: list[str] = []
        self.line = ""

    def feed(self, text: str, start: int, end: int) -> None:
        lines = list(dict.fromkeys(_SUFFIX.findall(text, start, end)))
        if not lines:
            return
        results = self._resolve(lines)
        found = list(filter(None, results))
        if not found:
            return
        first = not self.seen
        self.add(found)
        if first:
            at = next(k for k, record in enumerate(results) if record is found[0])
            self.keys = _megatron_record(lines[at], True)[1]
            self.line = next(line for line in text[start:end].split("\n")
                             if line[line.find("iteration"):] == lines[at])

    def add(self, records: list[Record]) -> None:
        """Records in the log's order, where no earlier line gave their iteration one: the first of each
        iteration (reversed, a later one is overwritten by an earlier one) where `seen` has none. All in C,
        no Python step per record."""
        block = dict(zip(map(_ITERATION_OF, reversed(records)), reversed(records), strict=True))
        new = list(filterfalse(self.seen.__contains__, block))
        self.seen.update(zip(new, map(block.__getitem__, new), strict=True))

    def finish(self, torn: str) -> None:
        at = torn.find("iteration")
        if at < 0:
            return
        record, keys, _ = _megatron_record(torn[at:], False)
        if record is not None and record.iteration not in self.seen:
            if not self.seen:
                self.keys, self.line = keys, torn
            self.seen[record.iteration] = record

    def found(self) -> bool:
        return bool(self.seen)

    def result(self) -> tuple[list[Record], str | None]:
        records = [self.seen[i] for i in sorted(self.seen)]
        return records, (_megatron_variant(set(self.keys), self.line) if records else None)

    def _resolve(self, lines: list[str]) -> list:
        """Each line's record (None where it gives none): through the compiled layouts where a line has
        one, field by field otherwise, compiling the layout of a shape that many lines share."""
        if self.layouts:
            results, pending = self.layouts[0].records(lines)
        else:
            results, pending = [_UNMATCHED] * len(lines), list(range(len(lines)))
        for layout in self.layouts[1:]:
            if not pending:
                break
            pending = self._through(layout, lines, pending, results)
        done = 0
        while done < len(pending):
            at = pending[done]
            done += 1
            record, keys, whole = _megatron_record(lines[at], True)
            results[at] = record
            if record is not None and whole and len(pending) - done >= _NEW_LAYOUT_LINES and self._new_layout(keys):
                pending = pending[:done] + self._through(self.layouts[-1], lines, pending[done:], results)
        return results

    @staticmethod
    def _through(layout: _Layout, lines: list[str], pending: list[int], results: list) -> list[int]:
        """Resolve the pending lines that have this layout; the positions still pending."""
        out, misses = layout.records([lines[at] for at in pending])
        for at, record in zip(pending, out, strict=True):
            results[at] = record
        return [pending[k] for k in misses]

    def _new_layout(self, keys: list[str]) -> bool:
        if len(self.layouts) >= _LAYOUTS or not _Layout.fits(keys) or any(keys == lay.keys for lay in self.layouts):
            return False
        self.layouts.append(_Layout(keys))
        return True


# --- NxD Training progress bars ----------------------------------------------------------------------

# A bar up to its speed; [^\S\n]: white space within the line. The elapsed-time part holds no `[`: bars
# nested in it would each be matched again over the same postfix.
_BAR = re.compile(r"Epoch[^\S\n]+\d+:[^\S\n]*\d+%\|[^|\n]*\|[^\S\n]*(\d{1,18})/(\d{1,18})[^\S\n]*\[[^,\[\]\n]*,"
                  r"[^\S\n]*([0-9.]+)(s/it|it/s)")
# One `, key=value` of the postfix after the speed, read one at a time up to the closing `]`: a repeated
# group in one pattern keeps a backtracking record per repetition (memory in proportion to the line).
_POSTFIX = re.compile(r",[^\S\n]*([A-Za-z_][\w.]*)=([^,\]\n]*)")


class _NxdtScan:
    """Progress-bar updates; a redraw refines the same step, so the last one of each step counts."""

    def __init__(self) -> None:
        self.latest: dict[int, tuple[Record, float | None]] = {}

    def feed(self, text: str, start: int, end: int) -> None:
        if text.find("Epoch", start, end) < 0:
            return
        at = start
        while match := _BAR.search(text, at, end):
            post, close = {}, match.end()
            while item := _POSTFIX.match(text, close, end):
                post[item.group(1)] = _number(item.group(2))
                close = item.end()
            if close >= end or text[close] != "]":
                at = match.start() + 1  # no closing `]`: not a bar; one may start further on
                continue
            at = close + 1
            self._bar(match, post)

    def _bar(self, match: re.Match, post: dict[str, float | None]) -> None:
        rate = _number(match.group(3))
        if not rate:
            return
        seconds = rate if match.group(4) == "s/it" else 1.0 / rate
        if not math.isfinite(seconds) or seconds <= MIN_SECONDS:
            return
        step = post.get("global_step")
        iteration = int(step) if step is not None and 0 <= step < MAX_COUNT else int(match.group(1))
        loss = post.get("reduced_train_loss", post.get("loss"))
        throughput = post.get("throughput")
        record = Record(iteration, int(match.group(2)), seconds, loss=loss, learning_rate=post.get("lr"),
                        samples_per_s=throughput if throughput and throughput > 0 else None)
        consumed = post.get("consumed_samples")
        self.latest[iteration] = (record, consumed if consumed is not None and 0 <= consumed < MAX_COUNT else None)

    def finish(self, torn: str) -> None:
        self.feed(torn, 0, len(torn))  # a bar is whole only with its closing `]`

    def found(self) -> bool:
        return bool(self.latest)

    def result(self) -> tuple[list[Record], str | None]:
        latest = self.latest
        steps = sorted(latest)
        deltas = [(latest[b][1] - latest[a][1]) / (b - a) for a, b in zip(steps, steps[1:], strict=False)
                  if latest[a][1] is not None and latest[b][1] is not None and latest[b][1] > latest[a][1]]
        gbs = int(round(statistics.median(deltas))) if deltas else None
        records = []
        for step in steps:
            record, consumed = latest[step]
            samples = (record.samples_per_s if record.samples_per_s is not None or not gbs
                       else gbs / record.iteration_time_s)
            records.append(record._replace(global_batch_size=gbs, samples_per_s=samples,
                                           consumed_samples=_count(consumed)))
        return records, ("nxdt" if records else None)


# --- Hugging Face BERT on Neuron ---------------------------------------------------------------------

#: each line from its first "LOG ": the record is the first complete tail after it (a pattern with a
#: lazy gap after every "LOG " would scan the rest of the line once per "LOG ")
_LOG = re.compile(r"LOG [^\n]*")
_BERT = re.compile(r"- \((\d{1,18}), (\d{1,18})\) step_loss : (\S+)\s+learning_rate : (\S+)\s+"
                   r"throughput : ([0-9.eE+-]+)")


class _HfBertScan:
    def __init__(self) -> None:
        self.seen: dict[int, Record] = {}

    def feed(self, text: str, start: int, end: int) -> None:
        if text.find("LOG ", start, end) < 0:
            return
        for line in _LOG.findall(text, start, end):
            match = _BERT.search(line, 4)
            if match is None:
                continue
            throughput = _number(match.group(5))
            if throughput is None or throughput <= 0:
                continue
            step = int(match.group(2))
            self.seen.setdefault(step, Record(step, None, None, loss=_number(match.group(3)),
                                              learning_rate=_number(match.group(4)), samples_per_s=throughput))

    def finish(self, torn: str) -> None:
        """A last line without its line break is not read: its throughput may have lost digits."""

    def found(self) -> bool:
        return bool(self.seen)

    def result(self) -> tuple[list[Record], str | None]:
        records = [self.seen[i] for i in sorted(self.seen)]
        return records, ("hf-bert" if records else None)


# --- detection and the public entry points -----------------------------------------------------------

_PARSERS = {"megatron": _MegatronScan, "nxdt": _NxdtScan, "hf-bert": _HfBertScan}
#: the names `--format` accepts: the three parsers and the Megatron variants (which select the Megatron parser)
LOG_FORMATS = ("megatron", "megatron-jupiter", "megatron-current", "megatron-deepspeed", "neuron-megatron",
           "nlp-bench", "nxdt", "hf-bert")


@dataclass
class Parsed:
    format: str | None
    records: list[Record]
    #: lines longer than MAX_LINE characters, not read (a log is cut into lines at `\n` and `\r`)
    skipped_long_lines: int = 0


def _parsers(fmt: str | None) -> list[str]:
    """The parsers to run for a format (all of them, in detection order, for None)."""
    if fmt is None:
        return list(_PARSERS)
    if fmt not in LOG_FORMATS:
        raise ParseError(f"unknown log format {fmt!r}; formats: {', '.join(LOG_FORMATS)}")
    return ["megatron" if fmt not in _PARSERS else fmt]


def _read(pieces: Iterable[str], names: list[str], limit: int | None = None) -> tuple[list, int]:
    """The named parsers' scans of a text given in pieces, all fed in one pass, and the count of lines
    skipped for being longer than `limit` (default MAX_LINE)."""
    scans = [_PARSERS[name]() for name in names]
    lines = _Lines(MAX_LINE if limit is None else limit)
    feeding = scans
    for piece in pieces:
        for text, start, end in lines.feed(piece.replace("\r", "\n")):
            for scan in feeding:
                scan.feed(text, start, end)
            # detection takes the first format with records: those after it cannot win, and need not read on
            winner = next((k for k, scan in enumerate(feeding) if scan.found()), len(feeding))
            feeding = feeding[:winner + 1]
    torn = lines.finish()
    if torn:
        for scan in feeding:
            scan.finish(torn)
    return scans, lines.skipped


def _result(scans: list, skipped: int, fmt: str | None) -> Parsed:
    """The first scan with records (detection order), or NoRecords."""
    for scan in scans:
        records, found = scan.result()
        if records:
            return Parsed(found if fmt is None or fmt in _PARSERS else fmt, records, skipped)
    note = f"; skipped {skipped:,} line(s) longer than {MAX_LINE:,} characters" if skipped else ""
    if fmt is not None:
        raise NoRecords(f"no {fmt} iteration records in the log{note}")
    raise NoRecords("no iteration records in the log (formats tried: " + ", ".join(_PARSERS) + ")" + note)


def _scan(pieces: Iterable[str], fmt: str | None) -> Parsed:
    """Records of a text given in pieces (see parse)."""
    return _result(*_read(pieces, _parsers(fmt)), fmt)


@_collector_paused()
def parse(text: str, fmt: str | None = None) -> Parsed:
    """Records of a log in the given format, or in the format the text shows (the one yielding records,
    Megatron first). Raises ParseError when there are none."""
    return _scan(_text_pieces(text, CHUNK_BYTES), fmt)


def parse_text(text: str) -> list[Record]:
    """All iteration records of a log, in iteration order, each iteration once ([] when there are none)."""
    try:
        return parse(text).records
    except NoRecords:
        return []


def read_log(path: Path) -> str:
    """A log's whole text, for callers that search it for more than records (parse_log reads a log for its
    records in bounded memory); bytes that are not UTF-8 (a torn multi-byte character) become U+FFFD."""
    with _opened(path) as fh:
        return fh.read().decode("utf-8", errors="replace")


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[IO[bytes]]:
    """A log opened for reading; what goes wrong reading it is one line."""
    try:
        fh = Path(path).open("rb")
    except FileNotFoundError:
        raise ParseError(f"log not found: {path}") from None
    except IsADirectoryError:
        raise ParseError(f"{path} is a folder, not a log") from None
    except OSError as exc:
        raise ParseError(f"cannot read {path}: {exc.strerror}") from None
    with fh:
        try:
            yield fh
        except OSError as exc:
            raise ParseError(f"cannot read {path}: {exc.strerror}") from None


#: Log files at least this large are parsed in byte ranges by forked workers, one per core (up to 8),
#: each streaming its own range.
PARALLEL_BYTES = 32_000_000


@_collector_paused()
def _read_range(task: tuple[str, int, int, list[str], int]) -> tuple:
    """What the parsers found in one byte range of a file (which starts just after a line break), in a
    form that crosses the pipe fast: the Megatron records as columns."""
    path, start, end, names, chunk_bytes = task
    with _opened(Path(path)) as fh:
        fh.seek(start)
        scans, skipped = _read(_file_pieces(fh, chunk_bytes, end), names)
    found = {}
    for name, scan in zip(names, scans, strict=True):
        if name == "megatron":
            records = [scan.seen[i] for i in sorted(scan.seen)]
            found[name] = ([list(column) for column in zip(*records, strict=False)], scan.keys, scan.line)
        else:
            found[name] = scan.latest if name == "nxdt" else scan.seen
    return found, skipped


def _cuts(path: Path, size: int, workers: int) -> list[int]:
    """Byte offsets that split a file into ranges, each just after a line break so no line is split; where
    the first MiB past a split point holds no line break there is no cut."""
    cuts = [0]
    with _opened(path) as fh:
        for k in range(1, workers):
            fh.seek(size * k // workers)
            window = fh.read(1 << 20)
            breaks = [b for b in (window.find(b"\n"), window.find(b"\r")) if b >= 0]
            if breaks and size * k // workers + min(breaks) + 1 > cuts[-1]:
                cuts.append(size * k // workers + min(breaks) + 1)
    cuts.append(size)
    return cuts


def _parallel(path: Path, names: list[str], chunk_bytes: int) -> tuple[list, int] | None:
    """The scans of a large file read in byte ranges by forked workers, merged as one pass would have left
    them (an earlier range's line comes first); None where the file is small or there is one core."""
    try:
        size = path.stat().st_size
    except OSError:
        return None
    workers = min(os.cpu_count() or 1, 8, size // PARALLEL_BYTES)
    if workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return None
    cuts = _cuts(path, size, workers)
    with ProcessPoolExecutor(len(cuts) - 1, mp_context=multiprocessing.get_context("fork")) as pool:
        parts = list(pool.map(_read_range, [(str(path), a, b, names, chunk_bytes)
                                            for a, b in zip(cuts, cuts[1:], strict=False)]))
    scans = [_PARSERS[name]() for name in names]
    for found, _ in parts:
        for name, scan in zip(names, scans, strict=True):
            if name == "megatron":
                columns, keys, line = found[name]
                if columns and not scan.seen:
                    scan.keys, scan.line = keys, line
                scan.add(list(map(_MAKE_RECORD, zip(*columns, strict=True))))
            elif name == "nxdt":
                scan.latest.update(found[name])  # a later redraw of a step replaces an earlier one
            else:
                for step, record in found[name].items():
                    scan.seen.setdefault(step, record)
    return scans, sum(skipped for _, skipped in parts)


@_collector_paused()
def parse_log(path: Path, fmt: str | None = None, chunk_bytes: int = CHUNK_BYTES) -> Parsed:
    """parse() for a log file, read `chunk_bytes` at a time: its text is never held whole, only its
    records. A large log is read in byte ranges by parallel workers."""
    path = Path(path)
    names = _parsers(fmt)
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, not {chunk_bytes}")
    found = _parallel(path, names, chunk_bytes)
    if found is None:
        with _opened(path) as fh:
            found = _read(_file_pieces(fh, chunk_bytes), names)
    return _result(*found, fmt)


def parse_file(path: Path) -> list[Record]:
    """All iteration records of a log file ([] when there are none)."""
    try:
        return parse_log(path).records
    except NoRecords:
        return []
