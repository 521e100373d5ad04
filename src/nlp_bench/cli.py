"""The `bench` command. Thin: it parses options and calls the pipeline; heavy modules load lazily,
and nothing here imports torch (training runs in the jobscript's own processes)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from nlp_bench import __version__
from nlp_bench.errors import BenchError

TABLE_FORMATS = ("pretty", "csv", "json", "md")
EXPORT_FORMATS = ("csv", "json", "md", "html", "tex", "parquet", "sqlite", "submission")


class OneLineError(click.ClickException):
    """What every user-caused error becomes: `bench: error: ...` on stderr, exit code 2."""

    exit_code = 2

    def show(self, file=None) -> None:
        click.echo(f"bench: error: {' '.join(self.format_message().split())}", err=True)


def _one_line(exc: click.UsageError) -> click.ClickException:
    """Click's usage errors print three lines (usage, hint, error); scripts and users want one.
    A bare `bench` or `bench result` still shows its help."""
    if isinstance(exc, click.exceptions.NoArgsIsHelpError):
        return exc
    hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
    return OneLineError(exc.format_message() + hint)


class BenchGroup(click.Group):
    """Turns every user-caused error, ours or click's, into one line on stderr and exit code 2."""

    def make_context(self, info_name, args, parent=None, **extra) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:
            raise _one_line(exc) from None

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except BenchError as exc:
            raise OneLineError(str(exc)) from None
        except click.UsageError as exc:
            raise _one_line(exc) from None
        except OSError as exc:  # a full disk, a read-only folder, a path that is not a folder: the user can act
            raise OneLineError(_os_line(exc)) from None


def _os_line(exc: OSError) -> str:
    """An operating-system error as the user needs it: the path and the system's reason."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    if exc.filename is None:
        return reason
    other = f" -> {exc.filename2}" if exc.filename2 else ""
    return f"{exc.filename}{other}: {reason}"


@click.group(cls=BenchGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="nlp-bench")
@click.option("--results-dir", type=click.Path(file_okay=False, path_type=Path), envvar="NLP_BENCH_RESULTS",
              default="results", show_default=True, help="Root of the run workspaces.")
@click.pass_context
def cli(ctx: click.Context, results_dir: Path) -> None:
    """Benchmark Megatron-style GPT training on HPC clusters (the JUPITER NLP benchmark)."""
    ctx.obj = {"results_dir": results_dir}


def launch_options(command):
    """Options `run` and `sweep` share about how their jobs start and are watched."""
    command = click.option(
        "--trainer", type=click.Choice(["builtin", "megatron-lm"]), default=None,
        help="What trains: the built-in trainer or Megatron-LM's pretrain_gpt.py (the checkout from the system "
             "profile's megatron_lm_repo or MEGATRON_LM_REPO); default: the tag's, else the system's.")(command)
    command = click.option(
        "--after", metavar="JOBID[:JOBID...]", default=None,
        help="On Slurm: start only after these jobs completed successfully (--dependency=afterok).")(command)
    return click.option(
        "--hang-timeout", type=click.IntRange(min=0), default=None, metavar="SECONDS",
        help="End a job whose trainer prints no new iteration line for this long (default 1800; 0: never). "
             "Written into the jobscript; NLP_BENCH_HANG_TIMEOUT overrides it at submission.")(command)


@cli.command()
@click.option("--tag", default=None, help="Benchmark tag: 13, 175 (default, as in the reference), smoke, ...")
@click.option("--system", default=None, help="System profile from slurm/systems/ (default: the tag's).")
@click.option("--benchmark", "benchmark_name", default="nlp", show_default=True,
              help="Benchmark name in benchmark/ or a path to a benchmark YAML file.")
@click.option("--nodes", type=int, default=None, help="Override the tag's node count.")
@click.option("--tp", type=int, default=None, help="Override tensor-parallel size.")
@click.option("--pp", type=int, default=None, help="Override pipeline-parallel size.")
@click.option("--mbs", type=int, default=None, help="Override micro-batch size.")
@click.option("--gas", type=int, default=None, help="Override gradient-accumulation steps.")
@click.option("--dry-run", is_flag=True, help="Write the workspace and jobscript; do not submit.")
@click.option("--wait", "wait_", is_flag=True, help="On Slurm: block until the job ends, then print the row.")
@launch_options
@click.option("--resume", "resume_ref", metavar="RUN", default=None,
              help="Run again the points of RUN that did not complete (nothing else is read).")
@click.pass_context
def run(ctx: click.Context, tag, system, benchmark_name, nodes, tp, pp, mbs, gas, dry_run, wait_, hang_timeout, after,
        trainer, resume_ref) -> None:
    """Render the tag's point into a new run workspace and run it (local) or submit it (Slurm)."""
    from nlp_bench.app.execute import LaunchOptions, execute_run, resume

    options = LaunchOptions(wait_, hang_timeout, after)
    if resume_ref:
        _resume_takes_no(tag=tag, system=system, nodes=nodes, tp=tp, pp=pp, mbs=mbs, gas=gas,
                         hang_timeout=hang_timeout, trainer=trainer,
                         benchmark=None if benchmark_name == "nlp" else benchmark_name)
        ctx.exit(resume(ctx.obj["results_dir"], resume_ref, options, dry_run))
    code = execute_run(ctx.obj["results_dir"], benchmark_name, tag, system, dry_run,
                       dict(nodes=nodes, tp=tp, pp=pp, mbs=mbs, gas=gas), options, trainer)
    ctx.exit(code)


