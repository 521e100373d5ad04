"""`bench result ...`: tables, comparisons, figures, reports and exports of measured runs."""

from __future__ import annotations

from pathlib import Path

import click

from nlp_bench.cli.one_line import BenchGroup, DefaultGroup, renamed
from nlp_bench.errors import BenchError
from nlp_bench.report.formats import EXPORT_FORMATS, TABLE_FORMATS

_FORMAT = click.option("--format", "fmt", type=click.Choice(TABLE_FORMATS), default="pretty", show_default=True)


@click.group(cls=BenchGroup)
def result() -> None:
    """Tables and exports of measured results."""


@result.command("table")
@click.argument("run_refs", metavar="[RUN]...", nargs=-1)
@click.option("--all", "all_runs", is_flag=True, help="Every run under the results folder.")
@click.option("--sort", default=None, metavar="COLUMN", help="Sort by a column; -COLUMN for descending.")
@click.option("--filter", "where", default=None, metavar="EXPR",
              help='Keep rows where EXPR holds, e.g. "Nodes >= 96 and Tokens_sec > 3e4" (non-letters in '
                   'column names become _).')
@_FORMAT
@click.option("--reference", is_flag=True, help="Add the published JUPITER reference rows.")
@click.option("--wide", is_flag=True, help="Every column, however wide (the pretty table otherwise fits the terminal).")
@click.option("--columns", "column_names", default=None, metavar="A,B,C",
              help="Show these columns, in this order (any format).")
@click.pass_context
def result_table(ctx: click.Context, run_refs: tuple[str, ...], all_runs: bool, sort: str | None,
                 where: str | None, fmt: str, reference: bool, wide: bool, column_names: str | None) -> None:
    """Print the result table of RUNs (run ids, prefixes or folders; default: the newest run). The pretty
    table keeps the columns that fit the terminal's width (COLUMNS where set; no limit when writing to a pipe
    or file): Tokens/sec, time to report and the columns --filter and --sort name always; a value alike on
    every row is said once above it, and a last line names the columns left out."""
    from nlp_bench.app.views import View
    from nlp_bench.report.table import named_columns, render, resolve_columns, select, terminal_width

    if wide and column_names:
        raise click.UsageError("--wide and --columns: give one")
    columns = resolve_columns(column_names) if column_names else None
    view = View(ctx.obj["results_dir"])
    rows = view.table_rows(run_refs, all_runs, reference)
    click.echo(render(select(rows, sort, where), fmt, columns, terminal_width(), wide, named_columns(sort, where)),
               nl=False)
    view.tell()


@result.group("compare", cls=DefaultGroup, default="reference")
def result_compare() -> None:
    """Compare a run with the published reference (the default), its two trainers, or an earlier run."""


@result_compare.command("reference")
@click.argument("run_ref", metavar="[RUN]", required=False)
@click.option("--reference", "reference_name", default="jupiter", show_default=True, metavar="NAME",
              help="Reference rows: results/reference/NAME.csv.")
@_FORMAT
@click.option("--trainers", is_flag=True, hidden=True)
@click.option("--baseline", "baseline_ref", metavar="RUN2", default=None, hidden=True)
@click.pass_context
def compare_reference(ctx: click.Context, run_ref: str | None, reference_name: str, fmt: str, trainers: bool,
                      baseline_ref: str | None) -> None:
    """The completed points of RUN (default: the newest) beside the reference: tokens/s ratio (also per
    device) and, for 175B, the verdict against the 560 s baseline."""
    from nlp_bench.analysis.reference import compare, reference_rows
    from nlp_bench.app.views import View
    from nlp_bench.report.compare import render_comparison
    from nlp_bench.report.table import terminal_width

    if trainers and baseline_ref:
        raise click.UsageError("--trainers and --baseline: give one")
    if trainers:
        renamed("bench result compare --trainers", "bench result compare trainers")
        ctx.invoke(compare_trainers, run_ref=run_ref, fmt=fmt)
        return
    if baseline_ref:
        renamed("bench result compare RUN --baseline RUN2", "bench result compare baseline RUN2 RUN")
        ctx.invoke(compare_baseline, baseline_ref=baseline_ref, run_ref=run_ref, fmt=fmt)
        return
    view = View(ctx.obj["results_dir"])
    run_ = view.run(run_ref)
    click.echo(render_comparison(_of_run(run_, compare, view.rows(run_), reference_rows(reference_name)), fmt,
                                 width=terminal_width()), nl=False)
    view.tell()


def _of_run(run_, compare, *args):
    """compare(*args), an error of which names the run."""
    try:
        return compare(*args)
    except BenchError as exc:
        raise BenchError(f"run {run_.id}: {exc}") from None


