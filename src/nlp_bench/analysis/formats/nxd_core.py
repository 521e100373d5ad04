"""The neuronx-distributed (NxD core) training examples' step lines. Two shapes of their own:

    step 12 step_time 4.512s throughput 113.4 seq/s step loss 6.25 grad norm 1.02     (tp_pp Llama; `loss` before 2.26)
    step 12 loss is 6.25, lr is 1.5e-05, throughput 113.4 seq/s,  input_ids ...        (the Lightning examples)

`throughput` is the job's sequences per second, a mean over the last ten steps or fewer; only the first
shape prints a step time. (The tp_zero1 example prints `LOG <time> - (epoch, step) step_loss : ...
throughput : ... seq/s`, which the `hf-bert` parser reads.)
"""

from __future__ import annotations

import re

from nlp_bench.analysis.formats import register_format
from nlp_bench.analysis.formats.item_scan import ItemScan, first_of_each
from nlp_bench.analysis.log_record import Record, Warnings, number, positive

_N = r"([-+0-9.eEinfa]{1,40})"
_STEP = re.compile(rf"step (\d{{1,18}}) (?:step_time {_N}s throughput {_N} seq/s (?:step )?loss {_N}(?: grad norm {_N})?"
                   rf"|loss is {_N}, lr is {_N}, throughput {_N} seq/s)")


@register_format(60)
class NxdCoreScan(ItemScan):
    NAME = "nxd-core"
    LOCAL = True
    STEP = ("step ", _STEP)

    def records(self, rows: list[tuple[str, ...]], warnings: Warnings) -> list[Record]:
        out = []
        for step, seconds, rate, loss, norm, loss_is, lr, rate_is in rows:
            if seconds:
                time = positive(number(seconds))
                if time is None:
                    warnings["NxD step line with an unreadable step_time"] += 1
                    continue
                out.append(Record(int(step), None, time, samples_per_s=positive(number(rate)), loss=number(loss),
                                  grad_norm=number(norm) if norm else None))
            elif (throughput := positive(number(rate_is))) is not None:
                out.append(Record(int(step), None, None, loss=number(loss_is), learning_rate=number(lr),
                                  samples_per_s=throughput))
        return first_of_each(out, warnings)