def _resume_takes_no(**given) -> None:
    """A resumed run reruns its own jobscripts: options that would change them cannot apply."""
    clash = [name.replace("_", "-") for name, value in given.items() if value is not None]
    if clash:
        shown = ", ".join(n if n == "grid" else f"--{n}" for n in clash)
        raise click.UsageError(f"--resume reruns the run's own jobscripts as they are; {shown} cannot apply "
                               f"(start a new run for that)")


@cli.command()
@click.argument("grid", type=click.Path(dir_okay=False, path_type=Path), required=False)
@click.option("--tag", default=None, help="Start from this tag instead of the grid's.")
@click.option("--system", default=None, help="Run on this system profile instead of the grid's or tag's.")
@click.option("--dry-run", is_flag=True, help="Expand, validate and write every jobscript; submit nothing.")
@click.option("--max-points", type=click.IntRange(min=1), default=None,
              help="Write at most this many point folders (default 1000); a larger sweep writes nothing and "
                   "says how to narrow it.")
@click.option("--no-rules", is_flag=True, help="Allow changing what the benchmark's rules fix (not a submission).")
@click.option("-v", "--verbose", is_flag=True, help="List every dropped point.")
@click.option("--top", type=click.IntRange(min=1), default=None,
              help="Run only the K points the planner predicts fastest (needs a system the planner can time).")
@click.option("--no-plan", is_flag=True, help="Keep points the planner predicts not to fit in device memory.")
@click.option("--wait", "wait_", is_flag=True, help="On Slurm: block until every job ends, then print the table.")
@launch_options
@click.option("--resume", "resume_ref", metavar="RUN", default=None,
              help="Run again the points of RUN that did not complete, instead of a GRID.")
@click.pass_context
def sweep(ctx: click.Context, grid: Path | None, tag, system, dry_run, max_points, no_rules, verbose, top, no_plan,
          wait_, hang_timeout, after, trainer, resume_ref) -> None:
    """Run every point of a GRID file (matrix, zip, derived, exclude, constraints)."""
    from nlp_bench.app.execute import LaunchOptions, execute_sweep, resume

    options = LaunchOptions(wait_, hang_timeout, after)
    if resume_ref:
        _resume_takes_no(grid=grid, tag=tag, system=system, max_points=max_points, no_rules=no_rules or None,
                         hang_timeout=hang_timeout, top=top, no_plan=no_plan or None, trainer=trainer)
        ctx.exit(resume(ctx.obj["results_dir"], resume_ref, options, dry_run))
    if grid is None:
        raise click.UsageError("give a GRID file, or --resume RUN")
    ctx.exit(execute_sweep(ctx.obj["results_dir"], grid, tag, system, dry_run, no_rules, max_points, verbose,
                           options, top, keep_unfit=no_plan, trainer=trainer))


