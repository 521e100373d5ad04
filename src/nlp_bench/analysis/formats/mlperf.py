"""MLPerf logging (`:::MLLOG {json}` events, as the mlperf-logging package writes them and MLPerf Training
submissions log them; a launcher's `0: ` or `[rank0]: ` prefix before it is fine).

Submitters agree on the events, not on what their counters count, so the records come from the first
of these the log has:

1. a step timer in `tracked_stats` (`train_step_time`, or NeMo's `train_step_timing in s`). Several in a
   block are steps, keyed by their cumulative `samples_count`, else their `step` (samples where it is a
   multiple of the batch, an index otherwise). One per block (with or without a `throughput` beside it)
   is the block's mean, keyed by the block's last step.
2. training blocks, timed by `block_start` and `block_stop` time_ms and sized by their counters: cumulative
   ends (`samples_count` rising at each stop), cumulative starts (start and stop printing the block's
   start), block sizes (start and stop printing the same size), or `first_epoch_num` and `epoch_count`.
3. `tracked_stats` throughputs alone (samples/s, keyed by the `epoch_num` or `samples_count` beside them).

`global_batch_size` and `max_sequence_length` give the batch and sequence length. GPT-3 counts samples
and epochs in tokens (submission_benchmark `gpt3`), and its throughput is tokens/s.
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from nlp_bench.analysis.formats import register_format
from nlp_bench.analysis.formats.item_scan import ItemScan
from nlp_bench.analysis.log_record import MIN_SECONDS, STEP_TIMERS, Record, Warnings, count, positive

_EVENT = re.compile(r":::MLLOG ([^\n]*)")
_SETTINGS = {"global_batch_size", "max_sequence_length", "submission_benchmark"}
_WANTED = _SETTINGS | {"block_start", "block_stop", "tracked_stats", "init_start", "run_start", "eval_start",
                       "eval_stop"}


#: the largest number a counter or a time is read as: JSON holds any integer, and a float of 1e400 is inf
_LARGEST = 1e300


def _float(value: Any) -> float | None:
    """A JSON number as a finite float, or None (a string, a bool, NaN, Infinity, a 400-digit integer)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if -_LARGEST < number < _LARGEST else None


def _rising(values: list[float]) -> bool:
    return all(b > a for a, b in zip(values, values[1:], strict=False))


class _Event(NamedTuple):
    key: str
    time_ms: float
    value: Any
    metadata: dict
    block: int  # the training block it lies in (-1: none)


class _Block(NamedTuple):
    start_ms: float
    stop_ms: float
    samples: float | None  # in the block
    end: float | None  # samples done when it ends


@register_format(20)
class MlperfScan(ItemScan):
    NAME = "mlperf"
    STEP = (":::MLLOG", _EVENT)

    def records(self, rows: list[str], warnings: Warnings) -> list[Record]:
        events, blocks, setting = self._events(rows, warnings)
        gbs = count(positive(_float(setting.get("global_batch_size"))))
        seq = count(positive(_float(setting.get("max_sequence_length"))))
        gpt3 = setting.get("submission_benchmark") == "gpt3" and seq
        sized = _sizes(blocks, seq if gpt3 else 1)
        for reader in (_timed, _by_block, _throughputs, _between_evals):
            records = reader(events, sized, gbs, seq, bool(gpt3))
            if records:
                return records
        return []

    @staticmethod
    def _events(rows: list[str], warnings: Warnings) -> tuple[list[_Event], list[tuple], dict[str, Any]]:
        """The events that matter, each with its block, and the blocks as (start_ms, start, stop_ms, stop);
        a first block_stop of no block (a log that begins inside one) is kept as a block of no start; and
        the settings. A log of several runs (each from its init_start or run_start) gives the last run's."""
        events, blocks, begun, runs, running, setting = [], [], None, 1, False, {}
        for text in rows:
            try:
                event = json.loads(text)
            except (ValueError, RecursionError):
                warnings["MLLOG line that is no JSON (cut?)"] += 1
                continue
            if not isinstance(event, dict) or not isinstance(event.get("key"), str) or event["key"] not in _WANTED:
                continue
            time_ms = _float(event.get("time_ms"))
            if time_ms is None:
                warnings["MLLOG event without a time_ms"] += 1
                continue
            metadata = event.get("metadata") if isinstance(event.get("metadata"), dict) else {}
            key = event["key"]
            if key in _SETTINGS:
                setting[key] = event.get("value")
                continue
            if key in ("init_start", "run_start") and running:  # another run in the same log
                runs += 1
                events, blocks, begun, running = [], [], None, False
            running = running or key == "run_start"
            if key == "block_start":
                begun = (time_ms, metadata)
            elif key == "block_stop" and begun is not None:
                blocks.append((begun[0], begun[1], time_ms, metadata))
                begun = None
            elif key == "block_stop" and not blocks:
                blocks.append((None, {}, time_ms, metadata))
            events.append(_Event(key, time_ms, event.get("value"), metadata,
                                 len(blocks) if begun is not None else -1))
        if runs > 1:
            warnings[f"MLLOG of {runs} runs (run_start): the last one's figures"] += 1
        return events, blocks, setting


