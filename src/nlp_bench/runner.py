"""`bench run`: the pipeline from a tag to a result row, spec -> render -> workspace -> launch -> analyse."""

from __future__ import annotations

import shlex
from pathlib import Path

from rich.console import Console

from nlp_bench.analysis import parsers
from nlp_bench.analysis.results import run_rows
from nlp_bench.launch import states
from nlp_bench.launch.executor import get_executor, wait
from nlp_bench.launch.render import render_jobscript
from nlp_bench.report.table import render
from nlp_bench.spec.benchmark import Point, load_benchmark
from nlp_bench.sweep.workspace import JOB_ERR, JOB_OUT, JOBSCRIPT, argv, create_run, write_point

console = Console(stderr=True, highlight=False, soft_wrap=True)


def say(text: str) -> None:
    """What the user asked for goes to stdout, plainly, so scripts can read it; progress goes to stderr."""
    print(text, flush=True)


def planned_iterations(point: Point) -> int | None:
    train = point.train
    if train.get("train-iters"):
        return int(train["train-iters"])
    if train.get("train-samples"):
        return int(train["train-samples"]) // point.layout.global_batch_size
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
                self.last = parsers.parse_line(line) or self.last
        return self.last


def _watch(executor, point_dir: Path, point: Point) -> str:
    """Wait for the job with a progress bar fed by the trainer's own iteration lines."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    follower = LogFollower(point_dir / JOB_OUT)
    seq = point.model.seq_length
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[info]}"), console=console, transient=False) as bar:
        task = bar.add_task(point.id, total=planned_iterations(point), info="starting")

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
                layout: dict[str, int | None]) -> int:
    """Returns the exit code for the CLI: 0 success, 1 a job that failed."""
    benchmark = load_benchmark(benchmark_name)
    point = benchmark.point(tag, system, **layout)
    executor_name = point.system.executor
    executor = None if dry_run else get_executor(executor_name)
    if executor_name == "slurm" and not dry_run:
        from nlp_bench.launch.slurm import require

        require("sbatch")  # fail before a workspace is written
    script = render_jobscript(point)
    run = create_run(results_dir, benchmark.name, point.tag, point.system.name, [point], argv())
    point_dir = write_point(run, point, script)
    say(f"run {run.id}: {benchmark.name} tag {point.tag} on {point.system.name}, point {point.id}")
    say(f"  workspace {point_dir}")
    if dry_run:
        say(f"  jobscript {point_dir / JOBSCRIPT} (not submitted)")
        say(f"  submit it with: cd {shlex.quote(str(point_dir))} && sbatch {JOBSCRIPT}")
        return 0
    if executor_name == "slurm":
        job_id = executor.submit(point_dir)
        say(f"  submitted Slurm job {job_id}; when it ends: bench result table {run.id}")
        return 0
    executor.submit(point_dir)
    try:
        final = _watch(executor, point_dir, point)
    except KeyboardInterrupt:
        executor.cancel(point_dir)
        console.print(f"interrupted: job cancelled; its output is in {point_dir}")
        return 130
    print(render(run_rows(run), "pretty"), end="")
    if final != states.COMPLETED:
        info = states.load(point_dir) or {}
        console.print(f"bench: the job ended {final} ({info.get('failure_class')}: {info.get('failure_detail')}); "
                      f"see {point_dir / JOB_OUT} and {point_dir / JOB_ERR}")
        return 1
    return 0
