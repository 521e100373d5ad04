"""`bench plan ...`: predict memory, tokens/s and time_to_report before spending node-hours (the default
mode ranks layouts), find the fewest nodes for a target, calibrate on measured runs, validate on the
published corpus."""

from __future__ import annotations

from pathlib import Path

import click

from nlp_bench.cli.one_line import DefaultGroup, renamed
from nlp_bench.plan.explicit import row_help
from nlp_bench.spec.batch import BATCH_RULES
from nlp_bench.spec.switches import RECOMPUTE

_JSON = click.option("--json", "as_json", is_flag=True, help="Print the documented JSON instead of a table.")


def space_options(command):
    """The layouts to consider: the tag's, with axes pinned or widened."""
    for option in reversed([
        click.option("--tag", default=None, help="Benchmark tag to plan (default: the benchmark's, 175)."),
        click.option("--system", default=None, help="System profile (default: the tag's)."),
        click.option("--benchmark", "benchmark_name", default="nlp", show_default=True, help="Benchmark definition."),
        click.option("--nodes", type=click.IntRange(min=1), multiple=True, help="Node count(s) (default: the tag's)."),
        click.option("--tp", type=click.IntRange(min=1), multiple=True, help="Pin tensor-parallel size(s)."),
        click.option("--pp", type=click.IntRange(min=1), multiple=True, help="Pin pipeline-parallel size(s)."),
        click.option("--ep", type=click.IntRange(min=1), multiple=True,
                     help="Pin expert-parallel size(s) (a model with experts)."),
        click.option("--etp", type=click.IntRange(min=1), multiple=True,
                     help="Pin the experts' tensor-parallel size(s) (a model with experts)."),
        click.option("--vp", type=click.IntRange(min=1), multiple=True, help="Pin model chunks per pipeline rank."),
        click.option("--mbs", type=click.IntRange(min=1), multiple=True, help="Pin micro-batch size(s)."),
        click.option("--gas", type=click.IntRange(min=1), multiple=True,
                     help="Pin gradient-accumulation steps (the global batch then follows; by default it stays "
                          "the tag's)."),
        click.option("--recompute", type=click.Choice(RECOMPUTE), multiple=True,
                     help="Recompute choices to consider (default: all three)."),
        click.option("--global-batch-size", type=click.IntRange(min=1), default=None,
                     help="Keep this global batch instead."),
        click.option("--batch", type=click.Choice(BATCH_RULES), default=None,
                     help="Without --gas: keep the tag's global batch (the default) or its gas (the batch follows)."),
    ]):
        command = option(command)
    return command


def _space(nodes, tp, pp, ep, etp, vp, mbs, gas, recompute, global_batch_size, batch) -> dict:
    space = {"nodes": nodes, "tp": tp or None, "pp": pp or None, "ep": ep or None, "etp": etp or None,
             "vp": vp or None, "mbs": mbs or None, "gas": gas or None, "global_batch_size": global_batch_size,
             "batch": batch}
    if recompute:
        space["recompute"] = recompute
    return space


@click.group("plan", cls=DefaultGroup, default="rank")
def bench_plan() -> None:
    """Predict memory per device, tokens/s and time_to_report of layouts before running them.

    Without a command, rank the tag's layouts (`bench plan --tag 175` is `bench plan rank --tag 175`, with
    the options below): each row ends in the `bench run` line that runs it, predicted as the row is."""


@bench_plan.command("rank")
@space_options
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True, help="Layouts to show.")
@_JSON
@click.option("--target-seconds", type=click.FloatRange(min=0, min_open=True), default=None, hidden=True)
@click.option("--calibrate", "calibrate_", is_flag=True, hidden=True)
@click.option("--validate", "validate_", is_flag=True, hidden=True)
@click.option("--predict", "rows_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Predict the layouts stated in this rows file instead (`bench plan predict`).")
@click.option("--model", "model_name", default=None,
              help="Plan this model instead of the tag's: a preset, or a YAML file of Megatron-LM flag names.")
@click.argument("runs", nargs=-1, metavar="", required=False)
@click.pass_context
def plan_rank(ctx: click.Context, tag, system, benchmark_name, nodes, tp, pp, ep, etp, vp, mbs, gas, recompute,
              global_batch_size, batch, top, as_json, target_seconds, calibrate_, validate_, rows_file, model_name,
              runs) -> None:
    """Every layout of the tag on the system, ranked by predicted tokens/s, then what was pruned and why
    (the default mode: `bench plan --tag 175` is `bench plan rank --tag 175`)."""
    from nlp_bench.app import planning
    from nlp_bench.fsio import dumps
    from nlp_bench.report.plan_text import render_plan
    from nlp_bench.report.table import terminal_width

    if rows_file is not None:
        space = (nodes, tp, pp, ep, etp, vp, mbs, gas, recompute, global_batch_size, batch)
        if runs or calibrate_ or validate_ or target_seconds is not None or model_name or tag or system \
                or any(space):
            raise click.UsageError("--predict ROWS takes no other option but --json: the rows state everything")
        ctx.invoke(plan_predict, rows_file=rows_file, as_json=as_json)
        return
    if validate_:
        if runs or calibrate_ or target_seconds is not None:
            raise click.UsageError("--validate takes no RUN, --calibrate or --target-seconds")
        renamed("bench plan --validate", "bench plan validate")
        ctx.invoke(plan_validate, as_json=as_json)
        return
    if runs and not calibrate_:
        raise click.UsageError("RUN arguments go with --calibrate")
    if calibrate_:
        if not runs:
            raise click.UsageError("--calibrate needs RUN ids or `reference`")
        renamed("bench plan --calibrate RUN...", "bench plan calibrate RUN...")
        ctx.invoke(plan_calibrate, runs=runs, benchmark_name=benchmark_name)
        if tag is None and target_seconds is None and not nodes:
            return
    space = _space(nodes, tp, pp, ep, etp, vp, mbs, gas, recompute, global_batch_size, batch)
    if target_seconds is not None:
        renamed("bench plan --target-seconds S", "bench plan target S")
        _target(ctx, target_seconds, tag, system, benchmark_name, space, as_json)
        return
    good, pruned, calibrated, base = planning.plan(ctx.obj["results_dir"], benchmark_name, tag, system, space, top,
                                                   model_name)
    commands, rules = planning.run_lines(benchmark_name, tag, system, model_name, good)
    if as_json:
        click.echo(dumps([{**p.to_dict(), "calibrated": calibrated, "command": command}
                          for p, command in zip(good + pruned[:top], commands + [None] * top, strict=False)]))
    else:
        click.echo(render_plan(good, pruned, calibrated, base, top, terminal_width(), commands, rules), nl=False)
    ctx.exit(0 if good else 1)


