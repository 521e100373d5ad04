"""A run as named stages: render, write, launch, wait, analyse. Each stage is a function from one record of
app.stage_records to the next, or to Done where the run ends there (a dry run after write, jobs left to
their scheduler after launch); run_stages hands the records on. A new stage is a function added to STAGES,
not an edit of the stages around it."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nlp_bench.analysis.results import Problems, analysed_points
from nlp_bench.app.local_jobs import Interrupted, alone, chain, run_here
from nlp_bench.app.refusals import point_refusals
from nlp_bench.app.stage_records import (
    Done,
    Finished,
    Launched,
    Order,
    PointOnDisk,
    Rendered,
    RenderedPoint,
    Written,
)
from nlp_bench.launch.refresher import Refresher
from nlp_bench.launch.render import render_compile_script, render_jobscript
from nlp_bench.report.console import progress_bar, say, warn
from nlp_bench.report.prediction_text import prediction_line
from nlp_bench.report.table import render, terminal_width
from nlp_bench.spec.batch import HOW_WORDS
from nlp_bench.spec.benchmark import Point
from nlp_bench.store import locks, states
from nlp_bench.store.names import COMPILE_SCRIPT, JOB_ERR, JOB_OUT, JOBSCRIPT, LOCAL_LOCK
from nlp_bench.store.point_folder import PointDir
from nlp_bench.store.records import PointRecord
from nlp_bench.store.runs import Run, create_run


def render_scripts(order: Order) -> Rendered:
    """Every point's point.json record and scripts, made in memory: nothing is written or launched."""
    hang = order.options.hang_timeout_s

    def rendered(point: Point) -> RenderedPoint:
        # the header says what a submission would refuse (a dry run writes such a point; a run stops before)
        refused = point_refusals(point, order.predicted.get(point.id), order.options.force)
        return RenderedPoint(PointRecord(point.to_dict()), render_jobscript(point, hang, refused=refused),
                             render_compile_script(point, refused=refused), order.predicted.get(point.id))

    return Rendered(order, tuple(map(rendered, order.points)))


def write_run(rendered: Rendered) -> Written | Done:
    """The run in the store, complete or not at all. A dry run ends here, with each point's prediction and
    how to submit the run."""
    order = rendered.order
    system = order.points[0].system  # the points of a run share their system

    def fill(folder: Path) -> None:
        """Everything a run holds, into the folder that becomes the run once it is complete."""
        if order.on_write is not None:
            order.on_write(folder)
        with progress_bar("writing point folders", len(rendered.points), threshold=500) as bar:
            for point in rendered.points:
                written = PointDir(folder / point.record.id)
                written.write_point(point.record.data, point.jobscript, point.compile_script)
                if point.prediction is not None:
                    written.write_prediction(point.prediction)
                bar.advance()

    run = create_run(order.root, order.benchmark, order.tag, system.name, [p.record.id for p in rendered.points],
                     fill, **order.extra)
    if order.on_run is not None:
        order.on_run(run)
    say(f"run {run.id}: {order.benchmark} tag {order.tag} on {system.name}, {len(order.points)} point(s)")
    say(f"  {_batches(order.points)}")
    say(f"  workspace {run.path}")
    points = tuple(PointOnDisk(run.path / p.record.id, p.record) for p in rendered.points)
    if order.dry_run:
        _predicted(rendered)
        _how_to_submit(order, run, [p.folder for p in points], bool(system.compile_command))
        return Done(0)
    return Written(run, order.root, order.executor, order.options, points)


def _batches(points: Sequence[Point]) -> str:
    """The global batch the points train and the rule that made it: one point's own words, else the range."""
    if len(points) == 1 and points[0].batch is not None:
        return points[0].batch.words()
    sizes = sorted({p.layout.global_batch_size for p in points})
    hows = sorted({HOW_WORDS[p.batch.how] for p in points if p.batch is not None})
    shown = f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]} to {sizes[-1]}"
    tag = points[0].batch.tag_global_batch_size if points[0].batch is not None else None
    beside = f"; the tag's is {tag}" if tag is not None and sizes != [tag] else ""
    return f"global batch {shown} ({', '.join(hows) or 'as recorded'}{beside})"


#: the predictions a dry run prints before it says how many more there are (each point keeps its own)
PREDICTIONS_SHOWN = 50


def _predicted(rendered: Rendered) -> None:
    """The planner's prediction of every point written, one line each: what a dry run is asked for before
    node-hours are spent."""
    shown = [p for p in rendered.points if p.prediction is not None][:PREDICTIONS_SHOWN]
    system = rendered.order.points[0].system
    for point in shown:
        line = prediction_line(point.prediction, point.record.model["name"], system.device_memory_gib)
        say(f"  {line}" if len(rendered.points) == 1 else f"  {point.record.id}: {line}")
    more = sum(p.prediction is not None for p in rendered.points) - len(shown)
    if more:
        say(f"  ... and {more:,} more predictions (each point folder keeps its own)")


