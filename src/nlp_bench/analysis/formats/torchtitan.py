"""torchtitan's metrics line, printed at step 1 and every `log_freq` steps (colours stripped; the
`[rankN]:` and `[titan] <time> - root - INFO -` prefixes are optional):

    step: 10  loss: 10.7069  grad_norm:  1.2345  memory: 30.99GiB(32.62%)  tps: 7,034  tflops: 407.35  mfu: 41.19%

(2024 releases print `wps` for `tps` and no `tflops` or `grad_norm`; main prints `mfu: N/A` under FP8.)
`tps` is tokens per second per device over the window since the last line; torchtitan prints no step time.
The start-up lines say the rest: the global batch and sequence length (`Trainer is initialized with ...`,
`Training starts at step 1, with ...`), the world size (`Building N-D device mesh with [...], [4, 2]`,
or `Building device mesh with parallelism: pp=1, dp_replicate=1, dp_shard=8, cp=1, tp=1, ep=1`). With them
the job's tokens/s is tps x world size and a step takes one batch's tokens over that; without the batch, a
step's time is the log's timestamps apart over the steps between two lines.
"""

from __future__ import annotations

import math
import re
from datetime import datetime

from nlp_bench.analysis.formats.item_scan import ANSI, ItemScan, first_of_each, line_start
from nlp_bench.analysis.log_record import MIN_SECONDS, Record, count, number

_STEP = re.compile(r"step:[ \t]*(\d{1,18})[ \t]+loss:[ \t]*(\S+)[ \t]+(?:grad_norm:[ \t]*(\S+)[ \t]+)?"
                   r"memory:[ \t]*[\d.]+GiB\([\d.]+%\)[ \t]+[tw]ps:[ \t]*([\d,]{1,30})"
                   r"(?:[ \t]+tflops:[ \t]*([\d,.]{1,30}))?(?:[ \t]+mfu:[ \t]*(?:([\d.]{1,20})%|N/A))?")
_COLOURED = re.compile(r"step:[^\n]*")
_STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) - ")
_INIT = re.compile(r"(?:Trainer is initialized with|Training starts at step)[^\n]*")
_BATCH = re.compile(r"global batch size:? (\d{1,18})")
_SEQUENCE = re.compile(r"sequence length:? (\d{1,18})")
_TOKENS = re.compile(r"(\d{1,18}) tokens per train step")
_CONTEXT = re.compile(r"maximum context length (\d{1,18})")
_MESH = re.compile(r"Building (?:\d-D device mesh with \[[^\]\n]{0,200}\], \[([\d, ]{1,100})\]"
                   r"|device mesh with parallelism: ([^\n]{0,200}))")
_DEGREE = re.compile(r"\b(pp|dp_replicate|dp_shard|cp|tp)=(\d{1,9})")


class _Setup:
    """What the start-up lines said."""

    def __init__(self, kind: str, **values: int) -> None:
        self.kind, self.values = kind, values


class TorchtitanScan(ItemScan):
    NAME = "torchtitan"
    KINDS = (("step:", _COLOURED, "step"), ("Train", _INIT, "init"), ("device mesh with", _MESH, "mesh"))

    def step(self, match: re.Match) -> tuple | None:
        line = ANSI.sub("", match.group(0)) if "\x1b" in match.group(0) else match.group(0)
        found = _STEP.match(line)
        if found is None:
            return None
        text = match.string
        begin = line_start(text, match.start())
        stamp = _STAMP.search(text, begin, match.start())
        seconds = None
        if stamp is not None:
            try:
                when = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S")
                seconds = when.timestamp() + int(stamp.group(2)) / 1000
            except ValueError:
                seconds = None
        tps = number(found.group(4).replace(",", ""))
        tflops = number(found.group(5).replace(",", "")) if found.group(5) else None
        record = Record(int(found.group(1)), None, None, loss=number(found.group(2)),
                        grad_norm=number(found.group(3)) if found.group(3) else None,
                        tflops_per_gpu=tflops, mfu_percent=number(found.group(6)) if found.group(6) else None)
        return record, tps, seconds

    def init(self, match: re.Match) -> _Setup | None:
        line = match.group(0)
        batch, seq = _BATCH.search(line), _SEQUENCE.search(line) or _CONTEXT.search(line)
        tokens = _TOKENS.search(line)
        values = {}
        if batch:
            values["batch"] = int(batch.group(1))
        if seq:
            values["seq"] = int(seq.group(1))
        if tokens:
            values["tokens"] = int(tokens.group(1))
        return _Setup("init", **values) if values else None

    def mesh(self, match: re.Match) -> _Setup | None:
        if match.group(1):
            dims = [int(d) for d in match.group(1).replace(" ", "").split(",") if d]
        else:
            dims = [int(d) for _, d in _DEGREE.findall(match.group(2))]
        return _Setup("mesh", world=math.prod(dims)) if dims else None

    def found(self) -> bool:
        return any(isinstance(item, tuple) for item in self.items)

    def records(self, items: list) -> list[Record]:
        setup: dict = {}
        out, previous = [], None
        for item in items:
            if isinstance(item, _Setup):
                setup.update(item.values)
                continue
            record, tps, stamp = item
            if previous is not None and record.iteration == previous[0]:
                continue  # another rank's copy of the step: the first counts
            world, seq = setup.get("world"), setup.get("seq")
            batch_tokens = setup.get("tokens") or (setup["batch"] * seq if setup.get("batch") and seq else None)
            total = tps * world if tps and world else None
            seconds = None
            if total and batch_tokens:
                seconds = batch_tokens / total
            elif previous is not None and stamp is not None and previous[1] is not None \
                    and record.iteration > previous[0] and stamp - previous[1] > MIN_SECONDS:
                seconds = (stamp - previous[1]) / (record.iteration - previous[0])
            previous = (record.iteration, stamp)
            gbs = setup.get("batch") or (batch_tokens // seq if batch_tokens and seq else None)
            out.append(record._replace(iteration_time_s=seconds, tokens_per_s=total, global_batch_size=count(gbs),
                                       seq_length=seq))
        if out and not setup.get("world"):
            self.warnings["the log names no world size (device mesh): tokens/s is torchtitan's per device"] += 1
        return [r for r in first_of_each(out) if r.iteration_time_s or r.tokens_per_s]