def _sizes(blocks: list[tuple], per_sample: int) -> list[_Block]:
    """Each block's samples and the samples done at its end, read from whichever counters it prints."""
    before = None
    if blocks and blocks[0][0] is None:  # the end of a block the log holds no start of
        before = _float(blocks[0][3].get("samples_count"))
        blocks = blocks[1:]
    starts = [_float(start.get("samples_count")) for _, start, _, _ in blocks]
    stops = [_float(stop.get("samples_count")) for _, _, _, stop in blocks]
    sizes: list[float | None] = [None] * len(blocks)
    first = 0.0
    if blocks and None not in stops:
        if starts == stops:  # the same number at both ends: where the block starts, or its size
            if _rising(starts) and len(starts) > 1:
                first = starts[0]
                sizes = [b - a for a, b in zip(starts, starts[1:], strict=False)]
                sizes.append(sizes[-1])  # the last block: as the one before it
            else:
                sizes = list(stops)
        elif _rising(stops):
            # the first block starts where the stop before it ended, or where its start says if the starts
            # count what the stops do (each the stop before it; Habana's count steps)
            counted = starts[0] == 0 or all(a == b for a, b in zip(starts[1:], stops, strict=False))
            if before is not None and before < stops[0]:
                first = before
            elif counted and starts[0] is not None and 0 <= starts[0] < stops[0]:
                first = starts[0]
            else:
                first = None
            sizes = [None if first is None else stops[0] - first] + [b - a for a, b in zip(stops, stops[1:], strict=False)]
            first = stops[0] - sizes[1] if first is None and len(stops) > 1 else first
    elif blocks:
        sizes = [_float(start.get("epoch_count")) for _, start, _, _ in blocks]
        first = _float(blocks[0][1].get("first_epoch_num")) or 0.0
    out, done = [], (first or 0.0) / per_sample
    for (start_ms, _, stop_ms, stop), size in zip(blocks, sizes, strict=True):
        samples = size / per_sample if size and size > 0 else None
        done = done + (samples or 0.0)
        if samples is None and (end := _float(stop.get("samples_count"))):
            done = end / per_sample
        out.append(_Block(start_ms, stop_ms, samples, done))
    return out


def _timer(event: _Event) -> float | None:
    if event.key != "tracked_stats" or not isinstance(event.value, dict):
        return None
    return next((positive(_float(event.value.get(t))) for t in STEP_TIMERS if _float(event.value.get(t))), None)