@result_compare.command("trainers")
@click.argument("run_ref", metavar="[RUN]", required=False)
@_FORMAT
@click.pass_context
def compare_trainers(ctx: click.Context, run_ref: str | None, fmt: str) -> None:
    """The built-in trainer beside Megatron-LM on each layout RUN (default: the newest) measured with both:
    tokens/s of each and their ratio."""
    from nlp_bench.analysis.side_by_side import TRAINER_COLUMNS, pair_trainers
    from nlp_bench.app.views import View
    from nlp_bench.report.compare import render_comparison
    from nlp_bench.report.table import terminal_width

    view = View(ctx.obj["results_dir"])
    run_ = view.run(run_ref)
    click.echo(render_comparison(_of_run(run_, pair_trainers, view.rows(run_)), fmt, TRAINER_COLUMNS,
                                 terminal_width()), nl=False)
    view.tell()


@result_compare.command("baseline")
@click.argument("baseline_ref", metavar="RUN2")
@click.argument("run_ref", metavar="[RUN]", required=False)
@_FORMAT
@click.pass_context
def compare_baseline(ctx: click.Context, baseline_ref: str, run_ref: str | None, fmt: str) -> None:
    """RUN (default: the newest) against an earlier run RUN2 of the same points: the tokens/s ratio with its
    95% interval, and what differs (versions, environment, jobscript, nodes) where the change is beyond noise."""
    from nlp_bench.analysis.run_diff import compare_runs, point_runs
    from nlp_bench.app.views import View
    from nlp_bench.report.compare import render_changes
    from nlp_bench.report.table import terminal_width

    view = View(ctx.obj["results_dir"])
    run_, base = view.run(run_ref), view.run(baseline_ref)
    if base.path == run_.path:
        raise click.UsageError(f"the baseline {baseline_ref} is run {run_.id} itself")
    changes = compare_runs(point_runs(run_), point_runs(base))
    if not changes:
        raise BenchError(f"runs {run_.id} and {base.id} share no point (same model, layout and trainer)")
    click.echo(render_changes(changes, fmt, terminal_width()), nl=False)
    view.tell()


@result.command("plot")
@click.argument("run_refs", metavar="[RUN]...", nargs=-1)
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Folder for the figures (PNG and SVG).")
@click.pass_context
def result_plot(ctx: click.Context, run_refs: tuple[str, ...], out_dir: Path) -> None:
    """Plot strong scaling, time to report (with the 175B baseline), TP x PP heatmaps and iteration-time
    traces for the completed points of one or more RUNs (default: the newest run)."""
    from nlp_bench.app.views import View
    from nlp_bench.report.plots import plot_all

    view = View(ctx.obj["results_dir"])
    _, rows, results = view.gathered(run_refs)
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
    from nlp_bench.app.views import View
    from nlp_bench.report.html import write_report
    from nlp_bench.words import counted

    references = reference_rows(reference_name)
    view = View(ctx.obj["results_dir"])
    ids, rows, results = view.gathered(run_refs)
    write_report(output, ", ".join(ids), rows, results, references, reference_name)
    click.echo(f"wrote {output} ({counted(len(rows), 'point')})")
    view.tell()


@result.command("export")
@click.argument("run_ref", metavar="[RUN]", required=False)
@click.option("--format", "fmt", type=click.Choice(EXPORT_FORMATS), required=True,
              help="A table format, or `submission`: a folder with the table, the jobscripts and arguments as "
                   "run, the logs, software versions and the rules verdict.")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="The file to write (the new folder for --format submission).")
@click.option("--columns", "column_names", default=None, metavar="A,B,C",
              help="Write these columns, in this order (default: all; tex: the layout and the figures).")
@click.pass_context
def result_export(ctx: click.Context, run_ref: str | None, fmt: str, output: Path, column_names: str | None) -> None:
    """Write the result table of RUN (default: the newest) to a file, or RUN as a submission bundle. The tex
    table is made for a paper: booktabs rules, a caption and a label, headers in words, figures right-aligned."""
    from nlp_bench.app.views import View
    from nlp_bench.report.table import export, resolve_columns

    columns = resolve_columns(column_names) if column_names else None
    if columns and fmt == "submission":
        raise click.UsageError("--columns: a submission bundle keeps every column")
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
    else:
        if output.is_dir():
            raise click.UsageError(f"{output} is a folder; a {fmt} export is one file")
        export(view.rows(run_), fmt, output, columns)
        click.echo(f"wrote {output} ({fmt}, run {run_.id})")
    view.tell()
