"""The run in MLPerf logging's event format (`:::MLLOG {json}` lines), so a site's MLPerf tooling (the
mlperf-logging package's reader, result summarisers, `bench parse`) reads our runs.

Written here rather than through the mlperf-logging package: the format is one JSON object per line with a
fixed key order, and the trainer's nodes then need nothing beyond torch. The events are those a training
submission logs: `cache_clear`, `init_start`/`init_stop` around set-up with the hyperparameters between,
`run_start`, a block per log interval (`block_start` when training resumes, `tracked_stats` with the
throughput and step time, `block_stop`), an evaluation outside any block as `eval_start`/`eval_accuracy`/
`eval_stop` (the validation loss, as MLPerf's language models report theirs), and `run_stop` with the run's
status. Counts are in samples (sequences). The compliance checker judges MLPerf's own benchmarks only: it
has no rules for this one.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import IO, Any

BENCHMARK = "nlp-bench-gpt"


def check_path(path: str) -> str | None:
    """Why the MLPerf log cannot be written at `path` (None where it can): found before any process starts,
    not after the model is built. An existing log is refused: a run's events are never appended to another's."""
    if not path:
        return "--mlperf-log needs a file name"
    target = Path(path)
    if target.is_dir():
        return f"--mlperf-log {path} is a folder"
    if target.exists() and target.stat().st_size:
        return f"--mlperf-log {path} already holds a run's events (name a new file)"
    folder = target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot write the MLPerf log {path}: {folder} is not a writable folder"
    return None


class MlperfLog:
    """One rank's MLPerf event log (the rank that prints the iteration lines: the others hold None). A
    write that fails (a full disk) is said once on stderr and ends the MLPerf log, not the training."""

    def __init__(self, path: str) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fh: IO[str] | None = target.open("w", encoding="utf-8")
        self._block: int | None = None  # the samples at which the open block began

    def event(self, key: str, value: Any = None, metadata: dict | None = None, event_type: str = "POINT_IN_TIME",
              time_ms: int | None = None) -> None:
        if self._fh is None:
            return
        caller = sys._getframe(1)
        while caller.f_back is not None and caller.f_code.co_filename == __file__:
            caller = caller.f_back  # the trainer's line that called, as mllog names its caller
        record = {"namespace": "", "time_ms": time_ms if time_ms is not None else int(time.time() * 1000),
                  "event_type": event_type, "key": key, "value": value,
                  "metadata": {"file": os.path.basename(caller.f_code.co_filename), "lineno": caller.f_lineno,
                               **(metadata or {})}}
        try:
            self._fh.write(":::MLLOG " + json.dumps(record, allow_nan=False) + "\n")
            self._fh.flush()
        except (OSError, ValueError) as exc:
            print(f"nlp-bench trainer: the MLPerf log {self.path} is no longer written: "
                  f"{getattr(exc, 'strerror', None) or exc}", file=sys.stderr, flush=True)
            self._close()

    def started(self, init_ms: int, settings: dict[str, Any]) -> None:
        """Set-up done: its start, the run's settings, its end, and the start of the run."""
        self.event("cache_clear", True, time_ms=init_ms)
        self.event("init_start", event_type="INTERVAL_START", time_ms=init_ms)
        for key, value in settings.items():
            self.event(key, value)
        self.event("init_stop", event_type="INTERVAL_END")
        self.event("run_start", event_type="INTERVAL_START")

    def training(self, samples: int) -> None:
        """A training step begins after `samples` samples: a block opens unless one is open."""
        if self._block is None:
            self._block = samples
            self.event("block_start", metadata={"samples_count": samples, "first_epoch_num": 0},
                       event_type="INTERVAL_START")

    def interval(self, samples: int, seconds_per_step: float, global_batch: int, loss: float | None) -> None:
        """A log interval ended after `samples` samples: its throughput, and its block closes."""
        stats: dict[str, float] = {"throughput": global_batch / seconds_per_step, "train_step_time": seconds_per_step}
        if loss is not None and loss == loss:
            stats["train_loss"] = loss
        self.event("tracked_stats", stats, {"step": samples, "samples_count": samples})
        self._stop(samples)

    def evaluation(self, samples: int, loss: float) -> None:
        """An evaluation after `samples` samples, outside any block (a block's time is training time)."""
        self._stop(samples)
        meta = {"samples_count": samples, "epoch_num": samples}
        self.event("eval_start", metadata=meta, event_type="INTERVAL_START")
        self.event("eval_accuracy", loss if loss == loss else None, meta)
        self.event("eval_stop", metadata=meta, event_type="INTERVAL_END")

    def stopped(self, samples: int, finished: bool) -> None:
        self._stop(samples)
        self.event("run_stop", metadata={"status": "success" if finished else "aborted", "samples_count": samples},
                   event_type="INTERVAL_END")
        self._close()

    def _stop(self, samples: int) -> None:
        if self._block is not None:
            self._block = None
            self.event("block_stop", metadata={"samples_count": samples, "first_epoch_num": 0},
                       event_type="INTERVAL_END")

    def _close(self) -> None:
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError:
                pass
            self._fh = None
