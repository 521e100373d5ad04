"""What `bench plan` does: rank layouts for a tag, find the fewest nodes for a target, and calibrate the
planner on measured runs or the published reference rows. The model itself is in nlp_bench.plan; this
module joins it to the benchmark definitions and the result store."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from nlp_bench.errors import BenchError, PlanError
from nlp_bench.plan import calibrate, points, ranking, timing, validation
from nlp_bench.plan.ranking import Prediction, Space
from nlp_bench.spec.batch import DEFAULT_BATCH_RULE, KEEP_GAS
from nlp_bench.spec.benchmark import load_benchmark

#: The keys every object of `bench plan --json` has (docs/design.md, "Contracts"; tests pin them).
JSON_KEYS = ("nodes", "tp", "pp", "cp", "dp", "vp", "mbs", "gas", "global_batch_size", "recompute",
             "distributed_optimizer", "sequence_parallel", "memory_gib", "fits", "tokens_per_s", "tokens_per_s_low",
             "tokens_per_s_high", "time_to_report_s", "extrapolated", "outside_corpus", "reason", "calibrated", "command")
#: The keys of `bench plan validate --json` (docs/planner.md, "How far to trust it").
VALIDATE_KEYS = ("id", "publication", "source", "model", "system", "nodes", "tp", "pp", "dp", "measured",
                 "predicted", "error", "interval", "inside")


def _progress(done: int, total: int) -> None:
    """One line on a terminal's stderr, rewritten in place; nothing in a pipe or a log, where an error must
    stay the only line."""
    import sys

    if sys.stderr.isatty():
        print(f"\rvalidating the planner on its corpus, one publication held out at a time (once per corpus and "
              f"model version): "
              f"{done + 1}/{total}", end="" if done + 1 < total else "\n", file=sys.stderr, flush=True)


def trust(results_dir: Path) -> validation.Trust:
    """The corpus fit and its leave-one-source-out errors (computed once, then read from the results folder)."""
    try:
        return validation.corpus_trust(results_dir, _progress)
    except timing.NotPlannable as exc:
        raise PlanError(f"the planner corpus names a system the planner cannot time: {exc}") from None


def efficiency(results_dir: Path, system: str, basis: validation.Trust) -> tuple[timing.Efficiency, bool]:
    """The system's own calibration and True, or the corpus fit and False."""
    own = calibrate.load(results_dir, system)
    return (own, True) if own is not None else (basis.efficiency, False)


def _batch_space(space: dict, base: points.Planned) -> dict:
    """The space with the batch rule applied (spec.batch): keep-gas pins the tag's gas where no gas or global
    batch is given; keep-global-batch (the default) is the space's own way."""
    rule = space.pop("batch", None) or DEFAULT_BATCH_RULE
    if rule == KEEP_GAS and not space.get("gas") and not space.get("global_batch_size"):
        space["gas"] = (base.candidate.layout.gas,)
    return space


def _expert_pins(space: dict, base: points.Planned) -> None:
    """--ep and --etp pin a model's experts: a dense model has none to spread."""
    if (space.get("ep") or space.get("etp")) and base.model.moe is None:
        raise PlanError(f"--ep/--etp pin the experts' layout, and model {base.model.name} has no experts")


def plan(results_dir: Path, benchmark: str, tag: str | None, system: str | None, space: dict,
         top: int, model: str | None = None) -> tuple[list[Prediction], list[Prediction], bool, points.Planned]:
    """(best layouts, pruned layouts, calibrated?, the tag's own point) for the tag on the system; `model` (a
    preset or a file of Megatron-LM flag names) replaces the tag's model, which keeps the tag's nodes, batch
    and switches."""
    base = points.from_point(load_benchmark(benchmark).point(tag, system))
    if model is not None:
        from dataclasses import replace

        from nlp_bench.plan import explicit

        base = replace(base, model=explicit.load_model(model))
    _expert_pins(space, base)
    space = _batch_space(space, base)
    basis = trust(results_dir)
    eff, calibrated = efficiency(results_dir, base.system.name, basis)
    nodes = space.pop("nodes") or (base.candidate.layout.nodes,)
    try:
        good, pruned = ranking.rank(base.model, base.system, Space(nodes=tuple(nodes), **space), base.candidate, eff,
                                    basis)
    except timing.NotPlannable as exc:
        raise PlanError(str(exc)) from None
    if not good and not pruned:
        raise PlanError(f"no layout of {base.model.name} on {base.system.name} in this space: "
                        + ranking.unreachable(base.model, base.system, Space(nodes=tuple(nodes), **space),
                                              base.candidate))
    return good[:top], pruned, calibrated, base


