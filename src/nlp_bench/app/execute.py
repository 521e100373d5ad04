"""`bench run` and `bench sweep`: a tag or a grid made into the order of a run, checked before anything is
written, then handed through the run's stages (app.stages); and a resume, which starts an existing run at
its launch stage."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from nlp_bench.app.record_checks import layout_disagreement
from nlp_bench.app.refusals import not_fitting, point_refusals
from nlp_bench.app.stage_records import LaunchOptions, Order, PointOnDisk, Written
from nlp_bench.app.stages import launch_jobs, run_stages
from nlp_bench.app.sweep_selection import DEFAULT_MAX_POINTS, SHOWN_LAYOUT, Selection
from nlp_bench.errors import BenchError, SpecError
from nlp_bench.launch.executor import executor_for, get_executor
from nlp_bench.launch.refresher import Refresher
from nlp_bench.report.console import progress_bar, say, warn
from nlp_bench.spec.benchmark import Point, load_benchmark
from nlp_bench.spec.megatron.target import checkout_for, for_megatron, table_note
from nlp_bench.spec.trainers import MEGATRON_LM
from nlp_bench.store import states
from nlp_bench.store.dropped import DroppedLog, dropped_rows
from nlp_bench.store.files import naming
from nlp_bench.store.names import DROPPED_CSV, JOBSCRIPT
from nlp_bench.store.point_folder import PointDir
from nlp_bench.store.runs import Run, find_run

#: the options of a run without any of the launch flags
_DEFAULTS = LaunchOptions()


def execute_run(results_dir: Path, benchmark_name: str, tag: str | None, system: str | None, dry_run: bool,
                layout: dict, options: LaunchOptions = _DEFAULTS, trainer: str | None = None,
                data_path: str | None = None) -> int:
    """`bench run`: one point (`layout`: the overrides of Benchmark.point, the batch rule among them;
    `data_path`: a dataset in place of the tag's). Returns the exit code for the CLI: 0 success, 1 a job
    that failed."""
    benchmark = load_benchmark(benchmark_name)
    if tag is None:  # the benchmark's default, 175, is 96 nodes: nobody should submit that by leaving out a word
        raise SpecError(f"give --tag, one of {', '.join(benchmark.tags)} (bench tag list says what each is for; smoke "
                        "runs a tiny model on this machine in about a minute)")
    point = benchmark.point(tag, system, trainer=trainer, train=_data(data_path), **layout)
    return run_stages(_order(results_dir, [point], dry_run, options))


def _data(data_path: str | None) -> dict[str, str] | None:
    """--data-path as the trainer's flag: absolute (the job runs in its point folder) and without a .bin or .idx
    the user may have named; a ${NAME} of the site's is left for the job to expand."""
    if data_path is None:
        return None
    if "$" not in data_path:
        path = Path(data_path).expanduser()
        data_path = str((path.with_suffix("") if path.suffix in (".bin", ".idx") else path).absolute())
    return {"data-path": data_path}


def execute_sweep(results_dir: Path, grid_path: Path, tag: str | None, system: str | None, dry_run: bool,
                  no_rules: bool, max_points: int | None, verbose: bool, options: LaunchOptions = _DEFAULTS,
                  top: int | None = None, keep_unfit: bool = False, trainer: str | None = None,
                  batch: str | None = None, data_path: str | None = None) -> int:
    """`bench sweep`: every point of a grid file, streamed: points the planner predicts not to fit in device
    memory are dropped too (with the predicted memory; `keep_unfit` trusts the grid instead), and with
    `top` only the K points it predicts fastest are run. Every dropped point is logged with its reason.
    A sweep that would write more than `max_points` point folders writes nothing and says how to narrow it."""
    from nlp_bench.app.planning import Predictor
    from nlp_bench.sweep.grid import LAYOUT, Dropped, combinations, load_grid, outcomes

    grid = load_grid(grid_path)
    grid.train.update(_data(data_path) or {})  # over the grid's own data-path, as over the tag's
    options = dataclasses.replace(options, force=options.force or keep_unfit)  # --no-plan: the unfit are wanted
    limit = max_points or DEFAULT_MAX_POINTS
    if top is not None and top > limit:
        raise SpecError(f"--top {top} would write more than --max-points {limit} point folders; raise --max-points")
    axes = [*LAYOUT, *(n for n in (*grid.matrix, *grid.zipped, *(n for n, _ in grid.derived)) if n not in LAYOUT)]
    log = DroppedLog(axes)
    chosen = Selection(log, limit, top, keep_unfit, Predictor(results_dir))
    total = combinations(grid)
    try:
        with progress_bar(f"expanding {grid_path}", total, threshold=200_000) as bar:
            for item in outcomes(grid, tag=tag, system=system, no_rules=no_rules, trainer=trainer, batch=batch):
                if isinstance(item, Dropped):
                    log.add(item.params, item.reason, item.rule)
                else:
                    chosen.offer(item)
                bar.advance()
        points = chosen.finish()
        if chosen.top is None and chosen.runnable > limit:
            raise SpecError(f"the grid {grid_path} has {chosen.runnable:,} runnable points ({total:,} combinations), "
                            f"more than --max-points {limit:,}: narrow its lists (or add exclude/constraints), run "
                            f"the planner's fastest K with --top K, or raise --max-points; nothing was written")
        if not points:
            reasons = "; ".join(f"{count} by {rule}" for rule, count in log.counts.most_common(3))
            raise SpecError(f"none of the {total} combinations of {grid_path} is a runnable point (dropped: {reasons})")
    except BaseException:
        log.discard()
        raise
    say(f"grid {grid_path}: {total} combinations, {len(points)} points, {log.total} dropped")
    for rule, count in log.counts.most_common():
        say(f"  dropped {count:,}: {rule}")
    try:
        return run_stages(_order(results_dir, points, dry_run, options, chosen.predicted,
                                 extra={"grid": str(grid_path), "grid_spec": grid.raw, "combinations": total,
                                        "dropped_by_rule": dict(log.counts), "dropped_file": DROPPED_CSV},
                                 on_write=log.keep, on_run=lambda run: _show_dropped(run, log, verbose)))
    except BaseException:
        log.discard()
        raise


def _show_dropped(run: Run, log: DroppedLog, verbose: bool) -> None:
    """Show some of the dropped points (all with --verbose); the run keeps them all."""
    from nlp_bench.sweep.grid import EXPERT

    shown = 0
    for row in dropped_rows(run.path):
        if not verbose and shown == 10:
            say(f"  ... and {log.total - shown:,} more (--verbose lists them; {run.path / DROPPED_CSV} keeps them all)")
            break
        where = " ".join(f"{k}={row[k]}" for k in (*SHOWN_LAYOUT, *(k for k in EXPERT if k in row)))
        say(f"  dropped {where}: {row['reason']}")
        shown += 1


def _order(root: Path, points: list[Point], dry_run: bool, options: LaunchOptions,
           predicted: dict[str, dict] | None = None, extra: dict | None = None,
           on_write: Callable[[Path], object] | None = None, on_run: Callable[[Run], None] | None = None) -> Order:
    """The points as they will be written, with their executor and predictions: everything that can refuse
    a run (an executor that cannot submit here, a point predicted not to fit, a site profile a job cannot
    run from) is asked here, before the first stage writes anything."""
    if options.sbatch:
        points = [dataclasses.replace(p, sbatch={**p.sbatch, **dict(options.sbatch)}) for p in points]
    system = points[0].system  # the points of a run share their system
    executor = executor_for(system)
    options.check(executor)
    if not dry_run:
        executor.check_available()  # fail before anything is written
    if any(p.trainer == MEGATRON_LM for p in points):
        checkout = checkout_for(system, required=not dry_run)
        points = [for_megatron(p, checkout) for p in points]
        note = next(filter(None, map(table_note, points)), None)
        if note:
            warn(f"bench: warning: {note}" + ("; a run without --dry-run refuses to submit" if checkout is None else ""))
    if predicted is None:
        from nlp_bench.app.planning import predictions

        predicted = predictions(root, points)
    _preflight(points, predicted, dry_run, options.force)
    if not dry_run:
        executor.check_answers(system.name)
    first = points[0]
    return Order(root, first.benchmark, first.tag, tuple(points), executor, options, dry_run, predicted, extra or {},
                 on_write, on_run)


def _preflight(points: list[Point], predicted: dict[str, dict], dry_run: bool, force: bool) -> None:
    """Before node-hours are spent: a point predicted not to fit in device memory (unless `force`), and a site
    profile a job cannot run from as it is (a placeholder left, an environment or data file that is not
    there), refuse the submission in one line; a dry run says the same as warnings."""
    from nlp_bench.app.doctor import FAIL, WARN, site_checks

    problems = [line for p in points for line in point_refusals(p, predicted.get(p.id), force)]
    seen, warned = set(), set()
    for point in points:  # the points of a run share their system; their flags name the data
        key = repr(sorted(point.train.items()))
        if key not in seen:
            seen.add(key)
            checks = site_checks(point)
            problems += [c.detail for c in checks if c.status == FAIL and c.detail not in problems]
            for check in checks:
                if check.status == WARN and check.detail not in warned:
                    warned.add(check.detail)
                    warn(f"bench: warning: {check.detail}")
    if not problems:
        return
    if not dry_run:
        more = f" (and {len(problems) - 1} more: bench run --dry-run lists them)" if len(problems) > 1 else ""
        raise SpecError(f"{problems[0]}{more}; nothing was submitted")
    for line in problems:
        warn(f"bench: warning: {line}; a run without --dry-run refuses to submit")


def resume(results_dir: Path, run_ref: str, options: LaunchOptions = _DEFAULTS, dry_run: bool = False) -> int:
    """Run again every point of a run that has not completed; finished results are never touched, jobs
    still queued or running are left alone, and a failed attempt's output is kept as job.out.N. A point
    another bench is launching is skipped with a note. With dry_run, only say which points that would be."""
    run = find_run(results_dir, run_ref)
    refresher = Refresher()
    todo: list[PointOnDisk] = []
    skipped, problems = [], []
    for point in run.points():
        if not point.exists():
            problems.append(f"{point.path}: missing (run.json lists it; the folder was moved or removed): it cannot "
                            "be run again; start a new run for it")
            continue
        try:
            state = refresher.refresh(point.path)
            record = point.point() if state in states.RERUNNABLE else None
        except BenchError as exc:
            problems.append(f"{naming(point.path, exc)}: the point is left as it is")
            continue
        why = record.data.get("unrunnable") if record is not None else None
        if why:  # a layout kept for rendering and planning (spec.benchmark's unrunnable), never run
            problems.append(f"{point.id}: {why}")
        elif record is not None:
            todo.append(PointOnDisk(point.path, record))
        else:
            skipped.append((point, state))
    _refuse_disagreeing(todo)
    if not dry_run:
        _refuse_not_fitting(todo, options.force)
    say(f"run {run.id}: {len(todo)} point(s) to run again, {len(skipped)} left as they are")
    for point, state in skipped:
        say(f"  kept {point.id} ({state})")
    for line in [*refresher.silences, *problems]:
        warn(f"bench: warning: {line}")
    if dry_run:
        for point in todo:
            say(f"  would run again {point.folder.name}")
    if not todo or dry_run:
        return 1 if problems else 0
    executor = get_executor(todo[0].record.executor)
    options.check(executor)
    executor.check_available()
    executor.check_answers(run.record().system)
    # the run's own results folder, which is not --results-dir where the run was named by its path
    written = Written(run, run.path.parent.parent, executor, options, tuple(todo), again=True)
    code = run_stages(written, start=launch_jobs)
    return code or (1 if problems else 0)


def _refuse_not_fitting(todo: list[PointOnDisk], force: bool) -> None:
    """What the dry run predicted not to fit is refused here as `bench run` refuses it (unless --force)."""
    lines = [line for item in todo if (line := not_fitting(item.folder.name, PointDir(item.folder).prediction(), force))]
    if lines:
        more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
        raise SpecError(f"{lines[0]}{more}; nothing was submitted")


def _refuse_disagreeing(todo: list[PointOnDisk]) -> None:
    """A point.json edited by hand names a layout its jobscript does not run: run again, the job would
    measure one layout and the table show another. Refused before anything is submitted, unless the
    jobscript is made again for the layout point.json names."""
    for item in todo:
        point = PointDir(item.folder)
        line = layout_disagreement(point, point.file(JOBSCRIPT), item.record.layout)
        if line:
            raise SpecError(f"{line}: --resume runs the jobscript as it is, so nothing was submitted (restore "
                            "point.json, make the jobscript run its layout, or start a new run for it)")