@cli.command()
@click.argument("run_ref", metavar="[RUN]", required=False)
@click.option("--watch", is_flag=True, help="Refresh until every point has ended.")
@click.option("--interval", type=click.FloatRange(min=0.2), default=5.0, show_default=True,
              help="Seconds between refreshes with --watch.")
@click.pass_context
def status(ctx: click.Context, run_ref: str | None, watch: bool, interval: float) -> None:
    """Show where every point of RUN stands (default: the newest run)."""
    import time

    from rich.console import Console
    from rich.live import Live

    from nlp_bench.app.views import View
    from nlp_bench.report.status import missing_status, point_status, status_table
    from nlp_bench.report.table import terminal_width
    from nlp_bench.store import states
    from nlp_bench.store.files import naming
    from nlp_bench.store.runs import find_run

    view = View(ctx.obj["results_dir"])
    run_ = find_run(ctx.obj["results_dir"], run_ref)
    width = terminal_width()

    def snapshot():
        view.refreshed(run_)
        rows = []
        for point in run_.points():
            if not point.exists():
                rows.append(missing_status(point.id))
                continue
            try:
                rows.append(point_status(point.path))
            except BenchError as exc:
                view.problems.add(naming(point.path, exc))
        title = f"run {run_.id}" + "".join(f"\n{line}" for line in view.refresher.silences)
        return rows, status_table(rows, title, width)

    rows, table = snapshot()
    console = Console(width=width or 10_000)
    if watch:
        ended = states.TERMINAL | {states.NOT_SUBMITTED, states.MISSING}
        with Live(table, console=console, refresh_per_second=4) as live:
            while not all(r["state"] in ended for r in rows):
                time.sleep(interval)
                rows, table = snapshot()
                live.update(table)
    else:
        console.print(table)
    view.tell()


@cli.command()
@click.argument("run_ref", metavar="RUN")
@click.argument("points", nargs=-1)
@click.pass_context
def cancel(ctx: click.Context, run_ref: str, points: tuple[str, ...]) -> None:
    """Cancel the unfinished jobs of RUN, or only of the named POINTs (those not submitted yet are marked
    cancelled, so a bench still going through the run leaves them). Exit 1 when a cancel was not confirmed
    (the scheduler refused it, did not answer, or still shows the job running)."""
    from nlp_bench.app.execute import cancel_points

    unconfirmed = cancel_points(ctx.obj["results_dir"], run_ref, points)
    ctx.exit(1 if unconfirmed else 0)


@cli.group()
def result() -> None:
    """Tables and exports of measured results."""


@result.command("table")
@click.argument("run_refs", metavar="[RUN]...", nargs=-1)
@click.option("--all", "all_runs", is_flag=True, help="Every run under the results folder.")
@click.option("--sort", default=None, metavar="COLUMN", help="Sort by a column; -COLUMN for descending.")
@click.option("--filter", "where", default=None, metavar="EXPR",
              help='Keep rows where EXPR holds, e.g. "Nodes >= 96 and Tokens_sec > 3e4" (non-letters in '
                   'column names become _).')
@click.option("--format", "fmt", type=click.Choice(TABLE_FORMATS), default="pretty", show_default=True)
@click.option("--reference", is_flag=True, help="Add the published JUPITER reference rows.")
@click.option("--wide", is_flag=True, help="Every column, however wide (the pretty table otherwise fits the terminal).")
@click.option("--columns", "column_names", default=None, metavar="A,B,C",
              help="Show these columns, in this order (any format).")
