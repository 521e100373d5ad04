"""The run in MLPerf logging's event format (`:::MLLOG {json}` lines), so a site's MLPerf tooling (the
mlperf-logging package's reader and compliance checker, result summarisers) reads our runs.

Written here rather than through the mlperf-logging package: the format is one JSON object per line with a
fixed key order, and the trainer's nodes then need nothing beyond torch. The events are those a training
submission logs: `init_start`/`init_stop` around set-up, the hyperparameters, `run_start`, one block per log
interval (`block_start`, `tracked_stats` with the throughput and step time, `block_stop`), an evaluation
as `eval_start`/`eval_accuracy`/`eval_stop` (the validation loss, as MLPerf's language models report
theirs), and `run_stop` with the run's status. Counts are in samples (sequences).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import IO, Any

BENCHMARK = "nlp-bench-gpt"


class MlperfLog:
    """One rank's MLPerf event log (the rank that prints the iteration lines: the others hold None)."""

    def __init__(self, path: str) -> None:
        folder = os.path.dirname(path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        self._fh: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the whole run
        self.samples_at_block = 0

    def event(self, key: str, value: Any = None, metadata: dict | None = None, event_type: str = "POINT_IN_TIME",
              time_ms: int | None = None) -> None:
        caller = sys._getframe(1)
        while caller.f_back is not None and caller.f_code.co_filename == __file__:
            caller = caller.f_back  # the trainer's line that ended the interval, as mllog names its caller
        record = {"namespace": "", "time_ms": time_ms if time_ms is not None else int(time.time() * 1000),
                  "event_type": event_type, "key": key, "value": value,
                  "metadata": {"file": os.path.basename(caller.f_code.co_filename), "lineno": caller.f_lineno,
                               **(metadata or {})}}
        self._fh.write(":::MLLOG " + json.dumps(record, allow_nan=False) + "\n")
        self._fh.flush()

    def started(self, init_ms: int, settings: dict[str, Any]) -> None:
        """Set-up done: its start, the run's settings, its end, and the start of the run."""
        self.event("init_start", event_type="INTERVAL_START", time_ms=init_ms)
        for key, value in settings.items():
            self.event(key, value)
        self.event("init_stop", event_type="INTERVAL_END")
        self.event("run_start", event_type="INTERVAL_START")
        self.event("block_start", metadata={"samples_count": self.samples_at_block, "first_epoch_num": 0},
                   event_type="INTERVAL_START")

    def interval(self, samples: int, seconds_per_step: float, global_batch: int, loss: float | None) -> None:
        """One log interval ended after `samples` samples: its throughput, then the next block begins."""
        stats: dict[str, float] = {"throughput": global_batch / seconds_per_step, "train_step_time": seconds_per_step}
        if loss is not None and loss == loss:
            stats["train_loss"] = loss
        self.event("tracked_stats", stats, {"step": samples})
        self.event("block_stop", metadata={"samples_count": samples, "first_epoch_num": 0}, event_type="INTERVAL_END")
        self.samples_at_block = samples
        self.event("block_start", metadata={"samples_count": samples, "first_epoch_num": 0},
                   event_type="INTERVAL_START")

    def evaluation(self, samples: int, loss: float) -> None:
        meta = {"samples_count": samples, "epoch_num": samples}
        self.event("eval_start", metadata=meta, event_type="INTERVAL_START")
        self.event("eval_accuracy", loss if loss == loss else None, meta)
        self.event("eval_stop", metadata=meta, event_type="INTERVAL_END")

    def stopped(self, samples: int, finished: bool) -> None:
        self.event("block_stop", metadata={"samples_count": samples, "first_epoch_num": 0}, event_type="INTERVAL_END")
        self.event("run_stop", metadata={"status": "success" if finished else "aborted", "samples_count": samples},
                   event_type="INTERVAL_END")
        self._fh.close()