def _timed(events: list[_Event], blocks: list[_Block], gbs: int | None, seq: int | None, gpt3: bool) -> list[Record]:
    timed = [(e, t) for e in events if (t := _timer(e)) is not None]
    if any("throughput" not in e.value for e, _ in timed):  # per-step timers: their block summaries repeat them
        timed = [(e, t) for e, t in timed if "throughput" not in e.value]
    scale = seq if gpt3 and seq else 1
    steps = [step / scale for e, _ in timed if (step := _float(e.metadata.get("step"))) is not None]
    in_samples = bool(gbs and gbs > 1 and steps and all(step > 0 and step % gbs == 0 for step in steps))
    per_block: dict[int, int] = {}
    for event, _ in timed:
        per_block[event.block] = per_block.get(event.block, 0) + 1
    summaries = len(blocks) > 1 and -1 not in per_block and max(per_block.values(), default=0) == 1
    out: dict[int, Record] = {}
    for event, seconds in timed:
        iteration = None
        if summaries and blocks[event.block].end and gbs:
            iteration = round(blocks[event.block].end / gbs)
        elif gbs and (samples := _float(event.metadata.get("samples_count"))) and not summaries:
            iteration = round(samples / scale / gbs)
        elif (step := _float(event.metadata.get("step"))) is not None:
            iteration = round(step / scale / gbs) if in_samples else int(step / scale)
        if iteration is None:
            iteration = len(out) + 1
        value = event.value
        loss = _float(value.get("reduced_train_loss", value.get("train_loss")))
        out.setdefault(iteration, Record(iteration, None, seconds, global_batch_size=gbs, loss=loss, seq_length=seq))
    return [out[i] for i in sorted(out)]


def _by_block(events: list[_Event], blocks: list[_Block], gbs: int | None, seq: int | None,
              gpt3: bool) -> list[Record]:
    evaluated = {e.block for e in events if e.key == "eval_start"}
    out = []
    for k, block in enumerate(blocks):
        seconds = (block.stop_ms - block.start_ms) / 1000
        if not block.samples or seconds <= MIN_SECONDS or (gbs and block.samples < gbs) or k in evaluated:
            continue  # a block of no step (a counter that counts something else), or holding evaluations
        steps = block.samples / gbs if gbs else None
        iteration = round(block.end / gbs) if gbs and block.end else k + 1
        out.append(Record(iteration, None, seconds / steps if steps else None, global_batch_size=gbs,
                          samples_per_s=block.samples / seconds, seq_length=seq, consumed_samples=count(block.end)))
    return out


def _throughputs(events: list[_Event], blocks: list[_Block], gbs: int | None, seq: int | None,
                 gpt3: bool) -> list[Record]:
    out: dict[int, Record] = {}
    for event in events:
        if event.key != "tracked_stats" or not isinstance(event.value, dict):
            continue
        rate = positive(_float(event.value.get("throughput")))
        if rate is None:
            continue
        where = next((v for k in ("samples_count", "epoch_num", "step") if (v := _float(event.metadata.get(k)))), None)
        if gpt3 and where is not None and seq:
            where /= seq
        iteration = round(where / gbs) if where is not None and gbs else len(out) + 1
        record = (Record(iteration, None, None, global_batch_size=gbs, tokens_per_s=rate, seq_length=seq) if gpt3
                  else Record(iteration, None, None, global_batch_size=gbs, samples_per_s=rate, seq_length=seq))
        out.setdefault(iteration, record)
    return [out[i] for i in sorted(out)]


def _between_evals(events: list[_Event], blocks: list[_Block], gbs: int | None, seq: int | None,
                   gpt3: bool) -> list[Record]:
    """Training between evaluations: from run_start or an eval_stop to the next eval_start, sized by the
    counts the eval_start events carry (`samples_count`, else `epoch_num`: samples, or tokens for GPT-3)."""
    scale = seq if gpt3 and seq else 1
    out, since, done = [], None, None
    for event in events:
        if event.key == "run_start":
            since, done = event.time_ms, 0.0
        elif event.key == "eval_stop":
            since = event.time_ms
        elif event.key == "eval_start":
            counted = _float(event.metadata.get("samples_count"))
            counted = _float(event.metadata.get("epoch_num")) if counted is None else counted
            if counted is None:
                continue
            counted /= scale
            if since is not None and done is not None and counted > done and event.time_ms > since:
                samples, seconds = counted - done, (event.time_ms - since) / 1000
                steps = samples / gbs if gbs else None
                out.append(Record(round(counted / gbs) if gbs else len(out) + 1, None,
                                  seconds / steps if steps else None, global_batch_size=gbs,
                                  samples_per_s=samples / seconds, seq_length=seq, consumed_samples=count(counted)))
            done, since = counted, None
    return out
