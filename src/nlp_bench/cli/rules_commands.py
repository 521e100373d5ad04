"""`bench rules check`: is a run a valid submission of the benchmark?"""

from __future__ import annotations

import click

from nlp_bench.cli.one_line import BenchGroup
from nlp_bench.spec.trainers import TRAINERS


@click.group(cls=BenchGroup)
def rules() -> None:
    """The benchmark's submission rules."""


@rules.command("check")
@click.argument("run_ref", metavar="[RUN]", required=False)
@click.option("--tag", default=None, help="Check the point this tag renders instead of a run.")
@click.option("--system", default=None, help="With --tag: the system profile (default: the tag's).")
@click.option("--trainer", type=click.Choice(TRAINERS), default=None, help="With --tag: the trainer.")
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
