"""`bench result compare baseline RUN2 RUN`: did throughput change between two runs of the same points,
beyond the noise of each, and what else changed with it?

Per point both runs measured, the ratio of the steady-state figures (metrics.steady_state: one batch's tokens
over the mean iteration time, warm-up excluded) with a 95% confidence interval from the spread of each run's
intervals (the delta method for a ratio of mean times per token, Welch's degrees of freedom). Where the
interval excludes 1 the change is more than noise, and the point's provenance is compared: library
versions, the commit that rendered the jobscript, trainer, node list, the environment the jobscript
recorded, and the jobscript's own lines.
"""

from __future__ import annotations

import difflib
import statistics
from dataclasses import dataclass, field
from typing import Any

from nlp_bench.analysis import metrics
from nlp_bench.analysis.metrics import t95
from nlp_bench.analysis.parsers import Record
from nlp_bench.analysis.results import run_results
from nlp_bench.store.names import JOBSCRIPT
from nlp_bench.store.point_folder import PointDir
from nlp_bench.store.runs import Run

#: environment entries that differ between any two jobs and say nothing about performance
_VOLATILE = {"SLURM_JOB_ID", "MASTER_PORT", "MASTER_ADDR", "SLURM_JOB_NODELIST"}


@dataclass
class PointRun:
    """What one run knows about one point: its table row, its analysed result.json, its jobscript."""

    row: dict[str, Any]
    result: dict[str, Any]
    jobscript: str = ""


@dataclass
class Change:
    point: str
    tokens_per_s: float | None
    baseline_tokens_per_s: float | None
    ratio: float | None
    ci95: tuple[float, float] | None
    verdict: str  # faster | slower | within noise | not comparable: ...
    differences: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"point": self.point, "tokens_per_s": self.tokens_per_s,
                "baseline_tokens_per_s": self.baseline_tokens_per_s, "ratio": self.ratio,
                "ci95": list(self.ci95) if self.ci95 else None, "verdict": self.verdict,
                "differences": self.differences}


def point_runs(run: Run) -> dict[str, PointRun]:
    """Every point of a run with what the comparison reads, by point id."""
    found = {}
    for row, result in run_results(run):
        point = PointDir(run.path / row["point"])
        script = point.submitted_script() if point.submitted_script().is_file() else point.file(JOBSCRIPT)
        found[row["point"]] = PointRun(row, result, script.read_text(errors="replace") if script.is_file() else "")
    return found


def _steady_of(result: dict[str, Any], seq_length: int | None) -> tuple[list[float], float | None]:
    """The point's tokens/s per logged interval, warm-up intervals left out, and the steady figure over them
    (the one result.json and the report show)."""
    records = [Record(**{k: r.get(k) for k in Record._fields}) for r in result.get("records") or []]
    tokens = metrics.steady_state(records, seq_length)["tokens_per_s"]
    return metrics.steady_rates(records, seq_length)[1], tokens["mean"] if tokens else None


def ratio_interval(current: list[float], baseline: list[float]) -> tuple[float, tuple[float, float] | None]:
    """The ratio of the two steady figures (each one batch over its mean time: the ratio of the mean times per
    token, baseline over current) and its 95% interval; no interval with fewer than two intervals a side."""
    current, baseline = [1.0 / r for r in current], [1.0 / r for r in baseline]
    mean_a, mean_b = statistics.fmean(current), statistics.fmean(baseline)
    ratio = mean_b / mean_a
    if len(current) < 2 or len(baseline) < 2:
        return ratio, None
    var_a = statistics.variance(current) / (len(current) * mean_a**2)
    var_b = statistics.variance(baseline) / (len(baseline) * mean_b**2)
    total = var_a + var_b
    if total == 0:
        return ratio, (ratio, ratio)
    df = total**2 / (var_a**2 / (len(current) - 1) + var_b**2 / (len(baseline) - 1))
    half = t95(max(1, int(df))) * ratio * total**0.5
    return ratio, (ratio - half, ratio + half)


def provenance_differences(current: PointRun, baseline: PointRun) -> list[str]:
    """Everything recorded about how the two measurements were made that is not the same."""
    found = []
    for key in ("trainer", "system"):
        a, b = current.row.get(key), baseline.row.get(key)
        if a != b:
            found.append(f"{key}: {b} -> {a}")
    prov_a = current.result.get("provenance") or {}
    prov_b = baseline.result.get("provenance") or {}
    for key in ("torch", "cuda", "nccl", "git_commit", "nodelist"):
        if prov_a.get(key) != prov_b.get(key):
            found.append(f"{key}: {prov_b.get(key)} -> {prov_a.get(key)}")
    pkg_a, pkg_b = prov_a.get("packages") or {}, prov_b.get("packages") or {}
    for name in sorted(set(pkg_a) | set(pkg_b)):
        if pkg_a.get(name) != pkg_b.get(name):
            found.append(f"package {name}: {pkg_b.get(name, '(absent)')} -> {pkg_a.get(name, '(absent)')}")
    env_a, env_b = prov_a.get("environment") or {}, prov_b.get("environment") or {}
    for name in sorted((set(env_a) | set(env_b)) - _VOLATILE):
        if env_a.get(name) != env_b.get(name):
            before = env_b.get(name, "(unset)")
            after = env_a.get(name, "(unset)")
            found.append(f"environment {name}: {before} -> {after}")
    if current.jobscript and baseline.jobscript and current.jobscript != baseline.jobscript:
        lines = [line for line in difflib.unified_diff(baseline.jobscript.splitlines(), current.jobscript.splitlines(),
                                                       lineterm="", n=0)
                 if line[:1] in "+-" and not line.startswith(("+++", "---"))]
        found += [f"jobscript {line}" for line in lines[:20]]
        if len(lines) > 20:
            found.append(f"jobscript: {len(lines) - 20} more changed lines")
    return found


def compare_runs(current: dict[str, PointRun], baseline: dict[str, PointRun]) -> list[Change]:
    """One Change per point id the two runs share, in the current run's order."""
    changes = []
    for point, now in current.items():
        before = baseline.get(point)
        if before is None:
            continue
        seq = (now.result.get("summary") or {}).get("seq_length")
        (rates_now, mean_now), (rates_before, mean_before) = _steady_of(now.result, seq), _steady_of(before.result, seq)
        if not rates_now or not rates_before:
            missing = "this run" if not rates_now else "the baseline"
            changes.append(Change(point, None, None, None, None, f"not comparable: no iterations in {missing}"))
            continue
        ratio, interval = ratio_interval(rates_now, rates_before)
        if interval is None:
            verdict = "not comparable: fewer than two steady intervals"
        elif interval[0] > 1:
            verdict = "faster"
        elif interval[1] < 1:
            verdict = "slower"
        else:
            verdict = "within noise"
        change = Change(point, mean_now, mean_before, ratio, interval, verdict)
        if verdict in ("faster", "slower"):
            change.differences = provenance_differences(now, before) or [
                "nothing recorded differs (same versions, environment and jobscript): look at the nodes' health"]
        changes.append(change)
    return changes
