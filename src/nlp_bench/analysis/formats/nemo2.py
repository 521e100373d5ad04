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

import re

from nlp_bench.analysis.formats.item_scan import ItemScan, first_of_each
from nlp_bench.analysis.log_record import STEP_TIMERS, Record, Warnings, count, number, positive

_LINE = re.compile(r"Training epoch \d{1,9}, iteration (\d{1,18})/\d{1,18}([^\n]*)")
_TIMER = STEP_TIMERS[0]
#: one ` | name: value` field (a name may hold spaces; a value holds no `|`)
_FIELD = re.compile(r"\| ([^:|\n]{1,200}): ([^|\n]*)")


class Nemo2Scan(ItemScan):
    NAME = "nemo2"
    STEP = ("Training epoch ", _LINE)

    def records(self, rows: list[tuple[str, str]], warnings: Warnings) -> list[Record]:
        out = []
        for iteration, rest in rows:
            fields = dict(_FIELD.findall(rest))
            seconds = positive(number(fields.get(_TIMER, "")))
            if seconds is None:
                if _TIMER in fields:
                    warnings[f"NeMo line with an unreadable {_TIMER!r}"] += 1
                continue
            get = fields.get
            step = number(get("global_step", ""))
            key = count(step)
            out.append(Record(int(iteration) if key is None else key, None, seconds,
                              count(positive(number(get("global_batch_size", "")))),
                              count(number(get("consumed_samples", ""))), number(get("lr", "")),
                              number(get("reduced_train_loss") or get("train_loss", "")),
                              tflops_per_gpu=positive(number(get("TFLOPS_per_GPU") or get("tflops_per_sec_per_gpu", "")))))
        return first_of_each(out)
