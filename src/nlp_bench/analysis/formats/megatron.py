"""Megatron-shaped iteration lines, one parser for all their variants: this project's trainer (`nlp-bench`),
JUPITER-patched Megatron-LM with torchrun `[defaultN]:` prefixes, seconds, samples/s and TFLOPs
(`megatron-jupiter`), older Megatron in milliseconds (`megatron`; its 2019 releases print `lm loss 1.0E+01`
without a colon), current Megatron-LM with a timestamp and `throughput per GPU (TFLOP/s/GPU)`
(`megatron-current`), Megatron-DeepSpeed with `consumed tokens` (`megatron-deepspeed`), and the AWS Neuron
reference with a trailing `throughput:` in sequences/s (`neuron-megatron`). Mixture-of-experts runs of
Megatron-LM and Megatron-Bridge add their auxiliary losses beside `lm loss` (`load_balancing_loss: 1.0E+00 |`,
`z_loss: ... |`, `mtp_1 loss: ... |`), which become record fields.

A value is only trusted when its field is closed by `|`: every variant ends its line with one, except the
Neuron reference, whose last field is `throughput:`. A line whose last field runs into the line's end
otherwise was cut (a killed job, two ranks' output glued together): it is dropped and counted.
"""

from __future__ import annotations

import functools
import math
import operator
import re
from itertools import chain, filterfalse
from typing import NamedTuple

from nlp_bench.analysis.formats import register_format
from nlp_bench.analysis.log_record import MAX_LINE, MIN_SECONDS, Record, Warnings, count, number

MEGATRON = "megatron"

# at most 18 digits: int() of a longer run is refused by Python (and slow); no log counts that far
_ITERATION = re.compile(r"iteration\s+(\d{1,18})\s*/\s*(\d{1,18})\s*\|([^\n\r]*)")
#: the text of each line from its first "iteration" on: the part that decides its record
_SUFFIX = re.compile(r"iteration[^\n]*")
#: NeMo 2's `Training epoch 0, iteration 45/99 | ...` is a format of its own, never a Megatron line (a
#: lookbehind in _SUFFIX would cost its literal search: a quarter of the parse speed)
_NEMO = re.compile(r"epoch \d{1,9}, (iteration[^\n]*)")
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
    "actual seqlen": ("seq_length", int),  # Megatron-DeepSpeed
    # mixture-of-experts runs (Megatron-LM core_v0.20.0 and Megatron-Bridge print each tracked aux loss
    # beside `lm loss`, `{:.6E}`; the per-layer values go to TensorBoard only)
    "load_balancing_loss": ("load_balancing_loss", float),
    "seq_load_balancing_loss": ("seq_load_balancing_loss", float),
    "global_load_balancing_loss": ("global_load_balancing_loss", float),
    "z_loss": ("z_loss", float),
    "mtp_1 loss": ("mtp_loss", float),
}
#: Megatron's argument dump at start (`  seq_length ...................... 2048`): the sequence length
#: its iteration lines never print
_ARGUMENT_SEQ = re.compile(r"\bseq_length \.{2,200} (\d{1,9})\b")
#: this project's trainer says it in its layout line at start (`nlp-bench trainer: world 4 = ..., sequence 128;`)
_TRAINER_SEQ = re.compile(r"nlp-bench trainer: world \d{1,9} = [^\n]{0,300}?, sequence (\d{1,9});")
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
    value = number(raw)
    if value is None:
        return None
    value *= handler.scale
    if handler.low is not None and value <= handler.low:
        return None
    return count(value) if handler.is_count else value


#: the longest start of a key's text that ends with a character a key cannot hold (letters, spaces, / ( ) -)
_KEY_END = re.compile(r".*[^A-Za-z /()\-]", re.S)
_LETTER = re.compile(r"[A-Za-z]")
#: a key that is a Python name (`load_balancing_loss`, `mtp_1 loss`: the loss names MoE runs print), read
#: whole where the key rule above would keep only what follows its last `_`
_NAME_KEY = re.compile(r"(?:^|[ \t])([A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+(?: loss)?)[ \t]*$")
_VALUE_CHARS = "-+0123456789.eEinfa"
_KEY_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz /()-_"
#: the Neuron reference's last field, which no `|` closes
_OPEN_LAST = "throughput"
#: a Warnings reason: a record's last field ran into the end of its line
CUT = "cut line: its last field not closed by `|` (dropped)"


def _is_a_number(raw: str) -> bool:
    """Whether a value is a number a log may print (nan, inf, a number), as against a broken one (`--`)."""
    try:
        float(raw)
    except ValueError:
        return False
    return True


def _looks_numeric(raw: str) -> bool:
    return bool(raw) and not raw.strip(_VALUE_CHARS)


def _field_start(segment: str) -> str | None:
    """The key of a field a line's end cut off (`lm lo`, `lm loss:`, `lm loss: 8.`, `lm loss 8.`), or None
    where the text after the last `|` is no field (spaces, another program's words)."""
    text = segment.strip()
    if not text or not text[0].isascii() or not text[0].isalpha():
        return None
    key, colon, raw = text.partition(":")
    if colon:
        raw = raw.strip()
        return key.rstrip() if not key.strip(_KEY_CHARS) and (not raw or _looks_numeric(raw)) else None
    if not text.strip(_KEY_CHARS):
        return text
    words = text.rsplit(None, 1)
    return words[0] if _handler(words[0]) is not None and _looks_numeric(words[1]) else None


