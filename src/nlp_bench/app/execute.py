"""`bench run` and `bench sweep`: the pipeline from a tag or a grid to result rows, spec -> render -> workspace
-> launch -> analyse."""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nlp_bench.analysis import metrics, parsers
from nlp_bench.analysis.results import Problems, run_rows
from nlp_bench.errors import BenchError, PlanError, SpecError
from nlp_bench.launch.executor import Executor, get_executor, wait
from nlp_bench.launch.refresher import Refresher
from nlp_bench.launch.render import render_compile_script, render_jobscript
from nlp_bench.report.console import progress_bar, say, warn
from nlp_bench.report.table import render, terminal_width
from nlp_bench.spec.batch import HOW_WORDS
from nlp_bench.spec.benchmark import Point, load_benchmark
from nlp_bench.spec.megatron.target import checkout_for, for_megatron, table_note
from nlp_bench.spec.trainers import MEGATRON_LM
from nlp_bench.store import locks, states
from nlp_bench.store.dropped import DroppedLog, dropped_rows
from nlp_bench.store.files import StoreError, naming
from nlp_bench.store.names import COMPILE_SCRIPT, DROPPED_CSV, JOB_ERR, JOB_OUT, JOBSCRIPT, LOCAL_LOCK
from nlp_bench.store.point_folder import PointDir
from nlp_bench.store.runs import Run, create_run, find_run


@dataclass(frozen=True)
class LaunchOptions:
    """How a run's jobs are launched and watched (the CLI's --wait, --hang-timeout and --after)."""

    wait: bool = False
    hang_timeout_s: int | None = None  # None: the jobscript's default
    #: Slurm job ids the new jobs wait for (afterok): they start only if those completed
    after: str | None = None
    #: #SBATCH options over the profile's and the tag's (--account, --partition, ..., --sbatch KEY=VALUE)
    sbatch: tuple[tuple[str, str], ...] = ()
    #: submit points the planner predicts not to fit in device memory
    force: bool = False

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


class LogFollower:
    """Reads new complete lines of a growing job.out and keeps its iteration records."""

    def __init__(self, path: Path, figure: metrics.JubeFigure) -> None:
        self.path, self.offset, self.partial, self.last = path, 0, "", None
        self.figure = figure

    def update(self) -> parsers.Record | None:
        """The latest record (None before the first); every new one goes into the figure."""
        if self.path.is_file():
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
            self.offset += len(chunk)
            lines = (self.partial + chunk.decode("utf-8", "replace")).split("\n")
            self.partial = lines.pop()
            for record in filter(None, (parsers.parse_line(line, terminated=True) for line in lines)):
                self.figure.add(record)
                self.last = record
        return self.last


def _watch(executor, point_dir: Path) -> str:
    """Wait for the job with a progress bar fed by the trainer's own iteration lines."""
    point = PointDir(point_dir).point()
    follower = LogFollower(point_dir / JOB_OUT, metrics.JubeFigure(point.seq_length, point.global_batch_size))
    with progress_bar(point.id, point.planned_iterations(), info=True) as bar:
        bar.update(info="starting")

        def on_poll(state: str) -> None:
            rec = follower.update()
            if rec is None:
                bar.update(info=state.lower())
                return
            tps = follower.figure.value
            figure = f"{tps:,.0f} tokens/s (JUBE: every interval so far)" if tps else "tokens/s not known yet"
            loss = f", loss {rec.loss:.3f}" if rec.loss is not None else ""
            bar.update(completed=rec.iteration, total=rec.total_iterations, info=figure + loss)

        return wait(executor, point_dir, interval_s=0.5, on_poll=on_poll)


