"""PyTorch-Lightning's tqdm progress bars, as NxD Training, NeMo 1.x and BioNeMo print them, redrawn with
carriage returns: `Epoch 0:   4%|▍   | 4/91 [21:20<7:44:18, 320.22s/it, loss=4.47, reduced_train_loss=5.47,
lr=7.5e-9, global_step=3.000, consumed_samples=4096.0]`.

A step's time is read from the bar's clock, not its rate: tqdm's rate is the elapsed time over the steps
since the bar began (Lightning draws it without smoothing), so it carries the slow first steps, and it is
printed with as little as one significant digit (`0.02it/s`). The clock (`21:20`, whole seconds) between
two redraws of the same bar at different steps is the time those steps took; an interval spans steps until
the clock has moved CLOCK_SPAN_S, so its one-second resolution costs at most 1/CLOCK_SPAN_S of the figure
(a slower step is an interval of its own). Where the postfix holds the framework's own step timer
(NeMo's `train_step_timing in s`), that is the time; the rate only where the bar prints no clock.

Records are keyed by the bar's own step counter (continued across epochs), never by the postfix's
`global_step=`, which tqdm rounds for display (`3.1e+4`). Only the training bar (`Epoch N`) makes records:
a validation, sanity-check, test or predict bar never overwrites a step, and the training redraw after a
validation starts a new interval (the clock ran on through the validation). Lightning 1.x also advances
the training bar during validation (its total counts the validation batches): those redraws are skipped
and the count of validation batches taken off the steps after.
"""

from __future__ import annotations

import re
import statistics
from typing import NamedTuple

from nlp_bench.analysis.log_record import MAX_COUNT, MIN_SECONDS, Record, Warnings, count, number

#: seconds of the bar's clock an interval spans at least (the clock shows whole seconds)
CLOCK_SPAN_S = 10
_TRAIN = "Epoch"
# One redraw up to its rate; [^\S\n]: white space within the line. The bar's name is a training epoch or
# one of Lightning's other loops (bounded: no name is longer). The elapsed-time part holds no `[`: bars
# nested in it would each be matched again over the same postfix.
_BAR = re.compile(r"(Epoch[^\S\n]+\d{1,9}|Validation[^:|\n]{0,40}|Validating|Sanity Checking[^:|\n]{0,40}"
                  r"|Testing[^:|\n]{0,40}|Predicting[^:|\n]{0,40}):(?:[^\S\n]*:)?[^\S\n]*\d{1,3}%\|[^|\n]*\|[^\S\n]*"
                  r"(\d{1,18})/(\d{1,18})[^\S\n]*\[([^,\[\]\n<]*)(?:<[^,\[\]\n]*)?"
                  r"(?:,[^\S\n]*(?:([0-9.]+)(s/it|it/s)|\?it/s))?")
# One `, key=value` of the postfix after the rate, read one at a time up to the closing `]`: a repeated
# group in one pattern keeps a backtracking record per repetition (memory in proportion to the line).
# A key may hold spaces (NeMo's `train_step_timing in s`).
_POSTFIX = re.compile(r",[^\S\n]*([A-Za-z_][^=,\]\n]{0,80})=([^,\]\n]*)")
#: the framework's own step timer, where a postfix shows it
_TIMERS = ("train_step_timing in s", "train_step_timing")
_CLOCK = re.compile(r"[^\S\n]*(?:(\d{1,9}):)?(\d{1,2}):(\d\d)[^\S\n]*")


class _Redraw(NamedTuple):
    bar: str  # "Epoch 3", "Validation DataLoader 0", ...
    n: int
    total: int
    clock_s: int | None  # the bar's elapsed clock
    rate_s: float | None  # seconds per step from the displayed rate
    postfix: dict


def _clock(text: str) -> int | None:
    match = _CLOCK.fullmatch(text)
    if match is None:
        return None
    hours, minutes, seconds = match.groups()
    return (int(hours or 0) * 60 + int(minutes)) * 60 + int(seconds)


def _rate(value: str | None, unit: str | None) -> float | None:
    rate = number(value) if value else None
    if not rate:
        return None
    seconds = rate if unit == "s/it" else 1.0 / rate
    return seconds if seconds > MIN_SECONDS else None


class ProgressBarScan:
    def __init__(self) -> None:
        self.redraws: list[_Redraw] = []
        self.warnings = Warnings()

    def feed(self, text: str, start: int, end: int) -> None:
        if text.find("%|", start, end) < 0:
            return
        at = start
        while match := _BAR.search(text, at, end):
            post, close = {}, match.end()
            while item := _POSTFIX.match(text, close, end):
                post[item.group(1).strip()] = number(item.group(2))
                close = item.end()
            if close >= end or text[close] != "]":  # (NeMo 1.21+ draws no rate: its postfix follows the clock)
                at = match.start() + 1  # no closing `]`: not a bar; one may start further on
                continue
            at = close + 1
            n, total = int(match.group(2)), int(match.group(3))
            self.redraws.append(_Redraw(" ".join(match.group(1).split()), n, total, _clock(match.group(4)),
                                        _rate(match.group(5), match.group(6)), post))

    def finish(self, torn: str) -> None:
        self.feed(torn, 0, len(torn))  # a bar is whole only with its closing `]`

    def found(self) -> bool:
        return any(r.bar.startswith(_TRAIN) for r in self.redraws)

    def part(self) -> tuple[list[_Redraw], Warnings]:
        return self.redraws, self.warnings

    def join(self, part: tuple[list[_Redraw], Warnings]) -> None:
        self.redraws.extend(part[0])
        self.warnings.update(part[1])

    def result(self) -> tuple[list[Record], str | None]:
        steps = _Steps(self.warnings)
        for redraw in self.redraws:
            steps.add(redraw)
        records = steps.records()
        if not records:
            return [], None
        timed_by_framework = any(t in steps.last_postfix for t in _TIMERS)
        return records, ("nemo1" if timed_by_framework else "nxdt")