def _field(segment: str) -> tuple[str, str] | None:
    """The key and raw value of one field between two `|`, or None. `key: value`: the key is the longest
    run of key characters before the last colon that starts with a letter, the value all that follows the
    colon, spaces aside. Megatron's 2019 releases wrote some fields without a colon (`lm loss 1.0E+01`):
    read as `key value` where the key is one the parser knows."""
    colon = segment.rfind(":")
    if colon < 0:
        words = segment.strip().rsplit(None, 1)
        return (words[0], words[1]) if len(words) == 2 and _handler(words[0]) is not None else None
    raw = segment[colon + 1:].strip()
    if "/" in raw:  # AMD Primus prints `this interval/the run's mean` (`2701.3/2712.7`): the interval's
        now, _, mean = raw.partition("/")
        raw = now if _looks_numeric(now) and _looks_numeric(mean) else raw
    body = segment[:colon].rstrip()
    if "_" in body and (name := _NAME_KEY.search(body)):
        return name.group(1), raw
    end = _KEY_END.match(body)
    letter = _LETTER.search(body, end.end() if end else 0)
    return (body[letter.start():], raw) if letter else None


def _megatron_fields(rest: str, terminated: bool) -> tuple[dict, list[str], bool, str | None]:
    """The fields of a line after its iteration header, the keys in order, whether every field was closed,
    and what is wrong with the line (None, CUT, or a field the parser knows but cannot read). Split at
    `|`, each stretch read once: a search for `key: value` pairs anywhere in the text would restart at every
    position of a long run of letters or spaces."""
    fields: dict = {}
    keys = []
    whole, problem = True, None
    segments = rest.split("|")
    last = len(segments) - 1
    for at, segment in enumerate(segments):
        found = _field(segment)
        if at == last and (cut := _field_start(segment)) is not None:
            if cut != _OPEN_LAST:
                return fields, keys, False, CUT
            if not terminated:
                whole = False
                continue  # the open last field of a line cut off at the end of the log: its digits may be gone
        if found is None:
            continue
        key, raw = found
        handler = _handler(key)
        if not _looks_numeric(raw):
            if handler is not None:
                problem = f"unreadable {key!r} field (left empty)"
            continue
        keys.append(key)
        whole = whole and at < last
        if handler is not None:
            value = _value(raw, handler)
            if value is not None:
                fields[handler.name] = value
            elif not _is_a_number(raw):
                problem = f"unreadable {key!r} field (left empty)"
    return fields, keys, whole, problem


def _megatron_record(text: str, terminated: bool) -> tuple[Record | None, list[str], bool, str | None]:
    """The record of one line (or None), its field keys, whether all its fields were closed, and what is
    wrong with it (see _megatron_fields)."""
    match = _ITERATION.search(text)
    if match is None:
        return None, [], False, None
    fields, keys, whole, problem = _megatron_fields(match.group(3), terminated)
    if problem == CUT:
        return None, keys, False, problem
    seconds = fields.pop("seconds", None)
    record = None if seconds is None else Record(int(match.group(1)), int(match.group(2)), seconds, **fields)
    return record, keys, whole, problem


def parse_line(line: str, terminated: bool = False) -> Record | None:
    """The record in one Megatron iteration line, or None. `terminated`: the line ended with a newline,
    so a last field not closed by `|` (the Neuron reference's `throughput:`) is whole."""
    if len(line) > MAX_LINE:
        return None
    return _megatron_record(line, terminated)[0]


#: a number as a compiled layout reads it (after its sign, a digit, a point or nan/inf's letters): `--` and
#: the like go field by field, where an unreadable value is a warning. Character classes only: an
#: alternation here costs a tenth of the parse speed
_VALUE = "[-+]?[0-9.naif][-+0-9.eEinfa]*"
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


def _column(raw: list[str], handler: _Handler) -> tuple[list, list[int]]:
    """One field of many lines, converted as _value does one value: a whole column in a few C passes
    where every value is plain, value by value only in the rare column with a broken one; and the lines
    whose value is unreadable (the field-by-field reading warns of them)."""
    low = handler.low
    if handler.is_count:
        try:
            counts = list(map(int, raw))  # a plain integer below 2**53 is what int(float(raw)) gives
        except ValueError:
            pass
        else:
            if -_EXACT < min(counts) and max(counts) < _EXACT and (low is None or min(counts) > low):
                return counts, []
        return _careful(raw, handler)
    try:
        values = list(map(float, raw))
    except ValueError:
        return _careful(raw, handler)
    if handler.scale != 1.0:
        values = [v * handler.scale for v in values]
    # the sum is finite only if every value is (a sum that overflows sends the column the careful way)
    if math.isfinite(sum(values)) and (low is None or min(values) > low):
        return values, []
    return _careful(raw, handler)


