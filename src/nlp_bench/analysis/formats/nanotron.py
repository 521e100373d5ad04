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

from nlp_bench.analysis.formats import register_format
from nlp_bench.analysis.formats.item_scan import SUFFIXES, ItemScan, first_of_each
from nlp_bench.analysis.log_record import Record, Warnings, count, number, positive

_STEP = re.compile(r"iteration: (\d{1,18}) / (\d{1,18})[ \t]*\|([^\n]*)")
_START = re.compile(r"grad_accum: [^\n]*")
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


@register_format(40)
class NanotronScan(ItemScan):
    NAME = "nanotron"
    STEP = ("iteration: ", _STEP)
    SETUP = (("grad_accum: ", _START, "start"),)

    def start(self, match: re.Match) -> dict[str, int]:
        seq, samples = _SEQUENCE.search(match.group(0)), _SAMPLES.search(match.group(0))
        found = {"sequence length": int(seq.group(1))} if seq else {}
        if samples:
            found["global batch"] = int(samples.group(1))
        return found

    def records(self, rows: list[tuple[str, str, str]], warnings: Warnings) -> list[Record]:
        seq, samples = self.setup.get("sequence length"), self.setup.get("global batch")
        out = []
        for iteration, total, rest in rows:
            fields = {}
            for part in rest.split("|"):
                key, _, raw = part.partition(": ")
                fields[key.strip()] = raw
            tokens_counted = "time_per_iteration_ms" in fields  # since March 2025: the batch in tokens
            ms = human(fields.get("time_per_iteration_ms") or fields.get("elapsed_time_per_iteration_ms") or "")
            if ms is None:
                warnings["nanotron line without a readable time per iteration"] += 1
                continue
            shown = fields.get("global_batch_size", "").strip()
            batch = human(shown) if shown.isdigit() else None  # `1.02K` is three digits of it: no batch
            if samples:
                gbs = samples
            elif batch and tokens_counted:
                gbs = round(batch / seq) if seq else None
            else:
                gbs = round(batch) if batch else None
            if not gbs and shown and not shown.isdigit():
                warnings["nanotron batch shown rounded (no start-up line): left empty"] += 1
            out.append(Record(int(iteration), int(total), positive(ms / 1000), global_batch_size=count(gbs),
                              loss=human(fields.get("lm_loss", "")), learning_rate=human(fields.get("lr", "")),
                              grad_norm=human(fields.get("grad_norm", "")),
                              tokens_per_s=positive(human(fields.get("tokens_per_sec", ""))),
                              tflops_per_gpu=positive(human(fields.get("model_tflops_per_gpu", ""))), seq_length=seq))
        return first_of_each([r for r in out if r.iteration_time_s], warnings)