class _Step(NamedTuple):
    iteration: int
    total: int
    clock_s: int | None  # the clock when the bar first showed this step
    rate_s: float | None
    postfix: dict  # the last redraw's: a postfix is redrawn at a step once its metrics are in
    begin: int | None  # the first step of a bar: the iteration at which its clock read 0
    fresh: bool  # the first step after a validation: the clock ran on through it, no interval ends here


class _Steps:
    """The training bar's steps in the log's order, with the bookkeeping of epochs and validations."""

    def __init__(self, warnings: Warnings) -> None:
        self.warnings = warnings
        self.steps: list[_Step] = []
        self.bar = ""  # the training bar being drawn
        self.offset = 0  # steps of the epochs before this bar
        self.shift = 0  # validation batches the training bar counted (Lightning 1.x)
        self.last_n = 0  # the training bar's last step
        self.validation: _Redraw | None = None  # the last redraw of a validation bar since the last step
        self.during = 0  # the training bar's furthest step while validating
        self.fresh = False
        self.begin: int | None = None
        self.last_postfix: dict = {}

    def add(self, redraw: _Redraw) -> None:
        if not redraw.bar.startswith(_TRAIN):
            if self.last_n > 0:
                self.validation = redraw  # a loop of its own after training began: it interrupts the clock
            return
        if redraw.bar != self.bar or redraw.n < self.last_n:  # a new epoch (or the bar was reset)
            self.offset += self.last_n - self.shift
            self.bar, self.shift, self.last_n, self.validation, self.fresh = redraw.bar, 0, 0, None, False
            self.begin = self.offset
        if self.validation is not None:
            # still validating (Lightning 1.x draws the training bar on, counting the validation batches),
            # unless the training bar shows new training metrics
            if self.validation.n < self.validation.total and redraw.postfix == self.last_postfix:
                self.during = max(self.during, redraw.n)
                return
            batches = self.validation.total
            if self.during > self.last_n or redraw.n - self.last_n > batches:  # the bar counted them
                self.shift += batches
                self.last_n += batches
            self.validation, self.during, self.fresh = None, 0, True
        self.last_postfix = redraw.postfix
        if redraw.n == self.last_n and self.begin is None:
            self.steps[-1] = self.steps[-1]._replace(postfix=redraw.postfix)  # the same step, its metrics redrawn
            return
        if redraw.n <= self.last_n:
            return
        self.last_n = redraw.n
        self.steps.append(_Step(self.offset + redraw.n - self.shift, redraw.total, redraw.clock_s, redraw.rate_s,
                                redraw.postfix, self.begin, self.fresh))
        self.begin, self.fresh = None, False

    def records(self) -> list[Record]:
        timed = self._timed()
        gbs = self._batch(timed)
        records = {}
        for step, seconds in timed:
            post = step.postfix
            loss = post.get("reduced_train_loss", post.get("loss"))
            throughput = post.get("throughput")
            samples = throughput if throughput and throughput > 0 else (gbs / seconds if gbs else None)
            records[step.iteration] = Record(
                step.iteration, step.total, seconds, global_batch_size=gbs, loss=loss, learning_rate=post.get("lr"),
                samples_per_s=samples, consumed_samples=_count(post.get("consumed_samples")))
        return [records[i] for i in sorted(records)]

    def _timed(self) -> list[tuple[_Step, float]]:
        """Each step that ends an interval, with the seconds per step over it."""
        out = []
        anchor: tuple[int, int] | None = None  # (iteration, clock) where the current interval began
        for step in self.steps:
            timer = next((step.postfix[t] for t in _TIMERS if step.postfix.get(t)), None)
            if timer is not None and timer > MIN_SECONDS:
                out.append((step, timer))
                anchor = None
                continue
            if step.clock_s is None:
                if step.rate_s is not None:
                    out.append((step, step.rate_s))
                    self.warnings["steps timed by the bar's rate (no clock): a mean since the bar began, "
                                  "to its printed digits"] += 1
                continue
            if step.begin is not None:
                anchor = (step.begin, 0)
            elif step.fresh or anchor is None:  # after a validation: the clock ran on through it
                anchor = (step.iteration, step.clock_s)
                continue
            steps, seconds = step.iteration - anchor[0], step.clock_s - anchor[1]
            if seconds >= CLOCK_SPAN_S and steps > 0:
                out.append((step, seconds / steps))
                anchor = (step.iteration, step.clock_s)
            elif seconds < 0:
                anchor = (step.iteration, step.clock_s)
        return out

    @staticmethod
    def _batch(timed: list[tuple[_Step, float]]) -> int | None:
        """The global batch: printed, or the median of consumed samples per step between intervals."""
        printed = [s.postfix.get("global_batch_size") for s, _ in timed if s.postfix.get("global_batch_size")]
        if printed:
            return _count(printed[-1])
        points = [(s.iteration, s.postfix.get("consumed_samples")) for s, _ in timed]
        points = [(i, c) for i, c in points if c is not None and 0 <= c < MAX_COUNT]
        deltas = [(c2 - c1) / (i2 - i1) for (i1, c1), (i2, c2) in zip(points, points[1:], strict=False)
                  if i2 > i1 and c2 > c1]
        return int(round(statistics.median(deltas))) if deltas else None


def _count(value: float | None) -> int | None:
    return count(value) if value is not None and value >= 0 else None