@click.pass_context
def result_table(ctx: click.Context, run_refs: tuple[str, ...], all_runs: bool, sort: str | None,
                 where: str | None, fmt: str, reference: bool, wide: bool, column_names: str | None) -> None:
    """Print the result table of RUNs (run ids, prefixes or folders; default: the newest run). The pretty
    table keeps the columns that fit the terminal's width (COLUMNS where set; no limit when writing to a pipe
    or file) and names the ones it left out."""
    from nlp_bench.analysis.results import run_rows
    from nlp_bench.app.views import View
    from nlp_bench.report.table import render, resolve_columns, select, terminal_width

    if wide and column_names:
        raise click.UsageError("--wide and --columns: give one")
    columns = resolve_columns(column_names) if column_names else None

    view = View(ctx.obj["results_dir"])
    rows = []
    if reference:
        from nlp_bench.analysis.reference import reference_rows

        rows = reference_rows()
    if all_runs:
        runs = view.every_run()
    elif run_refs or not reference:
        runs = [view.run(ref) for ref in run_refs or (None,)]
    else:
        runs = []
    for run_ in runs:
        rows += run_rows(run_, view.problems)
    if not rows and view.problems.lines:
        raise BenchError(view.problems.lines[0])
    click.echo(render(select(rows, sort, where), fmt, columns, terminal_width(), wide), nl=False)
    view.tell()


@result.command("compare")
@click.argument("run_ref", metavar="[RUN]", required=False)
@click.option("--reference", "reference_name", default="jupiter", show_default=True, metavar="NAME",
              help="Reference rows: results/reference/NAME.csv.")
@click.option("--format", "fmt", type=click.Choice(TABLE_FORMATS), default="pretty", show_default=True)
@click.option("--trainers", is_flag=True,
              help="Instead: the built-in trainer beside Megatron-LM on each layout RUN measured with both (ratio).")
@click.option("--baseline", "baseline_ref", metavar="RUN2", default=None,
              help="Instead: RUN against an earlier run of the same points: tokens/s ratio with its 95% interval, "
                   "and what differs (versions, environment, jobscript, nodes) where the change is beyond noise.")
@click.pass_context
def result_compare(ctx: click.Context, run_ref: str | None, reference_name: str, fmt: str, trainers: bool,
                   baseline_ref: str | None) -> None:
    """Compare the completed points of RUN with the reference: tokens/s ratio (also per device) and, for
    175B, the verdict against the 560 s baseline."""
    from nlp_bench.analysis.reference import compare, reference_rows
    from nlp_bench.analysis.results import run_rows
    from nlp_bench.app.views import View
    from nlp_bench.report.compare import render_comparison

    if trainers and baseline_ref:
        raise click.UsageError("--trainers and --baseline: give one")
    view = View(ctx.obj["results_dir"])
    run_ = view.run(run_ref)
    if baseline_ref:
        from nlp_bench.analysis.run_diff import compare_runs, point_runs
        from nlp_bench.report.compare import render_changes

        base = view.run(baseline_ref)
        if base.path == run_.path:
            raise click.UsageError(f"--baseline {baseline_ref} is run {run_.id} itself")
        changes = compare_runs(point_runs(run_), point_runs(base))
        if not changes:
            raise BenchError(f"runs {run_.id} and {base.id} share no point (same model, layout and trainer)")
        click.echo(render_changes(changes, fmt), nl=False)
        view.tell()
        return
    if trainers:
        from nlp_bench.analysis.side_by_side import COLUMNS, compare_trainers

        try:
            pairs = compare_trainers(run_rows(run_, view.problems))
        except BenchError as exc:
            raise BenchError(f"run {run_.id}: {exc}") from None
        click.echo(render_comparison(pairs, fmt, COLUMNS), nl=False)
        view.tell()
        return
    references = reference_rows(reference_name)
    try:
        rows = compare(run_rows(run_, view.problems), references)
    except BenchError as exc:
        raise BenchError(f"run {run_.id}: {exc}") from None
    click.echo(render_comparison(rows, fmt), nl=False)
    view.tell()


