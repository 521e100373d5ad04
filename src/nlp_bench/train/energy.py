"""The energy a node's GPUs use, read through NVML (pynvml, from the nvidia-ml-py package, optional).

Where the GPU keeps a total-energy counter (Volta and later) the meter reads it: exact over any interval,
whatever the sampling. Elsewhere a background thread samples the power draw every 100 ms and integrates
it (trapezoids). NVML sees the GPUs of the node the job was given (Slurm's cgroup hides the others), so
one meter per node, on its first local rank, covers the job's share of the node. Without NVML the meter
reads nothing and `reason` says why; a run is never failed for it.
"""

from __future__ import annotations

import importlib
import threading
import time
from typing import Any


class EnergyMeter:
    def __init__(self, nvml: Any = None, interval_s: float = 0.1, clock=time.monotonic) -> None:
        self.reason: str | None = None
        self.mode = ""
        self._nvml, self._handles, self._clock, self._interval = None, [], clock, interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            nvml = nvml or importlib.import_module("pynvml")
        except ImportError:
            self.reason = "pynvml is not installed (pip install nvidia-ml-py)"
            return
        try:
            nvml.nvmlInit()
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        except Exception as exc:  # NVMLError and its many subclasses: no driver, no permission
            self.reason = f"NVML did not start: {exc}"
            return
        if not self._handles:
            self.reason = "NVML sees no GPU on this node"
            return
        self._nvml = nvml
        try:
            self._last = self._counter()
            self.mode = "energy counter"
        except Exception:
            self.mode = "power samples"
            self._joules, self._last_power, self._last_time = 0.0, self._power(), clock()
            self._thread = threading.Thread(target=self._sample, name="nlp-bench-energy", daemon=True)
            self._thread.start()

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def _counter(self) -> float:
        """Joules since the driver loaded, summed over the node's GPUs (NVML counts millijoules)."""
        return sum(self._nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self._handles) / 1e3

    def _power(self) -> float:
        """Watts drawn now, summed over the node's GPUs (NVML reports milliwatts)."""
        return sum(self._nvml.nvmlDeviceGetPowerUsage(h) for h in self._handles) / 1e3

    def _sample(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()

    def sample(self) -> None:
        """One power sample, integrated since the last (the thread calls it; tests call it by hand)."""
        power, now = self._power(), self._clock()
        with self._lock:
            self._joules += 0.5 * (power + self._last_power) * (now - self._last_time)
            self._last_power, self._last_time = power, now

    def read(self) -> float | None:
        """Joules used since the previous read (or since the meter started); None without NVML."""
        if not self.available:
            return None
        if self.mode == "energy counter":
            now = self._counter()
            used, self._last = now - self._last, now
            return used
        self.sample()
        with self._lock:
            used, self._joules = self._joules, 0.0
        return used

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None
