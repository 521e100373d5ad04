"""PyTorch-Lightning's tqdm progress bars, as NxD Training, NeMo 1.x and BioNeMo print them, redrawn with
carriage returns: `Epoch 0:   4%|▍   | 4/91 [21:20<7:44:18, 320.22s/it, loss=4.47, reduced_train_loss=5.47,
lr=7.5e-9, global_step=3.000, consumed_samples=4096.0]`.

A step's time is read from the bar's clock, not its rate: tqdm's rate is the elapsed time over the steps
since the bar began (Lightning draws it without smoothing), so it carries the slow first steps, and it is
printed with as little as one significant digit (`0.02it/s`). The clock (`21:20`, whole seconds) between
two redraws of the same bar at different steps is the time those steps took: one step whose clock moved
2 s or more is an interval of its own, faster steps make one interval once the clock has moved
CLOCK_SPAN_S (its one-second resolution then costs at most 1/CLOCK_SPAN_S of the figure). Where the postfix
holds the framework's own step timer (NeMo's `train_step_timing in s`), that is the time; the rate only
where the bar prints no clock, or a bar's clock never moved enough to time a step.

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

from nlp_bench.analysis.formats import register_format
from nlp_bench.analysis.log_record import MAX_COUNT, MIN_SECONDS, STEP_TIMERS, Record, Warnings, count, number

#: seconds of the bar's clock an interval of several steps spans at least (the clock shows whole seconds)
CLOCK_SPAN_S = 10
_TRAIN = "Epoch"
# One redraw up to its rate; [^\S\n]: white space within the line. The bar's name is a training epoch or
# one of Lightning's other loops (bounded: no name is longer). The elapsed-time part holds no `[`: bars
# nested in it would each be matched again over the same postfix.
_BAR = re.compile(r"(Epoch[^\S\n]+\d{1,9}|Validation[^:|\n]{0,40}|Validating|Sanity Checking[^:|\n]{0,40}"
                  r"|Testing[^:|\n]{0,40}|Predicting[^:|\n]{0,40}):(?:[^\S\n]*:)?[^\S\n]*\d{1,3}%(?:\|[^|\n]*\|)?[^\S\n]*"
                  r"(\d{1,18})/(\d{1,18}|\?)[^\S\n]*\[([^,\[\]\n<]*)(?:<[^,\[\]\n]*)?"
                  r"(?:,[^\S\n]*(?:([0-9.]+)(s/it|it/s)|\?it/s))?([^\]\n|]{0,4096}+)(\]?)")
# ... and the postfix up to the closing `]`, at most 4096 characters (Lightning's hold a dozen metrics,
# under 400), taken without giving any back, and holding no `|`: a line of bar starts without a `]` costs a
# bounded look each, and a redraw cut short (a terminal's width, a redraw glued to the next) ends where
# the next one begins. The bar itself may be missing (`50% 1/2 [`, tqdm without a terminal), and NeMo
# 1.21+ draws no rate.


def _cut_short(text: str, start: int, end: int) -> list[tuple[str, ...]]:
    """The redraws of a block where some are cut before their `]`: the next redraw may start inside what
    the cut one's postfix took, so the search goes on from there (at most 4096 characters back)."""
    found, at = [], start
    while match := _BAR.search(text, at, end):
        found.append(match.groups(""))
        at = match.end() if match.group(8) else match.start(7) + 1
    return found


def _postfix(body: str) -> dict[str, str]:
    """The `, key=value` items after the rate, raw (numbers are made only of the values used). A key may
    hold spaces (NeMo's `train_step_timing in s`); an item that is none is left out."""
    post = {}
    for item in body.split(",")[1:]:
        key, equals, value = item.partition("=")
        key = key.strip()
        if equals and key and (key[0].isalpha() or key[0] == "_"):
            post[key] = value.strip()
    return post


_BY_RATE = "steps timed by the bar's rate (no clock, or one that never moved): a mean since the bar began, to its printed digits"
_CLOCK = re.compile(r"[^\S\n]*(?:(\d{1,9}):)?(\d{1,2}):(\d\d)[^\S\n]*")

#: one redraw as the pattern reads it: bar name ("Epoch 3", "Validation DataLoader 0"), step, total, the
#: elapsed clock, the rate's number and unit, the postfix (all raw: converted only for the steps kept)
_Redraw = tuple[str, str, str, str, str, str, str]


def _timed(steps: int, seconds: int) -> bool:
    """Whether steps that took these seconds of the clock are an interval: one slow step is one of its own
    (2 s or more: its whole seconds say how slow), several need CLOCK_SPAN_S (a 10% figure at most)."""
    return steps > 0 and (seconds >= CLOCK_SPAN_S or steps == 1 and seconds >= 2)


def _clock(text: str) -> int | None:
    match = _CLOCK.fullmatch(text)
    if match is None:
        return None
    hours, minutes, seconds = match.groups()
    return (int(hours or 0) * 60 + int(minutes)) * 60 + int(seconds)


def _rate(value: str, unit: str) -> float | None:
    rate = number(value) if value else None
    if not rate:
        return None
    seconds = rate if unit == "s/it" else 1.0 / rate
    return seconds if seconds > MIN_SECONDS else None