def _how_to_submit(order: Order, run: Run, folders: list[Path], compiles: bool) -> None:
    """The tracked way first: a resume submits the points and records their jobs, so that status, the table
    and a later resume know them; by hand (one job, one chain) only where a scheduler queues them."""
    # by its id under the results folder the commands default to, else by its folder (which any --results-dir finds)
    ref = run.id if Path(order.root) == Path("results") else shlex.quote(str(run.path))
    verb = "run" if len(folders) == 1 else "sweep"
    what = f"{len(folders)} compile + run script pair(s)" if compiles else \
        f"jobscript {folders[0] / JOBSCRIPT}" if len(folders) == 1 else f"{len(folders)} jobscripts"
    say(f"  {what} written (not submitted)")
    say(f"  submit with: bench {verb} --resume {ref} (tracked: `bench status` and `bench result table` follow it)")
    if not order.executor.queues or len(folders) > 1:
        return
    if compiles:
        say(f"  or by hand, untracked: cd {shlex.quote(str(folders[0]))} && "
            f"sbatch --dependency=afterok:$(sbatch --parsable {COMPILE_SCRIPT}) {JOBSCRIPT}")
    else:
        say(f"  or by hand, untracked: cd {shlex.quote(str(folders[0]))} && sbatch {JOBSCRIPT}")


def launch_jobs(written: Written) -> Launched | Done:
    """Submit every point where the executor queues jobs; else run them one after another, watching each.
    Ctrl-C while a local job runs cancels it and ends the run here (exit 130)."""
    refresher = Refresher(written.executor)
    found = []
    for point in written.points:
        try:
            final = _launch_point(written, refresher, point)
        except Interrupted:
            return Done(130)
        found.append(final)
        if not written.executor.queues and final not in (None, states.COMPLETED):
            attempt = PointDir(point.folder).attempt()  # how the job just ended, not what was read before it ran
            warn(f"bench: {point.folder.name} ended {final} ({attempt.failure_class}: {attempt.failure_detail}); "
                 f"see {point.folder / JOB_OUT} and {point.folder / JOB_ERR}")
    return Launched(written, tuple(found))


def _launch_point(written: Written, refresher: Refresher, point: PointOnDisk) -> str | None:
    """Submit the point's job holding its lock, after reading its state once more right then: another
    bench (a resume, a second sweep) may have submitted it since this one looked. Where the executor does
    not queue, the lock is held until the job ends, and the job waits for any other local job of the same
    results folder to end first: two benchmarks measured side by side measure each other. Returns the
    job's state, or None when it was skipped (and says why)."""
    executor, folder = written.executor, point.folder
    store = PointDir(folder)
    try:
        with store.locked():
            state = refresher.refresh(folder)
            if state not in (states.RERUNNABLE if written.again else {states.NOT_SUBMITTED}):
                say(f"  {folder.name}: {state}, left as it is")
                return None
            if store.attempt() is not None:
                store.keep_earlier_output()
            if not executor.queues:
                with alone(written.root / LOCAL_LOCK, folder.name):
                    return run_here(executor, folder, point.record, written.options.after_ids)
            job_id = executor.submit(folder, chain(folder), written.options.after_ids)
            ids = store.attempt().chain_job_ids
            if len(ids) > 1:
                say(f"  {folder.name}: {executor.name} compile job {ids[0]}, then run job {job_id} (afterok)")
            else:
                say(f"  {folder.name}: {executor.name} job {job_id}")
            return states.PENDING
    except locks.Busy as exc:
        say(f"  {folder.name}: skipped, {exc}")
        return None


def wait_for_jobs(launched: Launched) -> Finished | Done:
    """Local jobs have ended by now (exit 1 where one did not complete). Queued ones are waited for with
    --wait, with a progress bar; without, the run ends here, saying how to see them once they end."""
    written = launched.written
    if not written.executor.queues:
        return Finished(written, 0 if all(s in (None, states.COMPLETED) for s in launched.states) else 1)
    if not written.options.wait:
        say(f"  when they end: bench result table {written.run.id}")
        return Done(0)
    folders = [p.folder for p in written.points]
    with progress_bar("waiting", len(folders), info=True) as bar:
        refresher = Refresher(written.executor)
        while True:
            refresher.prefetch(folders)
            finals = [refresher.refresh(f) for f in folders]
            done = sum(s in states.SETTLED for s in finals)
            counts = {s: finals.count(s) for s in sorted(set(finals))}
            info = ", ".join(f"{n} {s.lower()}" for s, n in counts.items())
            if written.executor.silence:
                info += f"; Slurm did not answer ({written.executor.silence})"
            bar.update(completed=done, info=info)
            if done == len(folders):
                break
            time.sleep(2.0)
    return Finished(written, 0 if all(s == states.COMPLETED for s in finals) else 1)


def analyse_run(finished: Finished) -> Done:
    """The run's table, each point's log analysed with the point.json record the stages before it hold."""
    written = finished.written
    problems = Problems()
    known = {p.folder.name: p.record for p in written.points}
    rows = [found.row for found in analysed_points(written.run, problems, known)]
    print(render(rows, "pretty", width=terminal_width()), end="")
    for line in problems.lines:
        warn(f"bench: warning: {line}")
    return Done(finished.code)


Stage = Callable[[Any], Any]
#: a run from its order to its table, in order
STAGES: tuple[Stage, ...] = (render_scripts, write_run, launch_jobs, wait_for_jobs, analyse_run)


def run_stages(record: object, start: Stage = render_scripts) -> int:
    """Hand `record` through the stages from `start` on until one gives Done; its exit code."""
    stages = STAGES[STAGES.index(start):]
    for stage in stages:
        record = stage(record)
        if isinstance(record, Done):
            return record.code
    raise TypeError(f"the last stage, {stages[-1].__name__}, gave {type(record).__name__}, not Done")
