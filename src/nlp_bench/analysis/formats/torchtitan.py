"""torchtitan's metrics line, printed at step 1 and every `log_freq` steps (colours stripped; the
`[rankN]:` and `[titan] <time> - root - INFO -` prefixes are optional):

    step: 10  loss: 10.7069  grad_norm:  1.2345  memory: 30.99GiB(32.62%)  tps: 7,034  tflops: 407.35  mfu: 41.19%

(2024 releases print `wps` for `tps` and no `tflops` or `grad_norm`; main prints `mfu: N/A` under FP8.)
`tps` is tokens per second per device over the window since the last line; torchtitan prints no step time.
The start-up lines say the rest: the global batch and sequence length (`Trainer is initialized with ...`,
`Training starts at step 1, with ...`), the world size (`Building N-D device mesh with [...], [4, 2]`,
or `Building device mesh with parallelism: pp=1, dp_replicate=1, dp_shard=8, cp=1, tp=1, ep=1`). With them
the job's tokens/s is tps x world size and a step takes one batch's tokens over that; without the batch, a
step's time is the log's timestamps apart over the steps between two lines, and the first line of an excerpt
(nothing before it) is a record of its loss, TFLOP/s and MFU with no time. An MoE run prints the same line
(its load-balancing figures go to TensorBoard and W&B only); its mesh's `ep` and `etp` are carved out of
dp_shard and cp, so they are no factor of the world size.
"""

from __future__ import annotations

import datetime
import functools
import math
import re

from nlp_bench.analysis.formats import register_format
from nlp_bench.analysis.formats.item_scan import ANSI, ItemScan, first_of_each
from nlp_bench.analysis.log_record import MIN_SECONDS, Record, Warnings, count, number

_STEP = re.compile(r"step:[ \t]*(\d{1,18})[ \t]+loss:[ \t]*(\S+)[ \t]+(?:grad_norm:[ \t]*(\S+)[ \t]+)?"
                   r"memory:[ \t]*[\d.]+GiB\([\d.]+%\)[ \t]+[tw]ps:[ \t]*([\d,]{1,30})"
                   r"(?:[ \t]+tflops:[ \t]*([\d,.]{1,30}))?(?:[ \t]+mfu:[ \t]*(?:([\d.]{1,20})%|N/A))?")
_STAMP = re.compile(r"(\d{4}-\d\d-\d\d) (\d\d):(\d\d):(\d\d),(\d{3}) - ")
_INIT = re.compile(r"(?:Trainer is initialized with|Training starts at step)[^\n]*")
_BATCH = re.compile(r"global batch size:? (\d{1,18})")
_SEQUENCE = re.compile(r"sequence length:? (\d{1,18})")
_TOKENS = re.compile(r"(\d{1,18}) tokens per train step")
_CONTEXT = re.compile(r"maximum context length (\d{1,18})")
_MESH = re.compile(r"Building (?:\d-D device mesh with \[[^\]\n]{0,200}\], \[([\d, ]{0,100})\]"
                   r"|device mesh with parallelism: ([^\n]{0,200}))")
_DEGREE = re.compile(r"\b(pp|dp_replicate|dp_shard|cp|tp)=(\d{1,9})")


@functools.lru_cache(maxsize=64)
def _day(date: str) -> int | None:
    """Days since year 1 of a log's `YYYY-MM-DD` (strptime costs more than the rest of a line's reading)."""
    try:
        return datetime.date.fromisoformat(date).toordinal()
    except ValueError:
        return None


def _seconds(stamp: tuple[str, ...] | None) -> float | None:
    """A `YYYY-MM-DD HH:MM:SS,mmm` timestamp in seconds."""
    if stamp is None:
        return None
    day = _day(stamp[0])
    hours, minutes, secs = int(stamp[1]), int(stamp[2]), int(stamp[3])
    if day is None or hours > 23 or minutes > 59 or secs > 60:
        return None
    return day * 86400 + hours * 3600 + minutes * 60 + secs + int(stamp[4]) / 1000


@register_format(30)
class TorchtitanScan(ItemScan):
    NAME = "torchtitan"
    STEP = ("step:", _STEP)
    SETUP = (("Train", _INIT, "init"), ("device mesh with", _MESH, "mesh"))
    CLEAN = ANSI

    @staticmethod
    def rows_of(pattern: re.Pattern, text: str, start: int, end: int | None) -> list[tuple]:
        """Each step line's groups and its timestamp (looked for only between the line's start and `step:`)."""
        rows = []
        for match in pattern.finditer(text, start, len(text) if end is None else end):
            stamp = _STAMP.search(text, text.rfind("\n", 0, match.start()) + 1, match.start())
            rows.append((*match.groups(), stamp.groups() if stamp else None))
        return rows

    def init(self, match: re.Match) -> dict[str, int]:
        line, found = match.group(0), {}
        for name, pattern in (("global batch", _BATCH), ("sequence length", _SEQUENCE),
                              ("sequence length", _CONTEXT), ("tokens per step", _TOKENS)):
            value = pattern.search(line)
            if value and name not in found:
                found[name] = int(value.group(1))
        return found

    def mesh(self, match: re.Match) -> dict[str, int]:
        if match.group(2) is None:  # `[8, 2]`; `[]` on one device (math.prod of nothing is 1)
            dims = [int(d) for d in match.group(1).replace(" ", "").split(",") if d]
            return {"world size": math.prod(dims)}
        dims = [int(d) for _, d in _DEGREE.findall(match.group(2))]
        return {"world size": math.prod(dims)} if dims else {}

    def records(self, rows: list[tuple], warnings: Warnings) -> list[Record]:
        world, seq, batch = self.setup.get("world size"), self.setup.get("sequence length"), self.setup.get("global batch")
        batch_tokens = self.setup.get("tokens per step") or (batch * seq if batch and seq else None)
        gbs = batch or (batch_tokens // seq if batch_tokens and seq else None)
        out, previous = [], None
        for step, loss, norm, tps, tflops, mfu, stamp in rows:
            iteration = int(step)
            if previous is not None and iteration == previous[0]:
                continue  # another rank's copy of the step: the first counts
            when = _seconds(stamp)
            rate = number(tps.replace(",", ""))
            total = rate * world if rate and world else None
            seconds = None
            if total and batch_tokens:
                seconds = batch_tokens / total
            elif previous is not None and when is not None and previous[1] is not None \
                    and iteration > previous[0] and when - previous[1] > MIN_SECONDS:
                seconds = (when - previous[1]) / (iteration - previous[0])
            previous = (iteration, when)
            # every step line is a record, timed or not: the first of an excerpt (no earlier step to time
            # it against, no mesh line to scale its tps) still holds its loss, TFLOP/s and MFU
            out.append(Record(iteration, None, seconds, global_batch_size=count(gbs), loss=number(loss),
                              grad_norm=number(norm) if norm else None, tokens_per_s=total,
                              tflops_per_gpu=number(tflops.replace(",", "")) if tflops else None,
                              mfu_percent=number(mfu) if mfu else None, seq_length=seq))
        if rows and not world:
            warnings["torchtitan's tps is per device and the log names no device mesh: steps timed by the "
                     "timestamps, tokens/s only where the batch and sequence length are known"] += len(rows)
        return first_of_each(out, warnings)