def _gathered(ctx: click.Context, run_refs: tuple[str, ...]):
    """Run ids, table rows and analysed results (keyed by (run, point)) of RUNs (default: the newest), and
    the view that knows what could not be shown."""
    from nlp_bench.analysis.results import run_results
    from nlp_bench.app.views import View

    view = View(ctx.obj["results_dir"])
    ids, rows, results = [], [], {}
    for ref in run_refs or (None,):
        run_ = view.run(ref)
        ids.append(run_.id)
        for row, result in run_results(run_, view.problems):
            rows.append(row)
            results[(row["run"], row["point"])] = result
    return ids, rows, results, view


@result.command("plot")
@click.argument("run_refs", metavar="[RUN]...", nargs=-1)
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Folder for the figures (PNG and SVG).")
@click.pass_context
def result_plot(ctx: click.Context, run_refs: tuple[str, ...], out_dir: Path) -> None:
    """Plot strong scaling, time to report (with the 175B baseline), TP x PP heatmaps and iteration-time
    traces for the completed points of one or more RUNs (default: the newest run)."""
    from nlp_bench.report.plots import plot_all

    _, rows, results, view = _gathered(ctx, run_refs)
    paths = plot_all(rows, {key: r.get("records") or [] for key, r in results.items()}, out_dir)
    click.echo(f"wrote {len(paths)} figure files to {out_dir}")
    view.tell()


@result.command("report")
@click.argument("run_refs", metavar="[RUN]...", nargs=-1)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The HTML file to write.")
@click.option("--reference", "reference_name", default="jupiter", show_default=True, metavar="NAME",
              help="Reference rows to compare with: results/reference/NAME.csv.")
@click.pass_context
def result_report(ctx: click.Context, run_refs: tuple[str, ...], output: Path, reference_name: str) -> None:
    """Write a self-contained HTML report of one or more RUNs: table, comparison, figures, provenance."""
    from nlp_bench.analysis.reference import reference_rows
    from nlp_bench.report.html import write_report

    references = reference_rows(reference_name)
    ids, rows, results, view = _gathered(ctx, run_refs)
    write_report(output, ", ".join(ids), rows, results, references, reference_name)
    click.echo(f"wrote {output} ({len(rows)} points)")
    view.tell()


@result.command("export")
@click.argument("run_ref", metavar="[RUN]", required=False)
@click.option("--format", "fmt", type=click.Choice(EXPORT_FORMATS), required=True,
              help="A table format, or `submission`: a folder with the table, the jobscripts and arguments as "
                   "run, the logs, software versions and the rules verdict.")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="The file to write (the new folder for --format submission).")
@click.pass_context
def result_export(ctx: click.Context, run_ref: str | None, fmt: str, output: Path) -> None:
    """Write the result table of RUN (default: the newest) to a file, or RUN as a submission bundle."""
    from nlp_bench.analysis.results import run_rows
    from nlp_bench.app.views import View
    from nlp_bench.report.table import export

    if not output.parent.is_dir():
        raise click.UsageError(f"{output.parent} does not exist (or is not a folder); make it first, or write "
                               "the export elsewhere")
    view = View(ctx.obj["results_dir"])
    run_ = view.run(run_ref)
    if fmt == "submission":
        from nlp_bench.app.submission import write_submission

        bundle = write_submission(run_, output)
        verdict = "valid submission" if bundle["rules"]["valid"] else "NOT a valid submission (see rules.json)"
        click.echo(f"wrote {output}: run {run_.id}, {len(bundle['files'])} files; {verdict}")
        view.tell()
        return
    if output.is_dir():
        raise click.UsageError(f"{output} is a folder; a {fmt} export is one file")
    export(run_rows(run_, view.problems), fmt, output)
    click.echo(f"wrote {output} ({fmt}, run {run_.id})")
    view.tell()


@cli.command()
@click.argument("log", type=click.Path(path_type=Path))
@click.option("--format", "fmt", default=None, metavar="FORMAT",
              help="The log's format (default: detected): megatron, megatron-jupiter, megatron-current, "
                   "megatron-deepspeed, neuron-megatron, nlp-bench, nxdt, hf-bert.")
@click.option("--seq-length", type=click.IntRange(min=1), default=None,
              help="Sequence length, for tokens/s from logs that do not print it (all of them).")
