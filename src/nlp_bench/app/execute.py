"""`bench run` and `bench sweep`: the pipeline from a tag or a grid to result rows, spec -> render -> workspace
-> launch -> analyse."""

from __future__ import annotations

import contextlib
import heapq
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from nlp_bench.analysis import parsers
from nlp_bench.analysis.results import run_rows
from nlp_bench.errors import PlanError, SpecError
from nlp_bench.fsio import read_json, write_json_atomic
from nlp_bench.launch import states
from nlp_bench.launch.executor import Executor, wait
from nlp_bench.launch.executors import get_executor
from nlp_bench.launch.render import render_compile_script, render_jobscript
from nlp_bench.report.table import render, terminal_width
from nlp_bench.spec.benchmark import Point, load_benchmark
from nlp_bench.spec.trainers import MEGATRON_LM, megatron_checkout
from nlp_bench.workspace import (
    COMPILE_SCRIPT,
    DROPPED_CSV,
    JOB_ERR,
    JOB_OUT,
    JOBSCRIPT,
    POINT_JSON,
    PREDICTION_JSON,
    DroppedLog,
    argv,
    create_run,
    dropped_rows,
    write_point,
)

console = Console(stderr=True, highlight=False, soft_wrap=True)


@dataclass(frozen=True)
class LaunchOptions:
    """How a run's jobs are launched and watched (the CLI's --wait, --hang-timeout and --after)."""

    wait: bool = False
    hang_timeout_s: int | None = None  # None: the jobscript's default
    #: Slurm job ids the new jobs wait for (afterok): they start only if those completed
    after: str | None = None

    def check(self, executor: Executor) -> None:
        if self.after is not None:
            if not executor.holds_jobs:
                raise SpecError(f"--after needs an executor that holds jobs until others end; {executor.name} "
                                "runs points one after another anyway")
            if not re.fullmatch(r"\d+(_\d+)?(:\d+(_\d+)?)*", self.after):
                raise SpecError(f"--after takes job ids joined by ':' (e.g. 1234:1240), got {self.after!r}")

    @property
    def after_ids(self) -> tuple[str, ...]:
        return tuple(self.after.split(":")) if self.after else ()


def say(text: str) -> None:
    """What the user asked for goes to stdout, plainly, so scripts can read it; progress goes to stderr."""
    print(text, flush=True)


def planned_iterations(point: dict) -> int | None:
    """Iterations the trainer will run, from a point.json."""
    train = point["train"]
    if train.get("train-iters"):
        return int(train["train-iters"])
    if train.get("train-samples"):
        return int(train["train-samples"]) // point["layout"]["global_batch_size"]
    return None


class LogFollower:
    """Reads new complete lines of a growing job.out and keeps the latest iteration record."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.partial, self.last = path, 0, "", None

    def update(self) -> parsers.Record | None:
        if self.path.is_file():
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
            self.offset += len(chunk)
            lines = (self.partial + chunk.decode("utf-8", "replace")).split("\n")
            self.partial = lines.pop()
            for line in lines:
                self.last = parsers.parse_line(line, terminated=True) or self.last
        return self.last


def _watch(executor, point_dir: Path) -> str:
    """Wait for the job with a progress bar fed by the trainer's own iteration lines."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    point = read_json(point_dir / POINT_JSON)
    follower = LogFollower(point_dir / JOB_OUT)
    seq = point["model"]["seq_length"]
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[info]}"), console=console, transient=False) as bar:
        task = bar.add_task(point["id"], total=planned_iterations(point), info="starting")

        def on_poll(state: str) -> None:
            rec = follower.update()
            if rec is None:
                bar.update(task, info=state.lower())
                return
            tps = rec.global_batch_size * seq / rec.iteration_time_s if rec.global_batch_size else 0.0
            loss = f", loss {rec.loss:.3f}" if rec.loss is not None else ""
            bar.update(task, completed=rec.iteration, total=rec.total_iterations,
                       info=f"{tps:,.0f} tokens/s{loss}")

        return wait(executor, point_dir, interval_s=0.5, on_poll=on_poll)


