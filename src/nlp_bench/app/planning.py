"""What `bench plan` does: rank layouts for a tag, find the fewest nodes for a target, and calibrate the
planner on measured runs or the published reference rows. The model itself is in nlp_bench.plan; this
module joins it to the benchmark definitions and the result store."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from nlp_bench.errors import PlanError
from nlp_bench.plan import calibrate, points, ranking, timing
from nlp_bench.plan.ranking import Prediction, Space
from nlp_bench.spec.benchmark import load_benchmark

#: The keys every object of `bench plan --json` has (README, "Planning"; tests pin them).
JSON_KEYS = ("nodes", "tp", "pp", "dp", "vp", "mbs", "gas", "global_batch_size", "recompute",
             "distributed_optimizer", "sequence_parallel", "memory_gib", "fits", "tokens_per_s", "time_to_report_s",
             "reason", "calibrated")


def plan(results_dir: Path, benchmark: str, tag: str | None, system: str | None, space: dict,
         top: int) -> tuple[list[Prediction], list[Prediction], bool, points.Planned]:
    """(best layouts, pruned layouts, calibrated?, the tag's own point) for the tag on the system."""
    base = points.from_point(load_benchmark(benchmark).point(tag, system))
    eff, calibrated = calibrate.load(results_dir, base.system.name)
    nodes = space.pop("nodes") or (base.candidate.nodes,)
    try:
        good, pruned = ranking.rank(base.model, base.system, Space(nodes=tuple(nodes), **space), base.candidate, eff,
                                 base.swiglu)
    except timing.NotPlannable as exc:
        raise PlanError(str(exc)) from None
    return good[:top], pruned, calibrated, base


def target(results_dir: Path, benchmark: str, tag: str | None, system: str | None, space: dict,
           seconds: float) -> tuple[Prediction | None, bool, points.Planned]:
    base = points.from_point(load_benchmark(benchmark).point(tag, system))
    eff, calibrated = calibrate.load(results_dir, base.system.name)
    space.pop("nodes", None)
    try:
        best = ranking.smallest_nodes(base.model, base.system, Space(nodes=(1,), **space), base.candidate, eff,
                                   seconds, base.swiglu)
    except timing.NotPlannable as exc:
        raise PlanError(str(exc)) from None
    return best, calibrated, base


def _reference_points(benchmark: str) -> list[tuple[points.Planned, float, str]]:
    """The published rows, each with the flags of the benchmark tag that runs its model on its system."""
    from nlp_bench.analysis.reference import reference_rows

    bench = load_benchmark(benchmark)
    out = []
    for row in reference_rows():
        tag = next((t for t, spec in bench.tags.items() if spec.get("model") == row["model"]), None)
        if tag is None:
            continue
        point = bench.point(tag, row["system"], nodes=row["Nodes"], tp=row["Tensor_Parallel"],
                            pp=row["Pipeline_Parallel"], mbs=row["MBS"], gas=row["GAS"])
        out.append((points.from_point(point), row["Tokens/sec"], f"reference {row['model']} on {row['Nodes']} nodes"))
    return out


def _run_points(results_dir: Path, refs: list[str]) -> list[tuple[points.Planned, float, str]]:
    from nlp_bench.analysis.results import run_results
    from nlp_bench.workspace import find_run

    out = []
    for ref in refs:
        run_ = find_run(results_dir, ref)
        for row, _ in run_results(run_):
            tokens = row.get("Tokens/sec")
            if row.get("state") != "COMPLETED" or not tokens:
                continue
            data = json.loads((run_.path / row["point"] / "point.json").read_text())
            out.append((points.from_point_json(data), float(tokens), f"{run_.id}/{row['point']}"))
    return out


def measured(results_dir: Path, refs: list[str], benchmark: str = "nlp") -> list[tuple[points.Planned, float, str]]:
    """(planned point, measured tokens/s, label) for every completed point of the runs; the word
    `reference` stands for the published reference rows."""
    found = []
    runs = [r for r in refs if r != "reference"]
    if "reference" in refs:
        found += _reference_points(benchmark)
    found += _run_points(results_dir, runs)
    if not found:
        raise PlanError("nothing to calibrate on: no completed point with tokens/s in "
                        + ", ".join(refs or ["the given runs"]))
    return found


def fit_points(found: list[tuple[points.Planned, float, str]]) -> dict[str, tuple[calibrate.Fit, list[tuple[str, float, float]]]]:
    """A fit per system, with (label, predicted, measured) for each point."""
    by_system: dict[str, list] = defaultdict(list)
    for item in found:
        by_system[item[0].system.name].append(item)
    out = {}
    for name, items in by_system.items():
        def predict(eff, items=items):
            return [ranking.predict(p.model, p.system, p.candidate, eff, p.swiglu).tokens_per_s
                    for p, _, _ in items]
        try:
            result = calibrate.fit(predict, [m for _, m, _ in items], [label for *_, label in items])
        except timing.NotPlannable as exc:
            raise PlanError(str(exc)) from None
        checks = [(label, pred, meas) for (_, meas, label), pred in zip(items, predict(result.efficiency), strict=False)]
        out[name] = (result, checks)
    return out


def calibrate_and_store(results_dir: Path, refs: list[str], benchmark: str = "nlp") -> dict:
    fits = fit_points(measured(results_dir, refs, benchmark))
    for name, (result, _) in fits.items():
        calibrate.save(results_dir, name, result)
    return fits


class Predictor:
    """What the planner predicts for one benchmark point at a time (a sweep streams its points through
    it); the fitted efficiencies are read once per system."""

    def __init__(self, results_dir: Path) -> None:
        self.results_dir = results_dir
        self._efficiencies: dict[str, tuple[timing.Efficiency, bool]] = {}

    def __call__(self, point) -> dict | None:
        """tokens/s, memory, fits, reason and calibrated; None on a system the planner cannot time."""
        planned = points.from_point(point)
        name = planned.system.name
        if name not in self._efficiencies:
            self._efficiencies[name] = calibrate.load(self.results_dir, name)
        eff, calibrated = self._efficiencies[name]
        try:
            p = ranking.predict(planned.model, planned.system, planned.candidate, eff, planned.swiglu)
        except timing.NotPlannable:
            return None
        return {"tokens_per_s": p.tokens_per_s, "memory_gib": p.memory_gib, "fits": p.fits, "reason": p.reason,
                "calibrated": calibrated}


def predictions(results_dir: Path, pts: list) -> dict[str, dict]:
    """What the planner predicts for each benchmark point (by id); points on a system the planner cannot
    time are left out."""
    predict = Predictor(results_dir)
    return {point.id: found for point in pts if (found := predict(point)) is not None}