def execute_run(results_dir: Path, benchmark_name: str, tag: str | None, system: str | None, dry_run: bool,
                layout: dict, options: LaunchOptions = LaunchOptions(), trainer: str | None = None) -> int:
    """`bench run`: one point (`layout`: the overrides of Benchmark.point, the batch rule among them).
    Returns the exit code for the CLI: 0 success, 1 a job that failed."""
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
                  top: int | None = None, keep_unfit: bool = False, trainer: str | None = None,
                  batch: str | None = None) -> int:
    """`bench sweep`: every point of a grid file, streamed: points the planner predicts not to fit in device
    memory are dropped too (with the predicted memory; `keep_unfit` trusts the grid instead), and with
    `top` only the K points it predicts fastest are run. Every dropped point is logged with its reason.
    A sweep that would write more than `max_points` point folders writes nothing and says how to narrow it."""
    from nlp_bench.app.planning import Predictor
    from nlp_bench.sweep.grid import LAYOUT, Dropped, combinations, load_grid, outcomes

    grid = load_grid(grid_path)
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
    first = points[0]
    try:
        return _execute(results_dir, first.benchmark, first.tag, points, dry_run, options, chosen.predicted,
                       {"grid": str(grid_path), "grid_spec": grid.raw, "combinations": total,
                        "dropped_by_rule": dict(log.counts), "dropped_file": DROPPED_CSV},
                       on_write=log.keep, on_run=lambda run: _show_dropped(run, log, verbose))
    except BaseException:
        log.discard()
        raise


def _show_dropped(run: Run, log: DroppedLog, verbose: bool) -> None:
    """Show some of the dropped points (all with --verbose); the run keeps them all."""
    shown = 0
    for row in dropped_rows(run.path):
        if not verbose and shown == 10:
            say(f"  ... and {log.total - shown:,} more (--verbose lists them; {run.path / DROPPED_CSV} keeps them all)")
            break
        where = " ".join(f"{k}={row[k]}" for k in ("nodes", "tp", "pp", "mbs", "gas"))
        say(f"  dropped {where}: {row['reason']}")
        shown += 1


def _execute(results_dir: Path, benchmark: str, tag: str, points: list[Point], dry_run: bool,
             options: LaunchOptions, predicted: dict[str, dict] | None = None, extra: dict | None = None,
             on_write: Callable[[Path], object] | None = None, on_run: Callable[[Run], None] | None = None) -> int:
    if options.sbatch:
        points = [dataclasses.replace(p, sbatch={**p.sbatch, **dict(options.sbatch)}) for p in points]
    system = points[0].system
    executor = get_executor(system.executor)
    options.check(executor)
    if not dry_run:
        executor.check_available()  # fail before anything is written
    if any(p.trainer == MEGATRON_LM for p in points):
        checkout = checkout_for(system, required=not dry_run)  # a run's points share their system
        points = [for_megatron(p, checkout) for p in points]
        note = next(filter(None, map(table_note, points)), None)
        if note:
            warn(f"bench: warning: {note}" + ("; a run without --dry-run refuses to submit" if checkout is None else ""))
    from nlp_bench.app.planning import predictions

    if predicted is None:
        predicted = predictions(results_dir, points)
    _preflight(points, predicted, dry_run, options.force)

    def write(folder: Path) -> None:
        """Everything a run holds, into the folder that becomes the run once it is complete."""
        if on_write is not None:
            on_write(folder)
        with progress_bar("writing point folders", len(points), threshold=500) as bar:
            for point in points:
                written = PointDir(folder / point.id)
                written.write_point(point.to_dict(), render_jobscript(point, options.hang_timeout_s),
                                    render_compile_script(point))
                if point.id in predicted:
                    written.write_prediction(predicted[point.id])
                bar.advance()

    run = create_run(results_dir, benchmark, tag, system.name, [p.id for p in points], write, **(extra or {}))
    if on_run is not None:
        on_run(run)
    folders = run.point_dirs()
    say(f"run {run.id}: {benchmark} tag {tag} on {system.name}, {len(points)} point(s)")
    say(f"  {_batches(points)}")
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