def _target(ctx: click.Context, seconds: float, tag, system, benchmark_name, space: dict, as_json: bool) -> None:
    from nlp_bench.app import planning
    from nlp_bench.fsio import dumps
    from nlp_bench.report.plan_text import render_target
    from nlp_bench.report.table import terminal_width

    best, calibrated, base = planning.target(ctx.obj["results_dir"], benchmark_name, tag, system, space, seconds)
    commands, rules = planning.run_lines(benchmark_name, tag, system, None, [] if best is None else [best])
    command = commands[0] if commands else None
    if as_json:
        click.echo(dumps([] if best is None else [{**best.to_dict(), "calibrated": calibrated, "command": command}]))
    else:
        click.echo(render_target(best, seconds, calibrated, base, terminal_width(), command, rules), nl=False)
    ctx.exit(0 if best is not None else 1)


@bench_plan.command("target")
@click.argument("seconds", type=click.FloatRange(min=0, min_open=True))
@space_options
@_JSON
@click.pass_context
def plan_target(ctx: click.Context, seconds: float, tag, system, benchmark_name, nodes, tp, pp, ep, etp, vp, mbs,
                gas, recompute, global_batch_size, batch, as_json) -> None:
    """The fewest nodes whose best layout reaches a time_to_report of SECONDS (e.g. 560, the 175B rule)."""
    _target(ctx, seconds, tag, system, benchmark_name, _space(nodes, tp, pp, ep, etp, vp, mbs, gas, recompute,
                                                              global_batch_size, batch), as_json)


@bench_plan.command("calibrate")
@click.argument("runs", metavar="RUN|reference...", nargs=-1, required=True)
@click.option("--benchmark", "benchmark_name", default="nlp", show_default=True, help="Benchmark definition.")
@click.pass_context
def plan_calibrate(ctx: click.Context, runs: tuple[str, ...], benchmark_name: str) -> None:
    """Fit the planner to measured RUNs (or `reference`, the published JUPITER rows) and keep the fit for
    their systems: later plans there say they are calibrated."""
    from nlp_bench.app import planning
    from nlp_bench.report.plan_text import render_calibration

    click.echo(render_calibration(planning.calibrate_and_store(ctx.obj["results_dir"], list(runs), benchmark_name)),
               nl=False)


@bench_plan.command("validate")
@_JSON
@click.pass_context
def plan_validate(ctx: click.Context, as_json: bool) -> None:
    """Leave-one-source-out over the published corpus: each publication's rows predicted by a fit on the
    others', and how often the intervals held."""
    from nlp_bench.app import planning
    from nlp_bench.fsio import dumps
    from nlp_bench.report.plan_text import render_validation
    from nlp_bench.report.table import terminal_width

    found = planning.validate(ctx.obj["results_dir"])
    click.echo(dumps(found) if as_json else render_validation(found, terminal_width()), nl=as_json)


@bench_plan.command("predict", epilog="\b\nA row's keys:\n" + row_help())
@click.argument("rows_file", metavar="ROWS.yaml", type=click.Path(dir_okay=False, path_type=Path))
@_JSON
@click.pass_context
def plan_predict(ctx: click.Context, rows_file: Path, as_json: bool) -> None:
    """Predict layouts stated outright: ROWS.yaml holds `rows:`, each with an id, a model (a preset, or
    Megatron-LM's flag names without --: num-layers, hidden-size, num-attention-heads, num-query-groups,
    ffn-hidden-size, seq-length, vocab-size, swiglu, ...), a system (profile name or file), gpus or nodes,
    the parallel sizes, the global batch and any setting (listed below). A row that cannot be laid out or
    timed is answered with no figures and the reason, never ignored."""
    from nlp_bench.app import planning
    from nlp_bench.fsio import dumps
    from nlp_bench.report.plan_text import render_predictions

    found = planning.predict_rows(ctx.obj["results_dir"], rows_file)
    click.echo(dumps(found) if as_json else render_predictions(found), nl=as_json)
    ctx.exit(0 if any(r["tokens_per_s"] is not None for r in found) else 1)
