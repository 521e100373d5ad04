"""The `bench` command: its root and the verbs each command module adds. Thin: the verbs parse options and
call the app layer; heavy modules load when a verb runs, and nothing here imports torch (training runs in
the jobscript's own processes)."""

from __future__ import annotations

from pathlib import Path

import click

from nlp_bench import __version__
from nlp_bench.cli.one_line import BenchGroup
from nlp_bench.cli.parse_commands import bench_parse
from nlp_bench.cli.plan_commands import bench_plan
from nlp_bench.cli.result_commands import result, result_report
from nlp_bench.cli.rules_commands import rules
from nlp_bench.cli.run_commands import bench_run, cancel, status, sweep
from nlp_bench.cli.setup_commands import bench_setup
from nlp_bench.cli.site_commands import bench_doctor, data, system
from nlp_bench.cli.tag_commands import tag


@click.group(cls=BenchGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="nlp-bench")
@click.option("--results-dir", type=click.Path(file_okay=False, path_type=Path), envvar="NLP_BENCH_RESULTS",
              default="results", show_default=True, help="Root of the run workspaces.")
@click.pass_context
def cli(ctx: click.Context, results_dir: Path) -> None:
    """Benchmark Megatron-style GPT training on HPC clusters (the JUPITER NLP benchmark)."""
    ctx.obj = {"results_dir": results_dir}


for command in (bench_run, sweep, status, cancel, result, bench_parse, bench_plan, rules, system, tag, bench_doctor,
                data, bench_setup):
    cli.add_command(command)
cli.add_command(result_report, "report")  # what people type for `bench result report`


def main() -> None:
    cli.main(prog_name="bench")