def run_line(benchmark: str, tag: str, system: str | None, base: points.Planned, p: Prediction) -> str | None:
    """The `bench run` line whose point is this layout, predicted as it is here (None for a layout that does not
    fit or run): the tag, and what differs from the tag's own point (`--gas` where the global batch does, as the
    tag's global batch is otherwise kept and gas follows from it)."""
    import shlex

    if not p.fits:
        return None
    lay, own, on, tag_on = p.candidate.layout, base.candidate.layout, p.candidate.switches, base.candidate.switches
    words = ["bench", "run", *(["--benchmark", benchmark] if benchmark != "nlp" else []), "--tag", tag,
             *(["--system", system] if system is not None else [])]
    for name in ("nodes", "tp", "pp", "vp", "mbs", "ep", "etp"):
        if getattr(lay, name) != getattr(own, name) and getattr(lay, name) is not None:
            words += [f"--{name}", str(getattr(lay, name))]
    if lay.global_batch_size != own.global_batch_size:
        words += ["--gas", str(lay.gas)]
    if on.recompute != tag_on.recompute:
        words += ["--recompute", on.recompute]
    if on.distributed_optimizer != tag_on.distributed_optimizer:
        words.append("--distributed-optimizer" if on.distributed_optimizer else "--no-distributed-optimizer")
    return shlex.join(words)


def run_lines(benchmark: str, tag: str | None, system: str | None, model: str | None,
              shown: list[Prediction]) -> tuple[list[str | None], str | None]:
    """(run_line of each layout shown, none where `model` replaced the tag's as no tag trains it; the name of
    the submission rules the tag's runs are checked against, or None)."""
    point = load_benchmark(benchmark).point(tag, system)
    if model is not None:
        return [None] * len(shown), point.rules
    base = points.from_point(point)
    return [run_line(benchmark, point.tag, system, base, p) for p in shown], point.rules


def predict_rows(results_dir: Path, path: Path) -> list[dict]:
    """`bench plan predict ROWS.yaml`: each stated layout's prediction with the keys of `bench plan --json`,
    its id and the names of its model and system; a row the planner cannot answer says why in `reason`."""
    from nlp_bench.plan import explicit

    rows = explicit.load_rows(path)
    basis = trust(results_dir)
    own: dict[str, tuple[timing.Efficiency, bool]] = {}
    out = []
    for row in rows:
        if row.planned is None:
            out.append({"id": row.id, **_unanswered(row.stated, row.refused)})
            continue
        p = row.planned
        if p.system.name not in own:
            own[p.system.name] = efficiency(results_dir, p.system.name, basis)
        eff, calibrated = own[p.system.name]
        try:
            found = {**ranking.predict(p.model, p.system, p.candidate, eff, basis).to_dict(), "calibrated": calibrated,
                     "command": None, "model": p.model.name, "system": p.system.name}
        except timing.NotPlannable as exc:
            found = _unanswered(row.stated, f"the planner cannot time {p.system.name}: {exc}")
        out.append({"id": row.id, **found})
    return out


def _unanswered(stated: dict, reason: str) -> dict:
    """The keys of a prediction, with the layout as stated and no figures."""
    blank = dict.fromkeys(JSON_KEYS)
    return {**blank, **stated, "dp": None, "gas": None, "fits": None, "extrapolated": None, "outside_corpus": [],
            "reason": reason, "calibrated": False}