def execute_run(results_dir: Path, benchmark_name: str, tag: str | None, system: str | None, dry_run: bool,
                layout: dict[str, int | None], options: LaunchOptions = LaunchOptions(),
                trainer: str | None = None) -> int:
    """`bench run`: one point. Returns the exit code for the CLI: 0 success, 1 a job that failed."""
    benchmark = load_benchmark(benchmark_name)
    point = benchmark.point(tag, system, trainer=trainer, **layout)
    return _execute(results_dir, benchmark.name, point.tag, [point], dry_run, options)


#: points a sweep writes without being told it may write more (--max-points)
DEFAULT_MAX_POINTS = 1000


@dataclass
class Selection:
    """What a sweep keeps of a grid's stream of outcomes: at most `limit` points (or the `top` fastest by
    the planner's prediction) in memory, every other outcome counted and logged to the DroppedLog."""

    log: DroppedLog
    limit: int
    top: int | None
    keep_unfit: bool
    predict: Callable
    points: list[Point] = field(default_factory=list)
    predicted: dict[str, dict] = field(default_factory=dict)
    runnable: int = 0  # points that passed every check: more than `points` holds when over the limit
    _heap: list = field(default_factory=list)

    def offer(self, point: Point) -> None:
        found = self.predict(point)
        if found is not None and not found["fits"] and not self.keep_unfit:
            self.log.add(_layout(point), f"planner: {found['reason']}", "planner: does not fit in device memory")
            return
        self.runnable += 1
        if self.top is None:
            if len(self.points) < self.limit:
                self.points.append(point)
                self._remember(point, found)
            return
        if found is None:
            raise PlanError(f"--top needs predictions, and system {point.system.name!r} lacks the figures the "
                            "planner times with")
        entry = (found["tokens_per_s"], -self.runnable, point, found)
        out = heapq.heappushpop(self._heap, entry) if len(self._heap) >= self.top else heapq.heappush(self._heap, entry)
        if out is not None:
            tps, _, slower, found = out
            self.log.add(_layout(slower), f"planner: not among the {self.top} fastest (predicted {tps:,.0f} tokens/s, "
                         f"{found['tokens_per_s_low']:,.0f}-{found['tokens_per_s_high']:,.0f} if the planner errs as "
                         f"on its corpus{'; an extrapolation' if found['extrapolated'] else ''})",
                         f"planner: not among the {self.top} fastest")

    def _remember(self, point: Point, found: dict | None) -> None:
        if found is not None:
            self.predicted[point.id] = found

    def finish(self) -> list[Point]:
        """The points to write: in grid order, or fastest first with --top."""
        if self.top is not None:
            for *_, point, found in sorted(self._heap, key=lambda e: (-e[0], -e[1])):
                self.points.append(point)
                self._remember(point, found)
        return self.points


def _layout(point: Point) -> dict[str, int]:
    return {k: getattr(point.layout, k) for k in ("nodes", "tp", "pp", "mbs", "gas")}


def execute_sweep(results_dir: Path, grid_path: Path, tag: str | None, system: str | None, dry_run: bool,
                  no_rules: bool, max_points: int | None, verbose: bool, options: LaunchOptions = LaunchOptions(),
                  top: int | None = None, keep_unfit: bool = False, trainer: str | None = None) -> int:
    """`bench sweep`: every point of a grid file, streamed: points the planner predicts not to fit in device
    memory are dropped too (with the predicted memory; `keep_unfit` trusts the grid instead), and with
    `top` only the K points it predicts fastest are run. Every dropped point is logged with its reason.
    A sweep that would write more than `max_points` point folders writes nothing and says how to narrow it."""
    from nlp_bench.app.planning import Predictor
    from nlp_bench.sweep.grid import LAYOUT, Dropped, combinations, load_grid, outcomes

    grid = load_grid(grid_path)
    limit = max_points or DEFAULT_MAX_POINTS
    if top is not None and top > limit:
        raise SpecError(f"--top {top} would write more than --max-points {limit} point folders; raise --max-points")
    axes = [*LAYOUT, *(n for n in (*grid.matrix, *grid.zipped, *(n for n, _ in grid.derived)) if n not in LAYOUT)]
    log = DroppedLog(axes)
    chosen = Selection(log, limit, top, keep_unfit, Predictor(results_dir))
    total = combinations(grid)
    try:
        with _progress(total, f"expanding {grid_path}") as advance:
            for item in outcomes(grid, tag=tag, system=system, no_rules=no_rules, trainer=trainer):
                if isinstance(item, Dropped):
                    log.add(item.params, item.reason, item.rule)
                else:
                    chosen.offer(item)
                advance()
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
    first = points[0]
    try:
        return _execute(results_dir, first.benchmark, first.tag, points, dry_run, options, chosen.predicted,
                       {"grid": str(grid_path), "grid_spec": grid.raw, "combinations": total,
                        "dropped_by_rule": dict(log.counts), "dropped_file": DROPPED_CSV},
                       on_run=lambda run: _keep_dropped(run, log, verbose))
    except BaseException:
        log.discard()
        raise


