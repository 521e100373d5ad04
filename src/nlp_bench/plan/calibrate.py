"""Fit the time model's constants to measured runs, and keep a system's fit.

Least squares on log(predicted / measured tokens/s), so a 5% miss weighs the same at 13B and 175B.
With at most four smooth parameters a coarse grid finds the basin and a shrinking pattern search
polishes it: no solver library needed, and the search stays inside stated bounds. The efficiencies are
physical fractions, bounded by 1; a fit that ends on that bound wanted more, and says which term of the
time model it cannot explain (the rows were faster than that term allows). A GEMM half size on its lower
bound says the rows gave no evidence that narrower GEMMs run slower.

The corpus fit (plan.validation) fits all four constants on published measurements, held near what the
hardware measures of them (PRIOR, weighed by PRIOR_WEIGHT): with a publication held out, as few as three rows
may remain, too few to pin four constants, and a constant the rows leave free should stay where the
hardware puts it rather than wander to a bound. Each publication's rows weigh as one row together there
(`weights`), so PRIOR_WEIGHT weighs the prior against publications, not rows. A system's own
calibration (`bench plan calibrate`) starts from it and refits as many efficiencies as its runs can
pin (`system_free`): a few runs of one benchmark cannot pin four constants.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from nlp_bench.errors import PlanError
from nlp_bench.fsio import write_json_atomic
from nlp_bench.plan.timing import Efficiency

BOUNDS = {"gemm": (0.05, 1.0), "gemm_half": (8.0, 4096.0), "network": (0.02, 1.0), "memory": (0.05, 1.0)}
#: What it means when a fit ends on an efficiency's upper bound.
UNEXPLAINED = {
    "gemm": "compute: the rows ran faster than the peak and the GEMM curve allow",
    "network": "communication: the rows hid more of their tensor-, pipeline- or data-parallel traffic than the "
               "model's overlap allows",
    "memory": "element-wise work and the optimizer step: the rows moved their bytes faster than device memory allows",
}
#: What it means when the GEMM curve's half size ends on its lower bound.
FLAT_GEMMS = ("these rows show no loss for narrower GEMMs (the narrower ran no slower per FLOP), so the curve is flat: "
              "one GEMM efficiency for every size")
SYSTEM_FREE = ("gemm", "gemm_half", "network", "memory")  # refitted on a system's own runs, in this order
#: What the hardware measures of the constants. One device (benchmark/perf/gemm_rates.py on an H100 and an
#: H200, 2026-11-26; benchmark/perf/measured/): a layer's GEMMs at 8192 tokens follow rate · d / (d + half)
#: with rate 0.95 and 0.89 of the best square GEMM (the matmul rate the time model divides by) and half 148
#: and 92; a large copy moves 0.90 and 0.84 of the nominal memory bandwidth. Those layer rates are a loaded
#: device's: held for a minute, a 175B layer's GEMMs ran at 0.99 of what gemm_rates.py had measured of them
#: (H200, BF16 and FP8; benchmark/perf/gemm_sustained.py, 2026-11-27). The network: published nccl-tests
#: ring all-reduce bus bandwidth inside a node, 230-232 of 300 GB/s on 8 A100s and 365-370 of 450
#: on 8 H100s or H200s (NVIDIA GTC24 S62129 "Collective Communication Bandwidth"; S. Jeaugey, NVIDIA/nccl-tests
#: issues 149 and 212; Azure AI-benchmarking-guide, ND A100 v4 231.6 at 8 GB); across nodes 0.93-0.96 of the
#: InfiniBand line rate (192 of 200 GB/s, DGX A100, NVIDIA/nccl issue 812), but tensor parallelism's traffic,
#: the most of what the corpus moves, stays inside nodes: 0.8.
PRIOR = {"gemm": 0.92, "gemm_half": 120.0, "memory": 0.87, "network": 0.8}
#: How much the prior weighs: a constant a factor e from it costs as much as one row (in the corpus fit, one
#: publication) missed by 10%.
PRIOR_WEIGHT = 0.01


def system_free(points: int) -> tuple[str, ...]:
    """The efficiencies `points` measured runs of one system refit: one per run, at most three."""
    return SYSTEM_FREE[:max(1, min(points, 3))]


@dataclass(frozen=True)
class Fit:
    efficiency: Efficiency
    rms_log_error: float  # root mean square of log(pred/measured)
    max_error: float  # largest |pred/measured - 1|
    points: list[str]
    pinned: list[str]  # constants that ended on a bound: an efficiency at 1 (the term it cannot explain), a flat GEMM curve
    free: tuple[str, ...] = tuple(BOUNDS)  # the constants fitted; the others were kept

    def to_dict(self) -> dict:
        return {**self.efficiency.to_dict(), "rms_log_error": self.rms_log_error, "max_error": self.max_error,
                "points": self.points, "pinned": self.pinned, "fitted": list(self.free)}


def fit(predict: Callable[[Efficiency], list[float]], measured: list[float], labels: list[str],
        free: Sequence[str] = tuple(BOUNDS), start: Efficiency | None = None,
        prior: dict[str, float] | None = None, weights: Sequence[float] | None = None) -> Fit:
    """`predict(eff)` gives tokens/s for each measured point, in order; the constants named in `free` are
    fitted, the others kept at `start`'s values; with a `prior`, the constants it names are held near it;
    `weights` weigh each point's squared log error (default 1 each)."""
    if not measured:
        raise ValueError("nothing to calibrate on")
    start = start or Efficiency()
    weights = list(weights) if weights is not None else [1.0] * len(measured)

    def cost(values: Sequence[float]) -> float:
        try:
            predicted = predict(replace(start, **dict(zip(free, values, strict=True))))
        except ZeroDivisionError:
            return math.inf
        held = sum(math.log(v / prior[k]) ** 2 for k, v in zip(free, values, strict=True) if k in prior) if prior else 0.0
        return sum(w * math.log(p / m) ** 2 for p, m, w in zip(predicted, measured, weights, strict=True)) + \
            PRIOR_WEIGHT * held

    points = 6 if len(free) <= 2 else 4
    axes = [[lo * (hi / lo) ** (i / (points - 1)) for i in range(points)] for lo, hi in (BOUNDS[k] for k in free)]
    best = list(min(itertools.product(*axes), key=cost))
    value, step = cost(best), 0.25
    while step > 1e-4:
        moved = False
        for i, key in enumerate(free):
            lo, hi = BOUNDS[key]
            for sign in (1, -1):
                trial = list(best)
                trial[i] = min(max(best[i] * (1 + sign * step), lo), hi)
                trial_value = cost(trial)
                if trial_value < value:
                    best, value, moved = trial, trial_value, True
        if not moved:
            step /= 2
    eff = replace(start, **dict(zip(free, best, strict=True)))
    predicted = predict(eff)
    errors = [p / m - 1 for p, m in zip(predicted, measured, strict=True)]
    value = sum(math.log(p / m) ** 2 for p, m in zip(predicted, measured, strict=True))
    pinned = [f"{key} = 1: {UNEXPLAINED[key]}" for key in free
              if key in UNEXPLAINED and getattr(eff, key) >= BOUNDS[key][1] * (1 - 1e-6)]
    if "gemm_half" in free and eff.gemm_half <= BOUNDS["gemm_half"][0] * (1 + 1e-6):
        pinned.append(f"gemm_half = {BOUNDS['gemm_half'][0]:g}: {FLAT_GEMMS}")
    return Fit(eff, math.sqrt(value / len(measured)), max(abs(e) for e in errors), labels, pinned, tuple(free))


