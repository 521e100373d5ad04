"""MLPerf logging (`:::MLLOG {json}` events, as the mlperf-logging package writes them and MLPerf Training
submissions log them; a launcher's `0: ` or `[rank0]: ` prefix before it is fine).

Per-step records where the run logs a step timer in `tracked_stats` (`train_step_time`, or NeMo's
`train_step_timing in s`; its `step` metadata counts samples); otherwise one record per training block,
timed by `block_start` and `block_stop` time_ms and sized by their `samples_count` (or `epoch_count`).
`global_batch_size` and `max_sequence_length` events give the batch and sequence length. GPT-3 counts its
samples in tokens (submission_benchmark `gpt3`).
"""

from __future__ import annotations

import json
import re

from nlp_bench.analysis.formats.item_scan import ItemScan
from nlp_bench.analysis.log_record import MIN_SECONDS, Record, count, positive

_EVENT = re.compile(r":::MLLOG ([^\n]*)")
_TIMERS = ("train_step_time", "train_step_timing in s")
_WANTED = {"global_batch_size", "max_sequence_length", "submission_benchmark", "block_start", "block_stop",
           "epoch_start", "epoch_stop", "tracked_stats", "train_loss", "run_start", "run_stop"}


def _float(value) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class MlperfScan(ItemScan):
    NAME = "mlperf"
    KINDS = ((":::MLLOG", _EVENT, "event"),)

    def event(self, match: re.Match) -> tuple | None:
        try:
            event = json.loads(match.group(1))
        except ValueError:
            self.warnings["MLLOG line that is no JSON (cut?)"] += 1
            return None
        if not isinstance(event, dict) or event.get("key") not in _WANTED:
            return None
        time_ms = _float(event.get("time_ms"))
        if time_ms is None:
            self.warnings["MLLOG event without a time_ms"] += 1
            return None
        metadata = event.get("metadata") if isinstance(event.get("metadata"), dict) else {}
        return event["key"], time_ms, event.get("value"), metadata

    def found(self) -> bool:
        return any(item[0] in ("block_stop", "epoch_stop") or item[0] == "tracked_stats" and isinstance(item[2], dict)
                   and any(_float(item[2].get(t)) for t in _TIMERS) for item in self.items)

    def records(self, items: list) -> list[Record]:
        setting = {key: value for key, _, value, _ in items if key in ("global_batch_size", "max_sequence_length",
                                                                        "submission_benchmark")}
        gbs = count(_float(setting.get("global_batch_size")))
        seq = count(_float(setting.get("max_sequence_length")))
        per_sample = seq if setting.get("submission_benchmark") == "gpt3" and seq else 1  # gpt3 counts tokens
        steps = self._steps(items, gbs, seq, per_sample)
        return steps if steps else self._blocks(items, gbs, seq, per_sample)

    @staticmethod
    def _steps(items: list, gbs: int | None, seq: int | None, per_sample: int) -> list[Record]:
        out: dict[int, Record] = {}
        timed = [(value, metadata) for key, _, value, metadata in items if key == "tracked_stats"
                 and isinstance(value, dict) and any(_float(value.get(t)) for t in _TIMERS)]
        # where a run logs each step's timer, its block summaries (which add a throughput) repeat them
        if any("throughput" not in value for value, _ in timed):
            timed = [(value, metadata) for value, metadata in timed if "throughput" not in value]
        for value, metadata in timed:
            seconds = next((positive(_float(value.get(t))) for t in _TIMERS if _float(value.get(t))), None)
            step = _float(metadata.get("step"))
            iteration = (round(step / per_sample / gbs) if step is not None and gbs else len(out) + 1)
            loss = _float(value.get("reduced_train_loss", value.get("train_loss")))
            out.setdefault(iteration, Record(iteration, None, seconds, global_batch_size=gbs, loss=loss,
                                             seq_length=seq))
        return [out[i] for i in sorted(out)]

    @staticmethod
    def _blocks(items: list, gbs: int | None, seq: int | None, per_sample: int) -> list[Record]:
        out, begun, done = [], None, 0.0
        for key, time_ms, _, metadata in items:
            if key in ("block_start", "epoch_start"):
                begun = (time_ms, metadata)
            elif key in ("block_stop", "epoch_stop") and begun is not None:
                start_ms, start_meta = begun
                begun = None
                first, last = _float(start_meta.get("samples_count")), _float(metadata.get("samples_count"))
                size = _float(start_meta.get("epoch_count"))
                if first is not None and last is not None and last > first:
                    size = last - first
                seconds = (time_ms - start_ms) / 1000
                if not size or seconds <= MIN_SECONDS:
                    continue
                samples = size / per_sample
                done += samples
                iterations = samples / gbs if gbs else None
                iteration = round(done / gbs) if gbs else len(out) + 1
                out.append(Record(iteration, None, seconds / iterations if iterations else None,
                                  global_batch_size=gbs, samples_per_s=samples / seconds, seq_length=seq,
                                  consumed_samples=count(done)))
        return out