def _keep_dropped(run, log: DroppedLog, verbose: bool) -> None:
    """Move the dropped points' log into the new run and show some of them (all with --verbose)."""
    path = log.keep(run)
    shown = 0
    for row in dropped_rows(run):
        if not verbose and shown == 10:
            say(f"  ... and {log.total - shown:,} more (--verbose lists them; {path} keeps them all)")
            break
        where = " ".join(f"{k}={row[k]}" for k in ("nodes", "tp", "pp", "mbs", "gas"))
        say(f"  dropped {where}: {row['reason']}")
        shown += 1


@contextlib.contextmanager
def _progress(total: int, what: str):
    """A progress bar on stderr for grids large enough to take a while; yields the per-item callback."""
    if total < 200_000 or not console.is_terminal:
        yield lambda: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task(what, total=total)
        count = 0

        def advance() -> None:
            nonlocal count
            count += 1
            if count % 10_000 == 0:
                bar.update(task, completed=count)

        yield advance


def _execute(results_dir: Path, benchmark: str, tag: str, points: list[Point], dry_run: bool,
             options: LaunchOptions, predicted: dict[str, dict] | None = None, extra: dict | None = None,
             on_run: Callable | None = None) -> int:
    system = points[0].system
    executor = get_executor(system.executor)
    options.check(executor)
    if not dry_run:
        if any(p.trainer == MEGATRON_LM for p in points):
            megatron_checkout(system.megatron_lm_repo, system.name)  # a run's points share their system
        executor.check_available()  # fail before a workspace is written
    from nlp_bench.app.planning import predictions

    run = create_run(results_dir, benchmark, tag, system.name, points, argv(), **(extra or {}))
    if on_run is not None:
        on_run(run)
    folders = [write_point(run, p, render_jobscript(p, options.hang_timeout_s), render_compile_script(p))
               for p in points]
    if predicted is None:
        predicted = predictions(results_dir, points)
    for point, folder in zip(points, folders, strict=False):
        if point.id in predicted:
            write_json_atomic(folder / PREDICTION_JSON, predicted[point.id], durable=False)
    say(f"run {run.id}: {benchmark} tag {tag} on {system.name}, {len(points)} point(s)")
    say(f"  workspace {run.path}")
    if dry_run:
        if system.compile_command:
            say(f"  {len(folders)} compile + run script pair(s) written (not submitted); submit a pair with:")
            say(f"  cd <point> && sbatch --dependency=afterok:$(sbatch --parsable {COMPILE_SCRIPT}) {JOBSCRIPT}")
        elif len(folders) == 1:
            say(f"  jobscript {folders[0] / JOBSCRIPT} (not submitted)")
            say(f"  submit it with: cd {shlex.quote(str(folders[0]))} && sbatch {JOBSCRIPT}")
        else:
            say(f"  {len(folders)} jobscripts written (not submitted); submit them all with:")
            say(f"  for d in {shlex.quote(str(run.path))}/*/; do (cd \"$d\" && sbatch {JOBSCRIPT}); done")
        return 0
    return _launch(run, executor, folders, options)