def _on_bound(eff: Efficiency, key: str) -> bool:
    lo, hi = BOUNDS[key]
    value = getattr(eff, key)
    return value <= lo * (1 + 1e-6) or value >= hi * (1 - 1e-6)


def fit_system(predict: Callable[[Efficiency], list[float]], measured: list[float], labels: list[str],
               start: Efficiency) -> Fit:
    """A system's refit on its own runs: one constant per run (at most three, in SYSTEM_FREE's order). A
    constant that ends on its bound explains nothing more, so it is kept there and the next one is freed in
    its place, once, where that fits the runs better."""
    free = list(system_free(len(measured)))
    best = fit(predict, measured, labels, free=tuple(free), start=start)
    spare = [k for k in SYSTEM_FREE if k not in free]
    stuck = [k for k in free if _on_bound(best.efficiency, k)]
    if spare and stuck:
        free[free.index(stuck[0])] = spare[0]
        trial = fit(predict, measured, labels, free=tuple(free), start=best.efficiency)
        if trial.rms_log_error < best.rms_log_error:
            best = replace(trial, pinned=[*best.pinned, *(p for p in trial.pinned if p not in best.pinned)])
    return best


def _store(results_dir: Path) -> Path:
    return Path(results_dir) / "plan" / "calibration.json"


def _kept(path: Path) -> dict:
    """Every system's calibration; one PlanError line naming the file where it is damaged."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PlanError(f"{path}: cannot be read ({exc}); delete it and calibrate again") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise PlanError(f"{path}: not a calibration file (system -> fit); delete it and calibrate again")
    return data


def save(results_dir: Path, system: str, result: Fit) -> Path:
    path = _store(results_dir)
    data = _kept(path)
    data[system] = result.to_dict()
    write_json_atomic(path, data)
    return path


def load(results_dir: Path, system: str) -> Efficiency | None:
    """The system's own calibration, or None."""
    entry = _kept(_store(results_dir)).get(system)
    if entry:
        known = asdict(Efficiency())
        try:
            return Efficiency(**{k: float(entry[k]) for k in known if k in entry})
        except (TypeError, ValueError):
            raise PlanError(f"{_store(results_dir)}: the fit of {system} is damaged; calibrate again") from None
    return None