def _preflight(points: list[Point], predicted: dict[str, dict], dry_run: bool, force: bool) -> None:
    """Before node-hours are spent: a point predicted not to fit in device memory (unless `force`), and a site
    profile a job cannot run from as it is (a placeholder left, an environment or data file that is not
    there), refuse the submission in one line; a dry run says the same as warnings."""
    from nlp_bench.app.doctor import FAIL, WARN, site_checks

    problems = [f"{p.id}: {p.unrunnable}" for p in points if p.unrunnable]
    problems += [f"{p.id} is predicted not to fit: {predicted[p.id]['reason']} (bench plan; --force submits it anyway)"
                 for p in points if not force and p.id in predicted and not predicted[p.id]["fits"]
                 and not p.unrunnable]
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


def _batches(points: list[Point]) -> str:
    """The global batch the points train and the rule that made it: one point's own words, else the range."""
    if len(points) == 1 and points[0].batch is not None:
        return points[0].batch.words()
    sizes = sorted({p.layout.global_batch_size for p in points})
    hows = sorted({HOW_WORDS[p.batch.how] for p in points if p.batch is not None})
    shown = f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]} to {sizes[-1]}"
    tag = points[0].batch.tag_global_batch_size if points[0].batch is not None else None
    beside = f"; the tag's is {tag}" if tag is not None and sizes != [tag] else ""
    return f"global batch {shown} ({', '.join(hows) or 'as recorded'}{beside})"


def _chain(folder: Path) -> tuple[str, ...]:
    """The point's scripts in the order they run: the compile job first where the system compiles ahead."""
    return (COMPILE_SCRIPT, JOBSCRIPT) if (folder / COMPILE_SCRIPT).is_file() else (JOBSCRIPT,)


class _Interrupted(Exception):
    """Ctrl-C while a local job ran: the job was cancelled."""


def _run_point(executor: Executor, refresher: Refresher, folder: Path, options: LaunchOptions,
               again: bool) -> str | None:
    """Submit the point's job holding its lock, after reading its state once more right then: another
    bench (a resume, a second sweep) may have submitted it since this one looked. Where the executor does
    not queue, the lock is held until the job ends, and the job waits for any other local job of the same
    results folder to end first: two benchmarks measured side by side measure each other. Returns the
    job's state, or None when it was skipped (and says why)."""
    point = PointDir(folder)
    try:
        with point.locked():
            state = refresher.refresh(folder)
            if state not in (states.RERUNNABLE if again else {states.NOT_SUBMITTED}):
                say(f"  {folder.name}: {state}, left as it is")
                return None
            if point.attempt() is not None:
                point.keep_earlier_output()
            if executor.queues:
                job_id = executor.submit(folder, _chain(folder), options.after_ids)
                ids = point.attempt().chain_job_ids
                if len(ids) > 1:
                    say(f"  {folder.name}: {executor.name} compile job {ids[0]}, then run job {job_id} (afterok)")
                else:
                    say(f"  {folder.name}: {executor.name} job {job_id}")
                return states.PENDING
            with _alone(folder.parent.parent.parent / LOCAL_LOCK, folder.name):
                return _run_here(executor, folder, options)
    except locks.Busy as exc:
        say(f"  {folder.name}: skipped, {exc}")
        return None


@contextlib.contextmanager
def _alone(lock: Path, name: str):
    """Hold the results folder's local-job lock, saying so when another bench's job has it first."""
    try:
        with locks.hold(lock, f"the local jobs of {lock.parent}"):
            yield
            return
    except locks.Busy as exc:
        say(f"  {name}: waiting, {exc}")
    with locks.hold(lock, f"the local jobs of {lock.parent}", wait=True):
        yield


def _run_here(executor: Executor, folder: Path, options: LaunchOptions) -> str:
    """Start the job on this machine and watch it to its end; Ctrl-C cancels it."""
    job_id = None
    try:
        job_id = executor.submit(folder, _chain(folder), options.after_ids)
        return _watch(executor, folder)
    except KeyboardInterrupt:
        attempt = PointDir(folder).attempt()
        if attempt is not None and attempt.job_id is not None:
            executor.cancel(folder)
            warn(f"interrupted: job cancelled; its output is in {folder}")
        else:
            executor.poll(folder)  # interrupted before the job started: recorded as such
            warn(f"interrupted before the job of {folder.name} started")
        raise _Interrupted from None
    except StoreError as exc:
        if job_id is None:
            raise
        raise StoreError(f"{exc}; job {job_id} was left as it is: once this is fixed, `bench status` (run from the "
                         "folder's results root) records how it ended") from None


