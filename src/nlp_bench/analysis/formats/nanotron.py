"""nanotron's step line, one per iteration from the last pipeline stage (after a logging prefix such as
`01/17/2024 13:47:27 [INFO|DP=0|PP=0|TP=0|node]: `, dimmed with ANSI codes since 2025):

    iteration: 12 / 1000 | consumed_tokens: 25.2G | elapsed_time_per_iteration_ms: 28.2K | tokens_per_sec: 74.5K
    | tokens_per_sec_per_gpu: 2.33K | global_batch_size: 1.02K | lm_loss: 2.3 | lr: 0.000289 | model_tflops_per_gpu: 26.7 | ...

Every number is rounded to three significant digits with a K/M/G(B)/T suffix. Until March 2025 the time is
`elapsed_time_per_iteration_ms` and `global_batch_size` counts samples; since, `time_per_iteration_ms` and
`global_batch_size` counts tokens. `tokens_per_sec` is the job's. The start-up line (`... | sequence_length:
2048 | global_batch_size: 512 | ...`, exact integers) gives the sequence length and the batch in samples.
"""

from __future__ import annotations

import re

from nlp_bench.analysis.formats.item_scan import SUFFIXES, ItemScan, first_of_each
from nlp_bench.analysis.log_record import Record, count, number, positive

_STEP = re.compile(r"iteration: (\d{1,18}) / (\d{1,18})[ \t]*\|([^\n]*)")
_START = re.compile(r"mbs: \d{1,18} \| grad_accum: [^\n]*")
_SEQUENCE = re.compile(r"sequence_length: (\d{1,18})")
_SAMPLES = re.compile(r"global_batch_size: (\d{1,18})(?: |$)")
_HUMAN = re.compile(r"(-?[0-9.]+(?:e[-+]?\d+)?)([KMGBTPE]?)")


def human(raw: str) -> float | None:
    """A value nanotron's human_format wrote (`28.2K`, `1e-05`, `480B`)."""
    match = _HUMAN.fullmatch(raw.strip())
    if match is None:
        return None
    value = number(match.group(1))
    return None if value is None else value * SUFFIXES[match.group(2)]


class NanotronScan(ItemScan):
    NAME = "nanotron"
    KINDS = (("iteration: ", _STEP, "step"), ("grad_accum: ", _START, "start"))

    def step(self, match: re.Match) -> tuple | None:
        fields = {}
        for part in match.group(3).split("|"):
            key, _, raw = part.partition(": ")
            fields[key.strip()] = raw
        new = "time_per_iteration_ms" in fields
        ms = human(fields.get("time_per_iteration_ms") or fields.get("elapsed_time_per_iteration_ms") or "")
        if ms is None:
            if fields:
                self.warnings["nanotron line without a readable time per iteration"] += 1
            return None
        get = {key: human(raw) for key, raw in fields.items() if key != "eta"}
        record = Record(int(match.group(1)), int(match.group(2)), positive(ms / 1000),
                        loss=get.get("lm_loss"), learning_rate=get.get("lr"), grad_norm=get.get("grad_norm"),
                        tokens_per_s=positive(get.get("tokens_per_sec")),
                        tflops_per_gpu=positive(get.get("model_tflops_per_gpu")))
        return record, get.get("global_batch_size"), new

    def start(self, match: re.Match) -> dict | None:
        seq, samples = _SEQUENCE.search(match.group(0)), _SAMPLES.search(match.group(0))
        found = {"seq": int(seq.group(1))} if seq else {}
        if samples:
            found["samples"] = int(samples.group(1))
        return found or None

    def found(self) -> bool:
        return any(isinstance(item, tuple) and item[0].iteration_time_s for item in self.items)

    def records(self, items: list) -> list[Record]:
        setup: dict = {}
        out = []
        for item in items:
            if isinstance(item, dict):
                setup.update(item)
                continue
            record, batch, tokens_counted = item
            if record.iteration_time_s is None:
                continue
            seq = setup.get("seq")
            if tokens_counted:  # the batch in tokens: in samples only with the sequence length
                gbs = setup.get("samples") or (round(batch / seq) if batch and seq else None)
            else:
                gbs = setup.get("samples") or (round(batch) if batch else None)
            out.append(record._replace(global_batch_size=count(gbs), seq_length=seq))
        return first_of_each(out)
