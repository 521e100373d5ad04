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
from nlp_bench.analysis.log_record import Record, count, number, positive

_LINE = re.compile(r"Training epoch (\d{1,9}), iteration (\d{1,18})/(\d{1,18})([^\n]*)")
_TIMER = "train_step_timing in s"


class Nemo2Scan(ItemScan):
    NAME = "nemo2"
    KINDS = (("Training epoch ", _LINE, "step"),)

    def step(self, match: re.Match) -> Record | None:
        fields = {}
        for part in match.group(4).split(" | ")[1:]:
            key, _, raw = part.partition(": ")
            fields[key.strip()] = number(raw.strip())
        seconds = positive(fields.get(_TIMER))
        if seconds is None:
            if _TIMER in fields:
                self.warnings[f"NeMo line with an unreadable {_TIMER!r}"] += 1
            return None
        step = fields.get("global_step")
        iteration = count(step) if step is not None and step >= 0 else int(match.group(2))
        tflops = fields.get("TFLOPS_per_GPU", fields.get("tflops_per_sec_per_gpu"))
        return Record(iteration, None, seconds, global_batch_size=count(positive(fields.get("global_batch_size"))),
                      consumed_samples=count(fields.get("consumed_samples")), learning_rate=fields.get("lr"),
                      loss=fields.get("reduced_train_loss", fields.get("train_loss")), tflops_per_gpu=positive(tflops))

    def records(self, items: list[Record]) -> list[Record]:
        return first_of_each(items)