def _launch(run: Run, executor: Executor, folders: list[Path], options: LaunchOptions, again: bool = False) -> int:
    """Submit every point where the executor queues jobs; else run them one after another, watching each.
    `again`: a resume, which may run points that ended without completing."""
    refresher = Refresher(executor)
    failed = 0
    for folder in folders:
        try:
            final = _run_point(executor, refresher, folder, options, again)
        except _Interrupted:
            return 130
        if executor.queues or final is None or final == states.COMPLETED:
            continue
        failed += 1
        attempt = PointDir(folder).attempt()
        warn(f"bench: {folder.name} ended {final} ({attempt.failure_class}: {attempt.failure_detail}); "
                      f"see {folder / JOB_OUT} and {folder / JOB_ERR}")
    if executor.queues:
        if not options.wait:
            say(f"  when they end: bench result table {run.id}")
            return 0
        return _wait_all(run, executor, folders)
    _print_table(run)
    return 1 if failed else 0


def _print_table(run: Run) -> None:
    problems = Problems()
    print(render(run_rows(run, problems), "pretty", width=terminal_width()), end="")
    for line in problems.lines:
        warn(f"bench: warning: {line}")


def _wait_all(run: Run, executor: Executor, folders: list[Path]) -> int:
    """Block until every job has ended, with a progress bar; then print the result table."""
    with progress_bar("waiting", len(folders), info=True) as bar:
        refresher = Refresher(executor)
        while True:
            refresher.prefetch(folders)
            finals = [refresher.refresh(f) for f in folders]
            done = sum(s in states.SETTLED for s in finals)
            counts = {s: finals.count(s) for s in sorted(set(finals))}
            info = ", ".join(f"{n} {s.lower()}" for s, n in counts.items())
            if executor.silence:
                info += f"; Slurm did not answer ({executor.silence})"
            bar.update(completed=done, info=info)
            if done == len(folders):
                break
            time.sleep(2.0)
    _print_table(run)
    return 0 if all(s == states.COMPLETED for s in finals) else 1


def resume(results_dir: Path, run_ref: str, options: LaunchOptions = LaunchOptions(), dry_run: bool = False) -> int:
    """Run again every point of a run that has not completed; finished results are never touched, jobs
    still queued or running are left alone, and a failed attempt's output is kept as job.out.N. A point
    another bench is launching is skipped with a note. With dry_run, only say which points that would be."""
    run = find_run(results_dir, run_ref)
    refresher = Refresher()
    todo, skipped, problems = [], [], []
    for point in run.points():
        if not point.exists():
            problems.append(f"{point.path}: missing (run.json lists it; the folder was moved or removed): it cannot "
                            "be run again; start a new run for it")
            continue
        try:
            state = refresher.refresh(point.path)
            why = point.point().data.get("unrunnable") if state in states.RERUNNABLE else None
        except BenchError as exc:
            problems.append(f"{naming(point.path, exc)}: the point is left as it is")
            continue
        if why:  # a layout kept for rendering and planning (spec.benchmark's unrunnable), never run
            problems.append(f"{point.id}: {why}")
            continue
        (todo if state in states.RERUNNABLE else skipped).append((point, state))
    say(f"run {run.id}: {len(todo)} point(s) to run again, {len(skipped)} left as they are")
    for point, state in skipped:
        say(f"  kept {point.id} ({state})")
    for line in [*refresher.silences, *problems]:
        warn(f"bench: warning: {line}")
    if dry_run:
        for point, _ in todo:
            say(f"  would run again {point.id}")
    if not todo or dry_run:
        return 1 if problems else 0
    executor = get_executor(todo[0][0].point().executor)
    options.check(executor)
    executor.check_available()
    code = _launch(run, executor, [p.path for p, _ in todo], options, again=True)
    return code or (1 if problems else 0)
