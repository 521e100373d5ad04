"""The Hugging Face BERT pretraining script on Neuron, and NxD's tp_zero1 example: `LOG <ctime> - (epoch,
step) step_loss : 9.1875  learning_rate : 1.56e-05  throughput : 2873.14` (sequences/s, ` seq/s` after it
since Neuron 2.20; the scripts print no step time)."""

from __future__ import annotations

import re
from typing import Any

from nlp_bench.analysis.formats import register_format
from nlp_bench.analysis.formats.item_scan import ItemScan, first_of_each
from nlp_bench.analysis.log_record import Record, Warnings, number

#: each line from its first "LOG ": the record is the first complete tail after it (a pattern with a
#: lazy gap after every "LOG " would scan the rest of the line once per "LOG ")
_LOG = re.compile(r"LOG [^\n]*")
_BERT = re.compile(r"- \((\d{1,18}), (\d{1,18})\) step_loss : (\S+)\s+learning_rate : (\S+)\s+"
                   r"throughput : ([0-9.eE+-]+)")


@register_format(80)
class HfBertScan(ItemScan):
    NAME = "hf-bert"
    LOCAL = True
    STEP = ("LOG ", _LOG)

    @staticmethod
    def rows_of(pattern: re.Pattern, text: str, start: int, end: int | None) -> list[Any]:
        found = (_BERT.search(line, 4) for line in pattern.findall(text, start, len(text) if end is None else end))
        return [match.groups() for match in found if match is not None]

    def records(self, rows: list[Any], warnings: Warnings) -> list[Record]:
        out = []
        for _, step, loss, lr, rate in rows:
            throughput = number(rate)
            if throughput is not None and throughput > 0:
                out.append(Record(int(step), None, None, loss=number(loss), learning_rate=number(lr),
                                  samples_per_s=throughput))
        return first_of_each(out, warnings)