@click.option("--tokens", type=click.IntRange(min=1), default=20_000_000, show_default=True,
              help="Tokens of the hypothetical training that time_to_report_s is for.")
@click.option("--json", "as_json", is_flag=True, help="Print the documented JSON (records and summary).")
def parse(log: Path, fmt: str | None, seq_length: int | None, tokens: int, as_json: bool) -> None:
    """Read the iteration records of a training LOG and summarise them (warm-up excluded, spread reported)."""
    import json

    from nlp_bench.analysis import metrics, parsers

    try:
        parsed = parsers.parse_log(log, fmt)
    except parsers.NoRecords as exc:
        raise parsers.ParseError(f"{log}: {exc}") from None
    records, summary = metrics.steady_summary(parsed.records, seq_length, tokens)
    if as_json:
        # allow_nan=False: a NaN or Infinity is no JSON, and a figure that overflowed must fail here, loudly
        click.echo(json.dumps({"format": parsed.format, "records": records, "summary": summary,
                               "skipped_long_lines": parsed.skipped_long_lines}, indent=2, allow_nan=False))
        return
    from nlp_bench.report.parsed import render_parsed

    click.echo(render_parsed(parsed.format, records, summary), nl=False)
    if parsed.skipped_long_lines:
        click.echo(f"skipped {parsed.skipped_long_lines:,} line(s) longer than {parsers.MAX_LINE:,} characters "
                   "(no training stack prints one; not read)")


@cli.command("plan")
@click.argument("runs", metavar="[RUN|reference]...", nargs=-1)
@click.option("--tag", default=None, help="Benchmark tag to plan (default: the benchmark's, 175).")
@click.option("--system", default=None, help="System profile (default: the tag's).")
@click.option("--benchmark", "benchmark_name", default="nlp", show_default=True, help="Benchmark definition.")
@click.option("--nodes", type=click.IntRange(min=1), multiple=True, help="Node count(s) (default: the tag's).")
@click.option("--tp", type=click.IntRange(min=1), multiple=True, help="Pin tensor-parallel size(s).")
@click.option("--pp", type=click.IntRange(min=1), multiple=True, help="Pin pipeline-parallel size(s).")
@click.option("--vp", type=click.IntRange(min=1), multiple=True, help="Pin model chunks per pipeline rank.")
@click.option("--mbs", type=click.IntRange(min=1), multiple=True, help="Pin micro-batch size(s).")
@click.option("--gas", type=click.IntRange(min=1), multiple=True,
              help="Pin gradient-accumulation steps (the global batch then follows; by default it stays the tag's).")
@click.option("--recompute", type=click.Choice(["none", "selective", "full"]), multiple=True,
              help="Recompute choices to consider (default: all three).")