def _careful(raw: list[str], handler: _Handler) -> tuple[list, list[int]]:
    values = [_value(r, handler) for r in raw]
    return values, [k for k, (v, r) in enumerate(zip(values, raw, strict=True)) if v is None and not _is_a_number(r)]


class _Layout:
    """The field sequence of a complete line compiled into one regex over many lines. A log repeats one
    layout, so one findall matches all its lines and their numbers are converted a column at a time
    (the parse speed goal). Every line is matched from its first "iteration" (as _megatron_record reads
    it), so a line of this layout gets exactly the record the field-by-field reading would give it."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        self.handlers = [h for h in map(_handler, keys) if h is not None]
        # [ \t], never \s: a match must not run on into the next line
        # a known key may come without its colon (Megatron 2019), as _field reads it: then a space, at least,
        # parts it from its value
        parts = [rf"[ \t]*{re.escape(k)}(?:[ \t]*:[ \t]*|[ \t]+)({_VALUE})[ \t]*\|" if _handler(k)
                 else rf"[ \t]*{re.escape(k)}[ \t]*:[ \t]*{_VALUE}[ \t]*\|" for k in keys]
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
        by_name, unreadable = {}, set()
        for k, handler in enumerate(self.handlers, 2):
            by_name[handler.name], broken = _column(flat[k::width], handler)
            unreadable.update(broken)
        seconds = by_name.get("seconds", empty)
        values = zip(map(int, flat[0::width]), map(int, flat[1::width]), seconds,
                     *(by_name.get(name, empty) for name in _ORDER), strict=False)
        made = list(map(_MAKE_RECORD, values))
        if None in seconds:
            made = [record if record[2] is not None else None for record in made]
        if unreadable:  # read field by field, which counts the warning
            made = [_UNMATCHED if k in unreadable else record for k, record in enumerate(made)]
        elif not misses:
            return made, []
        found = iter(made)
        out = [next(found) if row[0] else _UNMATCHED for row in rows]
        return out, [k for k, record in enumerate(out) if record is _UNMATCHED]


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


@register_format(10, ("megatron-jupiter", "megatron-current", "megatron-deepspeed", "neuron-megatron", "nlp-bench"))
class MegatronScan:
    """The Megatron records of a log fed a block of whole lines at a time. For each iteration the first
    line in the log's order that gives a record counts, so the result does not depend on where the blocks
    were cut. Lines identical from their first "iteration" on (several ranks printing one iteration) are
    read once."""

    NAME = MEGATRON

    def __init__(self) -> None:
        self.seen: dict[int, Record] = {}
        self.layouts: list[_Layout] = []
        self.keys: list[str] = []
        self.line = ""
        self.warnings = Warnings()
        self.seq_length: int | None = None  # from the argument dump

    def feed(self, text: str, start: int, end: int) -> None:
        if self.seq_length is None and text.find("seq_length .", start, end) >= 0:
            found = _ARGUMENT_SEQ.search(text, start, end)
            self.seq_length = int(found.group(1)) if found else None
        if self.seq_length is None and text.find("nlp-bench trainer: world ", start, end) >= 0:
            found = _TRAINER_SEQ.search(text, start, end)
            self.seq_length = int(found.group(1)) if found else None
        lines = list(dict.fromkeys(_SUFFIX.findall(text, start, end)))
        if lines and text.find(", iteration", start, end) >= 0:
            theirs = set(_NEMO.findall(text, start, end))
            lines = [line for line in lines if line not in theirs]
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
        found = _SUFFIX.search(torn)
        if found is None or _NEMO.search(torn):
            return
        record, keys, _, problem = _megatron_record(found.group(0), False)
        if problem:
            self.warnings[problem] += 1
        if record is not None and record.iteration not in self.seen:
            if not self.seen:
                self.keys, self.line = keys, torn
            self.seen[record.iteration] = record

    def found(self) -> bool:
        return bool(self.seen)

    def result(self) -> tuple[list[Record], str | None]:
        records = [self.seen[i] for i in sorted(self.seen)]
        if self.seq_length and records and records[0].seq_length is None:
            records = [r._replace(seq_length=self.seq_length) if r.seq_length is None else r for r in records]
        return records, (_megatron_variant(set(self.keys), self.line) if records else None)

    def part(self) -> tuple:
        """What this scan of one byte range found, in a form that crosses a pipe fast: records as columns."""
        records = [self.seen[i] for i in sorted(self.seen)]
        return ([list(column) for column in zip(*records, strict=False)], self.keys, self.line, self.warnings,
                self.seq_length)

    def join(self, part: tuple) -> None:
        """Add the part of the next byte range, as one pass over both ranges would have found it."""
        columns, keys, line, warnings, seq_length = part
        self.seq_length = self.seq_length or seq_length
        if columns and not self.seen:
            self.keys, self.line = keys, line
        self.add(list(map(_MAKE_RECORD, zip(*columns, strict=True))))
        self.warnings.update(warnings)

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
            record, keys, whole, problem = _megatron_record(lines[at], True)
            if problem:
                self.warnings[problem] += 1
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

