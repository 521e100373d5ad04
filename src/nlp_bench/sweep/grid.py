"""Grid files: which points a sweep runs.

    benchmark: nlp            # name or path (default nlp)
    tag: "13"                 # the point every axis starts from
    system: juwels-booster    # optional: another system profile
    matrix:                   # cross product of these lists
      tp: [1, 2, 4]
      pp: [2, 4]
    zip:                      # lists stepped together (equal lengths), crossed with the matrix
      nodes: [8, 16]
      gas: [256, 128]
    derived:                  # values computed from the others, in order; expressions
      mbs: "1 if tp < 4 else 2" # may also read the system's devices_per_node
    (an axis `trainer: [builtin, megatron-lm]` runs each point with both trainers, side by side; axes `vp`,
    `recompute: [none, selective, full]` and `distributed_optimizer: [true, false]` choose what `bench plan`
    ranks, as `bench run --vp/--recompute/--[no-]distributed-optimizer` do; for a mixture-of-experts tag, axes
    `ep` and `etp` spread its experts, as `bench run --ep/--etp` do)
    exclude:                  # drop points where an expression holds
      - "tp * pp > 16"
    constraints:              # keep only points where every expression holds
      - "gas >= pp"
    train:                    # Megatron flags added to every point
      log-interval: 5
    batch: keep-gas           # without a gas axis: keep the tag's gas, the batch follows (spec.batch; default
                              # keep-global-batch: the tag's global batch stays, gas follows dp x mbs)

Values are always YAML lists, never comma strings; expressions go through sweep.expr, never eval.
Every point that is dropped is kept with its reason: a layout rule, an exclude, a constraint, a
benchmark rule, or being a duplicate.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nlp_bench.errors import LayoutError, SpecError, did_you_mean
from nlp_bench.spec.batch import DEFAULT_BATCH_RULE, check_rule, choose
from nlp_bench.spec.benchmark import INTERLEAVING_FLAG, Benchmark, Point, load_benchmark
from nlp_bench.spec.layout import RULE_WORDS, data_parallel_size, parallel_violations, replica_problem
from nlp_bench.spec.models import SHAPE, ModelSpec
from nlp_bench.spec.switches import (
    DISTRIBUTED_OPTIMIZER_FLAG,
    PRECISION_FLAGS,
    PRECISIONS,
    RECOMPUTE,
    RECOMPUTE_FLAGS,
    decode,
    precision_flags,
)
from nlp_bench.spec.trainers import TRAINERS
from nlp_bench.spec.yamlio import check_keys, load_yaml
from nlp_bench.sweep.expr import EvaluationError, Expression

LAYOUT = ("nodes", "tp", "pp", "mbs", "gas")
#: the expert layout of an MoE model: expert parallelism and the experts' own tensor parallelism (etp; the
#: tag's, or None where Megatron takes tp)
EXPERT = ("ep", "etp")
MODEL = SHAPE
#: what `bench plan` ranks beside the sizes: an axis of each is what `bench run --vp/--recompute/...` chooses
SETTINGS = ("vp", "recompute", "distributed_optimizer")
#: the train flags each of SETTINGS writes: a grid setting both an axis and its flags is refused
_SETTING_FLAGS = {"vp": (INTERLEAVING_FLAG,), "recompute": RECOMPUTE_FLAGS,
                  "distributed_optimizer": (DISTRIBUTED_OPTIMIZER_FLAG,)}
PARAMETERS = (*LAYOUT, *EXPERT, *MODEL, "precision", "trainer", *SETTINGS)
#: names an expression may read but no axis may set: they come with the system
READ_ONLY = ("devices_per_node",)
#: the most combinations a sweep expands: streaming costs about 21 µs and 14 bytes of memory per combination
#: (benchmark/perf/RESULTS.md, 5·10^6 in 106 s and 106 MB), so this bound is about 3.5 minutes and under 200 MB
#: of expansion, twice the largest grid measured; a grid past it is a typo or a search for the planner
MAX_COMBINATIONS = 10_000_000
_KEYS = {"benchmark", "tag", "system", "description", "matrix", "zip", "derived", "exclude", "constraints", "train",
         "batch"}


@dataclass
class Grid:
    path: Path
    benchmark: str
    tag: str | None
    system: str | None
    matrix: dict[str, list]
    zipped: dict[str, list]
    derived: list[tuple[str, Expression]]
    exclude: list[Expression]
    constraints: list[Expression]
    train: dict[str, Any]
    raw: dict[str, Any]
    #: the global-batch rule for points without a gas axis (spec.batch)
    batch: str = DEFAULT_BATCH_RULE


@dataclass
class Dropped:
    params: dict[str, Any]
    reason: str
    #: what dropped points are counted by: the rule, exclude or constraint, without this point's numbers
    rule: str


@dataclass
class Expansion:
    """A whole expansion in memory: for small grids and tests; sweeps stream outcomes() instead."""

    points: list[Point] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    combinations: int = 0


def _parameter(name: Any, where: str) -> str:
    if name not in PARAMETERS:
        raise SpecError(f"{where}: unknown parameter {name!r}{did_you_mean(str(name), PARAMETERS)}; "
                        f"parameters: {', '.join(PARAMETERS)}")
    return name


def _axis(values: Any, where: str) -> list:
    if not isinstance(values, list):
        hint = " (write a YAML list such as [1, 2], not a comma string)" if isinstance(values, str) else ""
        raise SpecError(f"{where}: values must be a YAML list, got {type(values).__name__}{hint}")
    if not values:
        raise SpecError(f"{where}: the list is empty")
    for v in values:
        if isinstance(v, (dict, list)) or v is None:
            raise SpecError(f"{where}: values must be numbers or strings, got {v!r}")
    return values


def load_grid(path: str | Path) -> Grid:
    path = Path(path)
    data = load_yaml(path, "grid")
    check_keys(data, _KEYS, str(path))
    matrix: dict[str, list] = {}
    zipped: dict[str, list] = {}
    for key, target in (("matrix", matrix), ("zip", zipped)):
        block = data.get(key) or {}
        if not isinstance(block, dict):
            raise SpecError(f"{path}: {key} must be a mapping of parameter to list")
        for name, values in block.items():
            target[_parameter(name, f"{path}: {key}")] = _axis(values, f"{path}: {key}.{name}")
    if zipped and len({len(v) for v in zipped.values()}) > 1:
        lengths = ", ".join(f"{k}: {len(v)}" for k, v in zipped.items())
        raise SpecError(f"{path}: zip lists must have equal lengths ({lengths})")
    both = set(matrix) & set(zipped)
    if both:
        raise SpecError(f"{path}: {', '.join(sorted(both))} is both in matrix and zip")
    derived_block = data.get("derived") or {}
    if not isinstance(derived_block, dict):
        raise SpecError(f"{path}: derived must be a mapping of parameter to expression")
    derived = []
    for name, text in derived_block.items():
        _parameter(name, f"{path}: derived")
        if name in matrix or name in zipped:
            raise SpecError(f"{path}: derived.{name} is also an axis")
        derived.append((name, Expression(text, f"{path}: derived.{name}")))
    rules = {}
    for key in ("exclude", "constraints"):
        block = data.get(key) or []
        if not isinstance(block, list):
            raise SpecError(f"{path}: {key} must be a list of expressions")
        rules[key] = [Expression(text, f"{path}: {key}[{i}]") for i, text in enumerate(block)]
    train = data.get("train") or {}
    if not isinstance(train, dict):
        raise SpecError(f"{path}: train must be a mapping of Megatron flag to value")
    for key in train:
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", str(key)):
            raise SpecError(f"{path}: train: {key!r} is not a Megatron flag name")
    for key in ("benchmark", "tag", "system"):
        if key in data and not isinstance(data[key], (str, int)):
            raise SpecError(f"{path}: {key} must be a name")
    bench = str(data.get("benchmark", "nlp"))
    if bench.endswith((".yaml", ".yml")) and not Path(bench).is_absolute():
        bench = str(path.parent / bench)
    return Grid(path, bench, None if data.get("tag") is None else str(data["tag"]),
                None if data.get("system") is None else str(data["system"]), matrix, zipped, derived,
                rules["exclude"], rules["constraints"], dict(train), data,
                check_rule(data.get("batch", DEFAULT_BATCH_RULE), f"{path}: batch"))


def _base(model: ModelSpec, point: Point) -> dict[str, Any]:
    lay, on = point.layout, decode(point.train)
    return {"nodes": lay.nodes, "tp": lay.tp, "pp": lay.pp, "mbs": lay.mbs, "gas": lay.gas, "ep": lay.ep,
            "etp": lay.etp, "precision": on.precision, "vp": lay.vp, "recompute": on.recompute,
            "distributed_optimizer": on.distributed_optimizer,
            "trainer": point.trainer, **{name: getattr(model, name) for name in MODEL}, **{READ_ONLY[0]: lay.devices_per_node}}


def combinations(grid: Grid) -> int:
    """How many combinations the grid spans, counted without making them."""
    total = len(next(iter(grid.zipped.values()))) if grid.zipped else 1
    for values in grid.matrix.values():
        total *= len(values)
    return total


def check_size(grid: Grid, limit: int = MAX_COMBINATIONS) -> None:
    """Refuse a grid of more than `limit` combinations before any is made: the stream checks a sweep's
    other limits only as points come, so a grid of 10^12 would otherwise run for days before a word."""
    total = combinations(grid)
    if total <= limit:
        return
    factors = [f"{name} {len(values):,}" for name, values in grid.matrix.items() if len(values) > 1]
    if grid.zipped and len(next(iter(grid.zipped.values()))) > 1:
        factors.append(f"zip of {', '.join(grid.zipped)} {len(next(iter(grid.zipped.values()))):,}")
    raise SpecError(f"{grid.path} spans {total:,} combinations ({' x '.join(factors)}), more than the {limit:,} a "
                    f"sweep expands; narrow its lists or use zip")


def expand(grid: Grid, *, tag: str | None = None, system: str | None = None, no_rules: bool = False,
           trainer: str | None = None, limit: int = MAX_COMBINATIONS) -> Expansion:
    """Every outcome of a grid collected in memory (a small grid's, a test's); see outcomes()."""
    out = Expansion(combinations=combinations(grid))
    for item in outcomes(grid, tag=tag, system=system, no_rules=no_rules, trainer=trainer, limit=limit):
        (out.dropped if isinstance(item, Dropped) else out.points).append(item)
    return out


def outcomes(grid: Grid, *, tag: str | None = None, system: str | None = None, no_rules: bool = False,
             trainer: str | None = None, limit: int = MAX_COMBINATIONS,
             batch: str | None = None) -> Iterator[Point | Dropped]:
    """Every combination of the grid, in order, as a resolved Point or as Dropped with its reason.

    A grid of more than `limit` combinations is refused here, when called, not at the first item. The
    stream itself is a generator: memory stays bounded whatever the grid's size, but for the identities of
    the valid points, kept (as 64-bit hashes) to drop duplicates. A combination that breaks a layout rule
    is dropped by the rule check on plain integers, before any Point is made for it. Without a gas axis,
    `batch` (else the grid's `batch`) says whether each point keeps the tag's global batch or its gas."""
    check_size(grid, limit)
    return _stream(grid, tag, system, no_rules, trainer, check_rule(batch or grid.batch))


def _stream(grid: Grid, tag: str | None, system: str | None, no_rules: bool,
            trainer: str | None, batch: str) -> Iterator[Point | Dropped]:
    benchmark = load_benchmark(grid.benchmark)
    tag = tag if tag is not None else grid.tag
    system = system if system is not None else grid.system
    if trainer is not None and "trainer" in (*grid.matrix, *grid.zipped, *(n for n, _ in grid.derived)):
        raise SpecError(f"{grid.path} has a trainer axis; --trainer would override it: drop one of them")
    start = benchmark.point(tag, system, trainer=trainer)
    base = _base(start.model, start)
    axes = {*grid.matrix, *grid.zipped, *(n for n, _ in grid.derived)}
    for name in SETTINGS:
        both = [flag for flag in _SETTING_FLAGS[name] if flag in grid.train]
        if name in axes and both:
            raise SpecError(f"{grid.path} has a {name} axis and sets {', '.join(both)} in train: drop one of them")
    fixed = set(benchmark.tags[start.tag].get("fixed") or [])
    touched = (set(grid.matrix) | set(grid.zipped) | {n for n, _ in grid.derived}) & fixed
    if (set(PRECISION_FLAGS) & set(grid.train)) and "precision" in fixed:
        touched.add("precision")
    if touched and not no_rules:
        raise SpecError(f"the benchmark's rules fix {', '.join(sorted(touched))} for tag {start.tag}; a sweep "
                        f"that changes them is not a benchmark submission: pass --no-rules to run it anyway")
    # nodes, tp and pp set by the grid itself are checked before anything is derived from dp (which is 0 where
    # tp x pp exceeds the devices: a division by zero in the user's expression)
    early = bool(grid.derived) and not {"nodes", "tp", "pp"} & {n for n, _ in grid.derived}
    # without a gas axis the batch rule sets gas, before excludes and constraints read it
    rule = None if "gas" in (*grid.matrix, *grid.zipped, *(n for n, _ in grid.derived)) else batch
    names, zipped = list(grid.matrix), list(grid.zipped)
    rows = list(zip(*grid.zipped.values(), strict=False)) or [()]
    devices, max_nodes = start.layout.devices_per_node, start.system.max_nodes
    experts = start.model.moe.num_experts if start.model.moe else None
    seen: set[int] = set()
    for combo in itertools.product(*(grid.matrix[n] for n in names)):
        for row in rows:
            params = {**base, **dict(zip(names, combo, strict=False)), **dict(zip(zipped, row, strict=False))}
            try:
                problem = early and _replica_rule(params, devices)
                if problem:
                    yield problem
                    continue
                for name, expr in grid.derived:
                    params[name] = expr(params)
                dropped = rule and _batch_rule(params, devices, rule, start)
                dropped = dropped or next((Dropped(params, f"excluded by {e.text!r}", f"exclude {e.text!r}")
                                for e in grid.exclude if e(params)), None)
                dropped = dropped or next((Dropped(params, f"constraint {c.text!r} does not hold",
                                                   f"constraint {c.text!r}") for c in grid.constraints
                                           if not c(params)), None)
                dropped = dropped or _broken_rule(params, devices, max_nodes, experts)
                if dropped:
                    yield dropped
                    continue
                point = _resolve(benchmark, start.tag, system, params, base, grid.train, rule)
            except EvaluationError as exc:  # this point cannot be; the grid itself is fine
                yield Dropped(params, str(exc), "invalid value")
                continue
            except LayoutError as exc:
                yield Dropped(params, str(exc), "layout rule of the system")
                continue
            key = hash(point.id)
            if key in seen:
                yield Dropped(params, f"duplicate of point {point.id}", "duplicate")
                continue
            seen.add(key)
            yield point


def _sizes(params: dict[str, Any], names: tuple[str, ...]) -> list[int] | None:
    """The named sizes where each is a positive integer; None otherwise (the full rule check then names it)."""
    values = [params[n] for n in names]
    return values if all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values) else None


def _batch_rule(params: dict[str, Any], devices_per_node: int, rule: str, start: Point) -> Dropped | None:
    """Set the point's gas as the batch rule says; None, or Dropped where the tag's batch cannot be kept."""
    sizes = _sizes(params, ("nodes", "tp", "pp", "mbs"))
    if sizes is None or replica_problem(sizes[0], devices_per_node, sizes[1], sizes[2]):
        return None  # the layout rules say what is wrong
    nodes, tp, pp, mbs = sizes
    dp = data_parallel_size(nodes * devices_per_node, tp, pp)
    try:
        params["gas"] = choose(rule, start.batch.tag_global_batch_size, start.batch.tag_gas, dp, mbs).gas
    except LayoutError as exc:
        return Dropped(params, str(exc), "the tag's global batch cannot be kept")
    return None


def _replica_rule(params: dict[str, Any], devices_per_node: int) -> Dropped | None:
    sizes = _sizes(params, ("nodes", "tp", "pp"))
    problem = sizes and replica_problem(sizes[0], devices_per_node, sizes[1], sizes[2])
    return Dropped(params, problem[1], problem[0]) if problem else None


def _broken_rule(params: dict[str, Any], devices_per_node: int, max_nodes: int | None,
                 num_experts: int | None = None) -> Dropped | None:
    """The layout rules the combination breaks (spec.layout's rules, on its integers; `num_experts`: the
    model's, for the expert rules), or None."""
    for name in (*LAYOUT, *MODEL, "vp", *EXPERT):
        value = params[name]
        if name == "etp" and value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise EvaluationError(f"{name} must be an integer, got {value!r}")
        if value < 1:
            return Dropped(params, f"{name} must be a positive integer, got {value!r}", f"{name} < 1")
    if max_nodes is not None and params["nodes"] > max_nodes:
        return Dropped(params, f"{params['nodes']} nodes, more than the system's {max_nodes}", "more nodes than the system")
    broken = parallel_violations(
        world=params["nodes"] * devices_per_node, tp=params["tp"], pp=params["pp"], num_layers=params["num_layers"],
        num_attention_heads=params["num_attention_heads"], ffn_hidden_size=params["ffn_hidden_size"],
        hidden_size=params["hidden_size"], devices="devices", chunks=params["vp"], micro_batches=params["gas"],
        ep=params["ep"], etp=params["etp"], num_experts=num_experts)
    return Dropped(params, "; ".join(v.message for v in broken), RULE_WORDS[broken[0].rule]) if broken else None


def _resolve(benchmark: Benchmark, tag: str, system: str | None, params: dict[str, Any], base: dict[str, Any],
             train: dict[str, Any], rule: str | None) -> Point:
    """The point of one combination; `rule`: the batch rule that set its gas (None: gas was an axis)."""
    for name in (*LAYOUT, *MODEL):
        value = params[name]
        if not isinstance(value, int) or isinstance(value, bool):
            raise EvaluationError(f"{name} must be an integer, got {value!r}")
    precision = params["precision"]
    if precision not in PRECISIONS:
        raise EvaluationError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    extra = dict(train)
    changed: dict[str, Any] = {n: params[n] for n in MODEL if params[n] != base[n]}
    if precision != base["precision"]:
        extra.update(precision_flags(precision))
        changed["precision"] = precision
    model = {n: v for n, v in changed.items() if n in MODEL}
    if params["trainer"] not in TRAINERS:
        raise EvaluationError(f"trainer must be one of {', '.join(TRAINERS)}, got {params['trainer']!r}")
    if params["recompute"] not in RECOMPUTE:
        raise EvaluationError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {params['recompute']!r}")
    if not isinstance(params["distributed_optimizer"], bool):
        raise EvaluationError(f"distributed_optimizer must be true or false, got {params['distributed_optimizer']!r}")
    layout = {n: params[n] for n in (*LAYOUT, *EXPERT)}
    if rule is not None:
        layout["gas"] = None  # the point applies the same rule, and says so
    # a setting as the tag has it is left to the tag's flags (and a grid's train block)
    settings = {n: params[n] for n in SETTINGS if params[n] != base[n]}
    point = benchmark.point(tag, system, model=model or None, train=extra or None, trainer=params["trainer"],
                            batch=rule or DEFAULT_BATCH_RULE, **settings, **layout)
    if not changed:
        return point
    # points that differ in more than the layout carry a short digest of the difference in their id
    digest = hashlib.sha1(json.dumps(changed, sort_keys=True).encode()).hexdigest()[:6]
    return dataclasses.replace(point, variant=f"_v{digest}")