def target(results_dir: Path, benchmark: str, tag: str | None, system: str | None, space: dict,
           seconds: float) -> tuple[Prediction | None, bool, points.Planned]:
    base = points.from_point(load_benchmark(benchmark).point(tag, system))
    _expert_pins(space, base)
    space = _batch_space(space, base)
    basis = trust(results_dir)
    eff, calibrated = efficiency(results_dir, base.system.name, basis)
    space.pop("nodes", None)
    try:
        best = ranking.smallest_nodes(base.model, base.system, Space(nodes=(1,), **space), base.candidate, eff,
                                      seconds, trust=basis)
    except timing.NotPlannable as exc:
        raise PlanError(str(exc)) from None
    return best, calibrated, base


def validate(results_dir: Path) -> dict:
    """`bench plan validate`: each publication's rows predicted by a fit on the other publications' (and each
    system's and scale band's by a fit without it), checked against the interval the other kinds' errors give,
    and each row against the interval its kind would carry were its publication unseen."""
    basis = trust(results_dir)
    by_way = {way: {c.id: c for c in found} for way, found in basis.held_out.items()}
    carried = {c.id: (low, high) for c, low, high in basis.carried_check()}
    rows = [{"id": c.id, "publication": c.publication, "source": c.source, "model": c.model, "system": c.system,
             "nodes": c.nodes, "gpus": c.devices, "scale": validation.scale_band(c.devices), "tp": c.tp, "pp": c.pp,
             "dp": c.dp, "measured": round(c.measured, 1), "predicted": round(c.predicted, 1),
             "error": round(c.error, 4), "interval": [round(c.others_low, 4), round(c.others_high, 4)],
             "inside": c.inside,
             "held_out_errors": {way: round(found[c.id].error, 4) for way, found in by_way.items()},
             "carried_interval": [round(v, 4) for v in carried[c.id]],
             "carried_inside": carried[c.id][0] <= c.error <= carried[c.id][1]}
            for c in basis.checked]
    kinds = {way: [k.to_dict() for k in found] for way, found in basis.kinds().items()}
    worst = {way: max(found, key=lambda k: (k["median_abs_error"], -k["coverage"])) for way, found in kinds.items()}
    half = [(1 / (1 + low) - 1 / (1 + high)) / 2 for low, high in carried.values()]
    found = memory_check()
    return {"held_out": "publication", "held_out_ways": list(basis.held_out), "publications": basis.publications,
            "rows_at_1000_gpus_or_more": sum(c.devices >= 1000 for c in basis.checked), "rows": rows, **found,
            "median_abs_error": round(basis.median_abs_error, 4), "max_abs_error": round(basis.max_abs_error, 4),
            "coverage": round(basis.coverage, 4), "mean_interval_half_width": round(basis.mean_half_width, 4),
            "error_quantiles": [round(basis.error_low, 4), round(basis.error_high, 4)],
            "kinds": kinds, "worst_kind": worst,
            "carried_coverage": round(sum(r["carried_inside"] for r in rows) / len(rows), 4),
            "carried_mean_half_width": round(sum(half) / len(half), 4),
            "efficiency": basis.efficiency.to_dict(), "pinned": basis.pinned}


#: how many misclassified layouts `bench plan validate` names
MISSES_SHOWN = 20


