"""The neuronx-distributed (NxD core) training examples' step lines. Two shapes of their own:

    step 12 step_time 4.512s throughput 113.4 seq/s step loss 6.25 grad norm 1.02     (tp_pp Llama; `loss` before 2.26)
    step 12 loss is 6.25, lr is 1.5e-05, throughput 113.4 seq/s,  input_ids ...        (the Lightning examples)

`throughput` is the job's sequences per second, a mean over the last ten steps or fewer; only the first
shape prints a step time. (The tp_zero1 example prints `LOG <time> - (epoch, step) step_loss : ...
throughput : ... seq/s`, which the `hf-bert` parser reads.)
"""

from __future__ import annotations

import re

from nlp_bench.analysis.formats.item_scan import ItemScan, first_of_each
from nlp_bench.analysis.log_record import Record, number, positive

_NUMBER = r"([-+0-9.eEinfa]{1,40})"
_TIMED = re.compile(rf"step (\d{{1,18}}) step_time {_NUMBER}s throughput {_NUMBER} seq/s (?:step )?loss {_NUMBER}"
                    rf"(?: grad norm {_NUMBER})?")
_LIGHTNING = re.compile(rf"step (\d{{1,18}}) loss is {_NUMBER}, lr is {_NUMBER}, throughput {_NUMBER} seq/s")


class NxdCoreScan(ItemScan):
    NAME = "nxd-core"
    KINDS = (("step_time ", _TIMED, "timed"), (" loss is ", _LIGHTNING, "lightning"))

    def timed(self, match: re.Match) -> Record | None:
        seconds = positive(number(match.group(2)))
        if seconds is None:
            self.warnings["NxD step line with an unreadable step_time"] += 1
            return None
        return Record(int(match.group(1)), None, seconds, samples_per_s=positive(number(match.group(3))),
                      loss=number(match.group(4)), grad_norm=number(match.group(5)) if match.group(5) else None)

    def lightning(self, match: re.Match) -> Record | None:
        rate = positive(number(match.group(4)))
        if rate is None:
            return None
        return Record(int(match.group(1)), None, None, loss=number(match.group(2)),
                      learning_rate=number(match.group(3)), samples_per_s=rate)

    def records(self, items: list[Record]) -> list[Record]:
        return first_of_each(items)