@register_format(70, ("nxdt", "nemo1"))
class ProgressBarScan:
    NAME = "progress-bar"

    def __init__(self) -> None:
        self.redraws: list[_Redraw] = []
        self.warnings = Warnings()
        self._found = False
        self._result: tuple[list[Record], str | None] | None = None  # made once: it counts its warnings

    def feed(self, text: str, start: int, end: int) -> None:
        if text.find("% ", start, end) < 0 and text.find("%|", start, end) < 0:
            return
        if text.find("#015", start, end) >= 0:  # OpenMPI's tagged output writes a carriage return so
            text, start, end = text[start:end].replace("#015", "\n"), 0, end - start
        found = _BAR.findall(text, start, end)
        if any(not redraw[7] for redraw in found):
            found = _cut_short(text, start, end)
        redraws = self.redraws
        for redraw in found:
            body = redraw[6]
            if body and body[0] != ",":
                continue
            if not redraw[7]:  # cut before its `]`: what was closed counts, if its clock reads
                if _clock(redraw[3]) is None:
                    continue
                body = body[:body.rfind(",")] if "," in body else ""
            if redraws and redraws[-1][:2] == redraw[:2]:
                # the same bar at the same step: its first clock (when the step ended), its last postfix
                redraws[-1] = (*redraws[-1][:6], body)
                continue
            redraws.append((*redraw[:6], body))
            if not self._found and redraw[0].startswith(_TRAIN):
                self._found = _clock(redraw[3]) is not None or bool(redraw[4]) or "timing" in body

    def finish(self, torn: str) -> None:
        self.feed(torn, 0, len(torn))  # as any redraw cut before its `]`: what was closed counts

    def found(self) -> bool:
        return self._found

    def part(self) -> tuple[list[_Redraw], Warnings, bool]:
        return self.redraws, self.warnings, self._found

    def join(self, part: tuple[list[_Redraw], Warnings, bool]) -> None:
        redraws = part[0]
        if self.redraws and redraws and self.redraws[-1][:2] == redraws[0][:2]:  # a step cut by the ranges
            self.redraws[-1] = (*self.redraws[-1][:6], redraws[0][6])
            redraws = redraws[1:]
        self.redraws += redraws
        self.warnings.update(part[1])
        self._found = self._found or part[2]

    def result(self) -> tuple[list[Record], str | None]:
        if self._result is None:
            steps = _Steps(self.warnings)
            for redraw in self.redraws:
                steps.add(*redraw)
            records = steps.records()
            timed_by_framework = any(t in _postfix(steps.last_postfix) for t in STEP_TIMERS)
            self._result = records, (("nemo1" if timed_by_framework else self.NAME) if records else None)
        return self._result


