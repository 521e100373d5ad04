"""The Hugging Face BERT pretraining script on Neuron: `LOG <ctime> - (epoch, step) step_loss : 9.1875
learning_rate : 1.56e-05  throughput : 2873.14` (sequences/s; the script prints no step time)."""

from __future__ import annotations

import re

from nlp_bench.analysis.formats.item_scan import ItemScan, first_of_each
from nlp_bench.analysis.log_record import Record, number

#: each line from its first "LOG ": the record is the first complete tail after it (a pattern with a
#: lazy gap after every "LOG " would scan the rest of the line once per "LOG ")
_LOG = re.compile(r"LOG [^\n]*")
_BERT = re.compile(r"- \((\d{1,18}), (\d{1,18})\) step_loss : (\S+)\s+learning_rate : (\S+)\s+"
                   r"throughput : ([0-9.eE+-]+)")


class HfBertScan(ItemScan):
    NAME = "hf-bert"
    KINDS = (("LOG ", _LOG, "item"),)

    def item(self, match: re.Match) -> Record | None:
        found = _BERT.search(match.group(0), 4)
        if found is None:
            return None
        throughput = number(found.group(5))
        if throughput is None or throughput <= 0:
            return None
        return Record(int(found.group(2)), None, None, loss=number(found.group(3)),
                      learning_rate=number(found.group(4)), samples_per_s=throughput)

    def records(self, items: list[Record]) -> list[Record]:
        return first_of_each(items)
