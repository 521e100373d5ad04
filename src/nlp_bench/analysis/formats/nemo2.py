"""NeMo 2.0's text progress (`ProgressPrinter`, NeMo-Run recipes), one line per logged step:

    Training epoch 0, iteration 45/99 | lr: 1.5e-05 | global_batch_size: 128 | global_step: 45 |
    reduced_train_loss: 7.012 | train_step_timing in s: 47.12 | consumed_samples: 5888

Fields are `name: value` after ` | `, in the order the metrics were first logged (it differs between
releases and on a resumed run, so they are read by name). `iteration` is 0-based and restarts each epoch;
`global_step` counts across the run and keys the records. The time is NeMo's own step timer
(`train_step_timing in s`, the last step's wall time); the FLOPs are `TFLOPS_per_GPU` (2.3 on) or
`tflops_per_sec_per_gpu` (2.2). The global batch is in the line; the sequence length is not.
"""

from __future__ import annotations

import math
import re
from itertools import repeat

from nlp_bench.analysis.formats import register_format
from nlp_bench.analysis.formats.item_scan import MAKE_RECORD, ItemScan, first_of_each
from nlp_bench.analysis.log_record import MAX_COUNT, MIN_SECONDS, STEP_TIMERS, Record, Warnings, count, number, positive

_LINE = re.compile(r"Training epoch \d{1,9}, iteration (\d{1,18})/\d{1,18}([^\n]*)")
_TIMER = STEP_TIMERS[0]
#: one ` | name: value` field (a name may hold spaces; a value holds no `|`)
_FIELD = re.compile(r"\| ([^:|\n]{1,200}): ([^|\n]*)")


#: the fields a record is made of, in Record's order after its first three
_WANTED = ("global_batch_size", "consumed_samples", "lr", "reduced_train_loss", "train_loss", "TFLOPS_per_GPU",
           "tflops_per_sec_per_gpu")
_ORDERS = 4  # field orders compiled (NeMo's changes at step 0 and on a resumed run)
_NEW_ORDER_ROWS = 16  # rows of another order that make it worth compiling theirs


@register_format(50)
class Nemo2Scan(ItemScan):
    NAME = "nemo2"
    LOCAL = True
    STEP = ("Training epoch ", _LINE)

    def records(self, rows: list[tuple[str, str]], warnings: Warnings) -> list[Record]:
        """Rows of one field order are read by one compiled pattern and converted a column at a time (the
        parse speed goal); the others one by one."""
        out: list[Record] = []
        pending = rows
        for _ in range(_ORDERS):
            if len(pending) < _NEW_ORDER_ROWS and pending is not rows:
                break
            keys = [key for key, _ in _FIELD.findall(pending[0][1])]
            if _TIMER not in keys or len(set(keys)) != len(keys):
                break
            made, pending = _FieldOrder(keys).read(pending)
            out += made
            if not pending:
                break
        out += [record for record in map(lambda row: _one(row, warnings), pending) if record is not None]
        return first_of_each(out, warnings)


def _one(row: tuple[str, str], warnings: Warnings) -> Record | None:
    iteration, rest = row
    fields = dict(_FIELD.findall(rest))
    seconds = positive(number(fields.get(_TIMER, "")))
    if seconds is None:
        if _TIMER in fields:
            warnings[f"NeMo line with an unreadable {_TIMER!r}"] += 1
        return None
    get = fields.get
    key = count(number(get("global_step", "")))
    return Record(int(iteration) if key is None else key, None, seconds,
                  count(positive(number(get("global_batch_size", "")))), count(number(get("consumed_samples", ""))),
                  number(get("lr", "")), number(get("reduced_train_loss") or get("train_loss", "")),
                  tflops_per_gpu=positive(number(get("TFLOPS_per_GPU") or get("tflops_per_sec_per_gpu", ""))))


class _FieldOrder:
    """One field order compiled: the rows that have it read by one findall over them all, their numbers
    converted a column at a time; a column with a value that is no plain number goes value by value."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        self.regex = re.compile("^" + "".join(rf" ?\| {re.escape(k)}: ([^|\n]*)" for k in keys) + "$|^[^\n]*$", re.M)

    def read(self, rows: list[tuple[str, str]]) -> tuple[list[Record], list[tuple[str, str]]]:
        found = self.regex.findall("\n".join(rest for _, rest in rows))
        if len(found) != len(rows):  # a rest holding a line break cannot happen; be safe
            return [], rows
        if len(self.keys) == 1:
            found = [(value,) for value in found]
        timer = self.keys.index(_TIMER)
        hit = [k for k, groups in enumerate(found) if groups[timer]]  # a row of another order matched nothing
        if not hit:
            return [], rows
        misses = [rows[k] for k, groups in enumerate(found) if not groups[timer]]
        columns = dict(zip(self.keys, zip(*(found[k] for k in hit), strict=True), strict=True))
        empty = (None,) * len(hit)

        def numbers(key: str, *others: str) -> list | tuple:
            for name in (key, *others):
                if name in columns:
                    return _column(columns[name])
            return empty

        iterations = _counts(numbers("global_step"))
        if None in iterations:
            iterations = [int(rows[k][0]) if i is None else i for i, k in zip(iterations, hit, strict=True)]
        times = _positives(numbers(_TIMER))
        batch = _counts(_positives(numbers("global_batch_size")))
        consumed = _counts(numbers("consumed_samples"))
        tflops = _positives(numbers("TFLOPS_per_GPU", "tflops_per_sec_per_gpu"))
        nothing = repeat(None)
        # tuple.__new__ keeps no defaults: every field after the TFLOPs is given, however many Record grows
        after_tflops = [nothing] * (len(Record._fields) - Record._fields.index("tflops_per_gpu") - 1)
        rows_out = zip(iterations, nothing, times, batch, consumed, numbers("lr"),
                       numbers("reduced_train_loss", "train_loss"), nothing, nothing, nothing, nothing, nothing, nothing,
                       tflops, *after_tflops, strict=False)
        return [record for record in map(MAKE_RECORD, rows_out) if record[2] is not None], misses


def _column(raw: tuple[str, ...]) -> list[float | None]:
    """A column of values as numbers: all at once where all are plain, else one by one."""
    try:
        values = list(map(float, raw))
    except ValueError:
        return [number(value) for value in raw]
    # the sum is finite only if every value is (a sum that overflows sends the column the careful way)
    return values if math.isfinite(sum(values)) else [number(value) for value in raw]


def _counts(values: list | tuple) -> list | tuple:
    """A column as counts (count() of each), in C where every value is one."""
    if None not in values and values and 0 <= min(values) and max(values) < MAX_COUNT:
        return list(map(int, values))
    return [None if value is None else count(value) for value in values]


def _positives(values: list | tuple) -> list | tuple:
    """A column with positive() of each, untouched where every value already is."""
    if None not in values and values and min(values) > MIN_SECONDS:
        return values
    return [None if value is None else positive(value) for value in values]