def _chain(folder: Path) -> tuple[str, ...]:
    """The point's scripts in the order they run: the compile job first where the system compiles ahead."""
    return (COMPILE_SCRIPT, JOBSCRIPT) if (folder / COMPILE_SCRIPT).is_file() else (JOBSCRIPT,)


def _launch(run, executor: Executor, folders: list[Path], options: LaunchOptions) -> int:
    """Submit every point where the executor queues jobs; else run them one after another, watching each."""
    if executor.queues:
        for folder in folders:
            chain = _chain(folder)
            job_id = executor.submit(folder, chain, options.after_ids)
            if len(chain) > 1:
                compile_id = (states.load(folder) or {}).get("chain_job_ids", ["?"])[0]
                say(f"  {folder.name}: {executor.name} compile job {compile_id}, then run job {job_id} (afterok)")
            else:
                say(f"  {folder.name}: {executor.name} job {job_id}")
        if not options.wait:
            say(f"  when they end: bench result table {run.id}")
            return 0
        return _wait_all(run, executor, folders)
    failed = 0
    for folder in folders:
        executor.submit(folder, _chain(folder), options.after_ids)
        try:
            final = _watch(executor, folder)
        except KeyboardInterrupt:
            executor.cancel(folder)
            console.print(f"interrupted: job cancelled; its output is in {folder}")
            return 130
        if final != states.COMPLETED:
            failed += 1
            info = states.load(folder) or {}
            console.print(f"bench: {folder.name} ended {final} ({info.get('failure_class')}: "
                          f"{info.get('failure_detail')}); see {folder / JOB_OUT} and {folder / JOB_ERR}")
    print(render(run_rows(run), "pretty", width=terminal_width()), end="")
    return 1 if failed else 0


def _wait_all(run, executor, folders: list[Path]) -> int:
    """Block until every job has ended, with a progress bar; then print the result table."""
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]waiting"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[info]}"), console=console) as bar:
        task = bar.add_task("jobs", total=len(folders), info="")
        while True:
            finals = [executor.poll(f) for f in folders]
            done = sum(s in states.TERMINAL for s in finals)
            counts = {s: finals.count(s) for s in sorted(set(finals))}
            bar.update(task, completed=done, info=", ".join(f"{n} {s.lower()}" for s, n in counts.items()))
            if done == len(folders):
                break
            time.sleep(2.0)
    print(render(run_rows(run), "pretty", width=terminal_width()), end="")
    return 0 if all(s == states.COMPLETED for s in finals) else 1


def resume(results_dir: Path, run_ref: str, options: LaunchOptions = LaunchOptions(), dry_run: bool = False) -> int:
    """Run again every point of a run that has not completed; finished results are never touched, jobs
    still queued or running are left alone, and a failed attempt's output is kept as job.out.N.
    With dry_run, only say which points that would be."""
    from nlp_bench.launch.executors import refresh
    from nlp_bench.workspace import RESULT_JSON, find_run

    run = find_run(results_dir, run_ref)
    todo, skipped = [], []
    for folder in run.point_dirs():
        state = refresh(folder) or "NOT_SUBMITTED"
        if state == states.COMPLETED or state in (states.PENDING, states.RUNNING):
            skipped.append(f"{folder.name} ({state})")
            continue
        todo.append(folder)
    say(f"run {run.id}: {len(todo)} point(s) to run again, {len(skipped)} left as they are")
    for line in skipped:
        say(f"  kept {line}")
    if dry_run:
        for folder in todo:
            say(f"  would run again {folder.name}")
    if not todo or dry_run:
        return 0
    executor = get_executor(read_json(todo[0] / POINT_JSON)["system_info"]["executor"])
    options.check(executor)
    executor.check_available()
    for folder in todo:
        attempt = 1
        while (folder / f"{JOB_OUT}.{attempt}").exists():
            attempt += 1
        for name in (JOB_OUT, JOB_ERR):
            if (folder / name).exists():
                (folder / name).rename(folder / f"{name}.{attempt}")
        (folder / RESULT_JSON).unlink(missing_ok=True)
    return _launch(run, executor, todo, options)