def memory_check() -> dict:
    """The memory model against what ran and what did not: the time corpus's rows (every one ran) and the
    published sweeps of planner-memory.yaml (layouts that ran, and layouts with no figure, taken as did not
    fit). `ran_predicted_to_fit` [k, n]: k of the n that ran are predicted to fit; `oom_predicted_not_to_fit`
    [k, n]: k of the n that did not are predicted not to; `memory_misses`: the ids of the first misses."""
    from nlp_bench.plan import memory
    from nlp_bench.plan.corpus import load_corpus
    from nlp_bench.plan.outcomes import load_outcomes
    from nlp_bench.spec.models import pad_vocab

    ran = fit = oom = refused = 0
    misses: list[str] = []
    for row in load_corpus():
        p = row.planned
        gib = memory.footprint(p.model, pad_vocab(p.model.vocab_size, p.candidate.layout.tp), p.candidate).gib
        ok = p.system.device_memory_gib is None or gib <= p.system.device_memory_gib
        ran, fit = ran + 1, fit + ok
        if not ok:
            misses.append(row.id)
    for o in load_outcomes():
        if o.ran:
            ran, fit = ran + 1, fit + o.predicted_to_fit
        else:
            oom, refused = oom + 1, refused + (not o.predicted_to_fit)
        if o.ran != o.predicted_to_fit:
            misses.append(o.id)
    return {"ran_predicted_to_fit": [fit, ran], "oom_predicted_not_to_fit": [refused, oom],
            "memory_misses": misses[:MISSES_SHOWN]}


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
    """Each completed point's measured tokens/s, planned from the point.json its analysis read."""
    from nlp_bench.analysis.results import analysed_points
    from nlp_bench.store import states
    from nlp_bench.store.runs import find_run

    out = []
    for ref in refs:
        run_ = find_run(results_dir, ref)
        for found in analysed_points(run_):
            tokens = found.row.get("Tokens/sec")
            if found.row.get("state") != states.COMPLETED or not tokens:
                continue
            out.append((points.from_point_json(found.record.data), float(tokens), f"{run_.id}/{found.row['point']}"))
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


def fit_points(results_dir: Path, found: list[tuple[points.Planned, float, str]]) -> dict[str, tuple[calibrate.Fit, list[tuple[str, float, float]]]]:
    """A fit per system, with (label, predicted, measured) for each point."""
    by_system: dict[str, list] = defaultdict(list)
    for item in found:
        by_system[item[0].system.name].append(item)
    out = {}
    start = trust(results_dir).efficiency
    for name, items in by_system.items():
        def predict(eff, items=items):
            return [ranking.predict(p.model, p.system, p.candidate, eff).tokens_per_s
                    for p, _, _ in items]
        try:
            result = calibrate.fit_system(predict, [m for _, m, _ in items], [label for *_, label in items], start)
        except timing.NotPlannable as exc:
            raise PlanError(str(exc)) from None
        checks = [(label, pred, meas) for (_, meas, label), pred in zip(items, predict(result.efficiency), strict=False)]
        out[name] = (result, checks)
    return out


def calibrate_and_store(results_dir: Path, refs: list[str], benchmark: str = "nlp") -> dict:
    fits = fit_points(results_dir, measured(results_dir, refs, benchmark))
    for name, (result, _) in fits.items():
        calibrate.save(results_dir, name, result)
    return fits


class Predictor:
    """What the planner predicts for one benchmark point at a time (a sweep streams its points through
    it); the fitted efficiencies are read once per system."""

    def __init__(self, results_dir: Path) -> None:
        self.results_dir = results_dir
        self._efficiencies: dict[str, tuple[timing.Efficiency, bool]] = {}
        self._trust: validation.Trust | None = None

    def __call__(self, point) -> dict | None:
        """tokens/s with its interval, memory, fits, reason, extrapolated (and what lies outside the corpus) and
        calibrated; None on a system the planner cannot time."""
        planned = points.from_point(point)
        name = planned.system.name
        try:
            if self._trust is None:
                self._trust = trust(self.results_dir)
        except BenchError:  # no corpus (a root without results/reference): a run needs no prediction
            return None
        if name not in self._efficiencies:
            self._efficiencies[name] = efficiency(self.results_dir, name, self._trust)
        eff, calibrated = self._efficiencies[name]
        try:
            p = ranking.predict(planned.model, planned.system, planned.candidate, eff, self._trust)
        except timing.NotPlannable:
            return None
        return {"tokens_per_s": p.tokens_per_s, "tokens_per_s_low": p.tokens_per_s_low,
                "tokens_per_s_high": p.tokens_per_s_high, "memory_gib": p.memory_gib, "fits": p.fits,
                "reason": p.reason, "extrapolated": p.extrapolated, "outside_corpus": list(p.outside),
                "calibrated": calibrated}


def predictions(results_dir: Path, pts: list) -> dict[str, dict]:
    """What the planner predicts for each benchmark point (by id); points on a system the planner cannot
    time are left out."""
    predict = Predictor(results_dir)
    return {point.id: found for point in pts if (found := predict(point)) is not None}