class _Step(NamedTuple):
    iteration: int
    total: int | None
    clock: str  # the clock when the bar first showed this step (raw)
    rate: tuple[str, str]
    postfix: str  # the last redraw's (raw): a postfix is redrawn at a step once its metrics are in
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
        self.validation: tuple[int, int] | None = None  # (step, total) of the last validation redraw since the last step
        self.during = 0  # the training bar's furthest step while validating
        self.fresh = False
        self.begin: int | None = None
        self.last_postfix = ""
        self.counts_validation = False  # the training bar advances through validation batches (Lightning 1.x)

    def add(self, bar: str, n_text: str, total_text: str, clock: str, rate: str, unit: str, postfix: str) -> None:
        n = int(n_text)
        if not bar.startswith(_TRAIN):
            if self.last_n > 0 or "anity" not in bar:  # a sanity check before training interrupts nothing
                self.validation = (n, _total(total_text))  # a loop of its own: the clock runs on through it
            return
        if bar != self.bar or n < self.last_n:  # a new epoch (or the bar was reset)
            self.offset += self.last_n - self.shift
            validating = self.validation if not self.bar else None  # a log that begins inside a validation
            self.bar, self.shift, self.last_n, self.validation, self.fresh = bar, 0, 0, validating, False
            self.begin = self.offset
        if self.validation is not None:
            done, batches = self.validation
            batches = done if batches is None else batches  # no total: no way to tell it unfinished
            moved = postfix == self.last_postfix and n > self.last_n and (done < batches or n - self.last_n >= batches)
            if moved or not self.last_n and done < batches:
                # the training bar moved with no new training metrics: it counts the validation batches
                # (Lightning 1.x; a log that begins inside a validation shows no metrics to compare)
                self.counts_validation = self.counts_validation or moved
                self.during = max(self.during, n)
                return
            if self.counts_validation or self.during > self.last_n:
                self.shift += batches
                self.last_n = max(self.last_n + batches, self.during)
            self.validation, self.during, self.fresh = None, 0, True
        self.last_postfix = postfix
        if n == self.last_n and self.begin is None:
            self.steps[-1] = self.steps[-1]._replace(postfix=postfix)  # the same step, its metrics redrawn
            return
        if n <= self.last_n:
            return
        self.last_n = n
        self.steps.append(_Step(self.offset + n - self.shift, _total(total_text), clock, (rate, unit), postfix,
                                self.begin, self.fresh))
        self.begin, self.fresh = None, False

    def records(self) -> list[Record]:
        timed = self._timed()
        gbs = self._batch(timed)
        records = {}
        for step, post, seconds in timed:
            loss = _get(post, "reduced_train_loss", "loss")
            throughput = _get(post, "throughput")
            samples = throughput if throughput and throughput > 0 else (gbs / seconds if gbs else None)
            records[step.iteration] = Record(
                step.iteration, step.total, seconds, global_batch_size=gbs, loss=loss, learning_rate=_get(post, "lr"),
                samples_per_s=samples, consumed_samples=count(_get(post, "consumed_samples")))
        return [records[i] for i in sorted(records)]

    def _timed(self) -> list[tuple[_Step, dict[str, str], float]]:
        """Each step that ends an interval, its postfix, and the seconds per step over the interval."""
        out: list[tuple[_Step, dict[str, str], float]] = []
        anchor: tuple[int, int] | None = None  # (iteration, clock) where the open interval began
        pending: tuple[_Step, dict[str, str], int] | None = None  # the open interval's last step, and its clock
        last: tuple[_Step, dict[str, str]] | None = None  # the bar's last step with a clock
        made = 0  # records of the bar so far

        def close() -> None:
            """The bar ended (or the log did): its open interval is one more if it is long enough to time
            (as any other); a bar that has no interval so (its steps all within a few seconds of the clock)
            is timed by its last rate."""
            if pending is not None and anchor is not None and _timed(pending[0].iteration - anchor[0],
                                                                     pending[2] - anchor[1]):
                out.append((pending[0], pending[1], (pending[2] - anchor[1]) / (pending[0].iteration - anchor[0])))
            elif not made and last is not None and (rate := _rate(*last[0].rate)) is not None:
                out.append((last[0], last[1], rate))
                self.warnings[_BY_RATE] += 1

        for at, step in enumerate(self.steps):
            if step.begin is not None:
                close()
                anchor, pending, last, made = (step.begin, 0), None, None, 0
                if not self._from_start(step, self.steps[at + 1] if at + 1 < len(self.steps) else None):
                    anchor = None  # a bar that starts at a late step (a resumed run): its clock began there
            post = _postfix(step.postfix)
            timer = _get(post, *STEP_TIMERS)
            if timer is not None and timer > MIN_SECONDS:
                out.append((step, post, timer))
                anchor, pending, made = None, None, made + 1
                continue
            clock = _clock(step.clock)
            if clock is None:
                rate = _rate(*step.rate)
                if rate is not None:
                    out.append((step, post, rate))
                    made += 1
                    self.warnings[_BY_RATE] += 1
                continue
            last = (step, post)
            if step.fresh or anchor is None or clock < anchor[1]:  # after a validation, or a clock set back
                anchor, pending = (step.iteration, clock), None
                continue
            steps, seconds = step.iteration - anchor[0], clock - anchor[1]
            if _timed(steps, seconds):
                out.append((step, post, seconds / steps))
                anchor, pending, made = (step.iteration, clock), None, made + 1
            else:
                pending = (step, post, clock)
        close()
        return out

    @staticmethod
    def _from_start(step: _Step, after: _Step | None) -> bool:
        """Whether a bar's first step is timed from the bar's start: its mean since then (warm-up in it) is not
        far below the step after it. A resumed run's bar starts at a late step with its clock at zero."""
        clock = _clock(step.clock)
        if clock is None or after is None or after.begin is not None or (later := _clock(after.clock)) is None:
            return True
        since_start = clock / max(step.iteration - (step.begin or 0), 1)
        return later <= clock or since_start >= (later - clock) / (after.iteration - step.iteration) / 2

    @staticmethod
    def _batch(timed: list[tuple[_Step, dict[str, str], float]]) -> int | None:
        """The global batch: printed, or the median of consumed samples per global step (where the
        postfix shows global_step to the unit: tqdm rounds it to three digits past 999) or per bar step."""
        printed = [value for _, post, _ in timed if (value := _get(post, "global_batch_size"))]
        if printed:
            return count(printed[-1])
        for counter in ("global_step", None):
            points = [(_get(post, counter) if counter else s.iteration, _get(post, "consumed_samples"))
                      for s, post, _ in timed if counter is None or "e" not in post.get(counter, "e")]
            points = [(i, c) for i, c in points if i is not None and c is not None and 0 <= c < MAX_COUNT]
            deltas = [(c2 - c1) / (i2 - i1) for (i1, c1), (i2, c2) in zip(points, points[1:], strict=False)
                      if i2 > i1 and c2 > c1]
            if deltas:
                return int(round(statistics.median(deltas)))
        return None


def _get(post: dict[str, str], *keys: str) -> float | None:
    """The first of `keys` the postfix shows, as a number (None where none reads as one)."""
    for key in keys:
        value = number(post[key]) if key in post else None
        if value is not None:
            return value
    return None


def _total(text: str) -> int | None:
    """A bar's total: `?` where the loader has no length."""
    return int(text) if text.isdigit() else None


