"""Fit the time model's two efficiencies to measured runs, and keep the fit per system.

Least squares on log(predicted / measured tokens/s), so a 5% miss weighs the same at 13B and 175B.
With two parameters a coarse grid finds the basin and a shrinking pattern search polishes it: no
solver library needed for a smooth function of two variables, and the search stays in a stated range:
compute efficiency in (0, 1]; network efficiency up to 8, because the time model adds communication
serially, and a fit above 1 says how much of it the measured runs hid behind computation (on the
JUWELS Booster reference rows it comes out near 7).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nlp_bench.plan.timing import Efficiency

BOUNDS = {"compute": (0.02, 1.0), "network": (0.01, 8.0)}


@dataclass(frozen=True)
class Fit:
    efficiency: Efficiency
    rms_log_error: float  # root mean square of log(pred/measured)
    max_error: float  # largest |pred/measured - 1|
    points: list[str]


def fit(predict: Callable[[Efficiency], list[float]], measured: list[float], labels: list[str]) -> Fit:
    """`predict(eff)` gives tokens/s for each measured point, in order."""
    if not measured:
        raise ValueError("nothing to calibrate on")

    def cost(compute: float, network: float) -> float:
        try:
            predicted = predict(Efficiency(compute, network))
        except ZeroDivisionError:
            return math.inf
        return sum(math.log(p / m) ** 2 for p, m in zip(predicted, measured, strict=False))

    grid = {k: [lo * (hi / lo) ** (i / 15) for i in range(16)] for k, (lo, hi) in BOUNDS.items()}
    best = min(itertools.product(grid["compute"], grid["network"]), key=lambda cn: cost(*cn))
    step = 0.25
    value = cost(*best)
    while step > 1e-5:
        moved = False
        for dc, dn in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            trial = (min(max(best[0] * (1 + step * dc), BOUNDS["compute"][0]), BOUNDS["compute"][1]),
                     min(max(best[1] * (1 + step * dn), BOUNDS["network"][0]), BOUNDS["network"][1]))
            trial_value = cost(*trial)
            if trial_value < value:
                best, value, moved = trial, trial_value, True
        if not moved:
            step /= 2
    eff = Efficiency(*best)
    predicted = predict(eff)
    errors = [p / m - 1 for p, m in zip(predicted, measured, strict=False)]
    return Fit(eff, math.sqrt(value / len(measured)), max(abs(e) for e in errors), labels)


def _store(results_dir: Path) -> Path:
    return Path(results_dir) / "plan" / "calibration.json"


def save(results_dir: Path, system: str, result: Fit) -> Path:
    path = _store(results_dir)
    data = json.loads(path.read_text()) if path.is_file() else {}
    data[system] = {**result.efficiency.to_dict(), "rms_log_error": result.rms_log_error,
                    "max_error": result.max_error, "points": result.points}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".calibration.")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
    os.replace(tmp, path)
    return path


def load(results_dir: Path, system: str) -> tuple[Efficiency, bool]:
    """The system's fitted efficiencies and True, or the defaults and False."""
    path = _store(results_dir)
    if path.is_file():
        entry = json.loads(path.read_text()).get(system)
        if entry:
            return Efficiency(entry["compute"], entry["network"]), True
    return Efficiency(), False
