"""`bench rules`: is a run a valid submission of the benchmark (`check`), and which flags each Megatron-LM
version takes (`flags`)?"""

from __future__ import annotations

from pathlib import Path

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


@rules.command("flags")
@click.argument("checkout", required=False, type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--commit", default=None, help="The commit CHECKOUT is, where it is not a git repository.")
@click.option("--python", "python", default=None,
              help="The Python of the Megatron-LM environment (default: this one); it imports the checkout.")
@click.option("--source", default=None, help="Where the checkout came from, for the table's header.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write the table here instead of benchmark/megatron-lm/flags/.")
@click.option("--diff", nargs=2, metavar="OLD NEW", default=None,
              help="Instead: the flags of kept table OLD that kept table NEW lacks (translation candidates).")
def rules_flags(checkout: Path | None, commit, python, source, out_dir, diff) -> None:
    """Write CHECKOUT's flag table from Megatron-LM's own argument parser (name, type, choices, default,
    deprecated), as benchmark/megatron-lm/flags/<version>.tsv: a point for that version is then checked
    against it. Nothing is launched; the checkout's modules are imported by --python."""
    from nlp_bench.app.megatron_flags import table_diff, write_flag_table

    if diff:
        if checkout is not None:
            raise click.UsageError("give a CHECKOUT or --diff OLD NEW, not both")
        for flag in table_diff(*diff):
            click.echo(f"--{flag}")
        return
    if checkout is None:
        raise click.UsageError("give the Megatron-LM CHECKOUT whose flags to write")
    click.echo(f"wrote {write_flag_table(checkout, python, commit, source, out_dir)}")