@click.option("--global-batch-size", type=click.IntRange(min=1), default=None, help="Keep this global batch instead.")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True, help="Layouts to show.")
@click.option("--target-seconds", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Find the fewest nodes whose best layout reaches this time_to_report.")
@click.option("--calibrate", "calibrate_", is_flag=True,
              help="Fit the planner to the measured RUNs (or `reference`, the published rows) and keep the fit.")
@click.option("--validate", "validate_", is_flag=True,
              help="Leave-one-out over the published corpus: each row predicted by a fit on all the others.")
@click.option("--json", "as_json", is_flag=True, help="Print the documented JSON instead of a table.")
@click.pass_context
def plan_command(ctx: click.Context, runs, tag, system, benchmark_name, nodes, tp, pp, vp, mbs, gas, recompute,
                 global_batch_size, top, target_seconds, calibrate_, validate_, as_json) -> None:
    """Predict memory per device, tokens/s and time_to_report of layouts before running them, ranked."""
    from nlp_bench.app import planning
    from nlp_bench.fsio import dumps
    from nlp_bench.report.plan_text import render_calibration, render_plan, render_target, render_validation

    results_dir = ctx.obj["results_dir"]
    if validate_:
        if runs or calibrate_ or target_seconds is not None:
            raise click.UsageError("--validate takes no RUN, --calibrate or --target-seconds")
        found = planning.validate(results_dir)
        click.echo(dumps(found) if as_json else render_validation(found), nl=as_json)
        return
    if runs and not calibrate_:
        raise click.UsageError("RUN arguments go with --calibrate")
    if calibrate_:
        if not runs:
            raise click.UsageError("--calibrate needs RUN ids or `reference`")
        click.echo(render_calibration(planning.calibrate_and_store(results_dir, list(runs), benchmark_name)), nl=False)
        if tag is None and target_seconds is None and not nodes:
            return
    space = {"nodes": nodes, "tp": tp or None, "pp": pp or None, "vp": vp or None, "mbs": mbs or None,
             "gas": gas or None, "global_batch_size": global_batch_size}
    if recompute:
        space["recompute"] = recompute
    if target_seconds is not None:
        best, calibrated, base = planning.target(results_dir, benchmark_name, tag, system, space, target_seconds)
        if as_json:
            click.echo(dumps([] if best is None else [{**best.to_dict(), "calibrated": calibrated}]))
        else:
            click.echo(render_target(best, target_seconds, calibrated, base), nl=False)
        return
    good, pruned, calibrated, base = planning.plan(results_dir, benchmark_name, tag, system, space, top)
    if as_json:
        shown = good + pruned[:top]
        click.echo(dumps([{**p.to_dict(), "calibrated": calibrated} for p in shown]))
        return
    click.echo(render_plan(good, pruned, calibrated, base, top), nl=False)


@cli.group()
def rules() -> None:
    """The benchmark's submission rules."""


@rules.command("check")
@click.argument("run_ref", metavar="[RUN]", required=False)
@click.option("--tag", default=None, help="Check the point this tag renders instead of a run.")
@click.option("--system", default=None, help="With --tag: the system profile (default: the tag's).")
@click.option("--trainer", type=click.Choice(["builtin", "megatron-lm"]), default=None, help="With --tag: the trainer.")
@click.option("--benchmark", "benchmark_name", default="nlp", show_default=True, help="With --tag: the benchmark.")
@click.option("--json", "as_json", is_flag=True, help="Print the documented JSON instead of text.")
@click.pass_context
def rules_check(ctx: click.Context, run_ref: str | None, tag, system, trainer, benchmark_name, as_json) -> None:
    """Is RUN (default: the newest) a valid submission? Each point's arguments as its job ran them (or as its
    jobscript holds them) against the rules: fixed model and precision, every reference training flag
    (expected vs found), the free parameters it changed. Exit 0 valid, 1 not, 2 a user error."""
    from nlp_bench.app.rules_check import check_run, check_tag
    from nlp_bench.fsio import dumps
    from nlp_bench.report.rules_text import render_rules

    if run_ref is not None and (tag or system or trainer):
        raise click.UsageError("give a RUN or --tag (with --system, --trainer), not both")
    if tag is None and (system or trainer):
        raise click.UsageError("--system and --trainer go with --tag")
    checked = check_tag(benchmark_name, tag, system, trainer) if tag else check_run(ctx.obj["results_dir"], run_ref)
    found = [c.to_dict() for c in checked]
    click.echo(dumps(found) if as_json else render_rules(found), nl=as_json)
    ctx.exit(0 if all(c.verdict.valid for c in checked) else 1)


@cli.group()
def system() -> None:
    """System profiles: the site layer in slurm/systems/."""


@system.command("detect")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The profile to write, e.g. slurm/systems/NAME.yaml (NAME becomes the profile's name).")
@click.option("--partition", default=None, help="The partition to profile (default: the cluster's default).")
@click.option("--account", default=None, help="Write this account into the profile (and use it for --probe).")
@click.option("--probe", is_flag=True,
              help="Also run a one-minute job on a node of the partition: the GPUs nvidia-smi sees and the CPUs.")
@click.option("--force", is_flag=True, help="Replace an existing file.")
def system_detect(output: Path, partition: str | None, account: str | None, probe: bool, force: bool) -> None:
    """Write a system profile from the live Slurm (sinfo/scontrol): nodes, GPUs per node from Gres, CPUs,
    memory, partitions and time limits, the device's peak figures where the GPU is known; what Slurm cannot
    tell is marked FILL IN."""
    from nlp_bench.app.site_profile import detect, write_profile
    from nlp_bench.spec.systems import systems_dir

    if output.exists() and not force:
        raise click.UsageError(f"{output} exists; pass --force to replace it")
    text, missing = detect(output.stem, partition, account, probe)
    write_profile(output, text)
    click.echo(f"wrote {output}")
    if missing:
        click.echo(f"fill in: {', '.join(missing)} (marked FILL IN in the file)")
    if output.resolve().parent != systems_dir().resolve():
        click.echo(f"`--system {output.stem}` looks in {systems_dir()}/: move the file there to use it")
    click.echo(f"next: bench doctor --system {output.stem}")


@cli.command()
@click.option("--system", "system_name", default=None, help="System profile (default: the tag's).")
@click.option("--tag", default="smoke", show_default=True, help="The tag whose data files to check.")
@click.option("--benchmark", "benchmark_name", default="nlp", show_default=True, help="Benchmark definition.")
@click.option("--trainer", type=click.Choice(["builtin", "megatron-lm"]), default=None,
              help="The trainer to check for (megatron-lm: its checkout too); default: the tag's, else the system's.")
@click.option("--on-node", is_flag=True,
              help="Also run a one-minute job: the environment and the GPUs as a compute node sees them.")
@click.pass_context
def doctor(ctx: click.Context, system_name: str | None, tag: str, benchmark_name: str, trainer: str | None,
           on_node: bool) -> None:
    """Check what a first run on a site needs, one line each: Slurm commands and controller, the profile's
    partition and account, the Python environment the jobscript activates, the tag's data files, and (with
    --on-node) a compute node's GPUs. Exit 0 when nothing failed, 1 otherwise."""
    from nlp_bench.app.doctor import FAIL
    from nlp_bench.app.doctor import doctor as run_checks
    from nlp_bench.spec.benchmark import load_benchmark

    point = load_benchmark(benchmark_name).point(tag, system_name, trainer=trainer)
    checks = run_checks(point, on_node)
    width = max(len(c.name) for c in checks)
    for check in checks:
        click.echo(f"{check.status:<4}  {check.name:<{width}}  {check.detail}")
    failed = [c.name for c in checks if c.status == FAIL]
    click.echo(f"system {point.system.name}: " + (f"{len(failed)} check(s) failed: {', '.join(failed)}" if failed
                                                 else "ready for a first run"))
    ctx.exit(1 if failed else 0)


@cli.group()
def data() -> None:
    """Training data: Megatron indexed datasets."""


@data.command("preprocess")
@click.option("--input", "input_path", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="jsonl file, one document per line.")
@click.option("--output-prefix", type=click.Path(path_type=Path), required=True,
              help="Writes PREFIX_text_document.bin and .idx.")
@click.option("--vocab-file", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--merge-file", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--json-key", default="text", show_default=True)
@click.option("--append-eod", is_flag=True, help="End every document with <|endoftext|>.")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True)
def data_preprocess(input_path, output_prefix, vocab_file, merge_file, json_key, append_eod, workers) -> None:
    """Tokenize a jsonl corpus with GPT-2 BPE into a Megatron indexed dataset."""
    from rich.progress import Progress

    from nlp_bench.data.preprocess import preprocess

    with Progress(transient=True) as bar:
        task = bar.add_task("tokenizing", total=None)
        prefix, docs, tokens = preprocess(input_path, output_prefix, vocab_file, merge_file, append_eod, workers,
                                          json_key, progress=lambda n: bar.advance(task, n))
    click.echo(f"wrote {prefix}.bin and {prefix}.idx: {docs} documents, {tokens} tokens")


def main() -> None:
    cli.main(prog_name="bench")


if __name__ == "__main__":
    sys.exit(main())
