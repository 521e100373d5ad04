"""`bench tag list`: the benchmark's tags, what each runs and what it is for."""

from __future__ import annotations

import click

from nlp_bench.cli.one_line import BenchGroup


@click.group(cls=BenchGroup)
def tag() -> None:
    """Benchmark tags: the points `bench run --tag` starts from (benchmark/nlp.yaml)."""


@tag.command("list")
@click.option("--benchmark", "benchmark_name", default="nlp", show_default=True,
              help="Benchmark name in benchmark/ or a path to a benchmark YAML file.")
def tag_list(benchmark_name: str) -> None:
    """Every tag: its model, system, nodes and layout, and what it is for."""
    from nlp_bench.report.catalog import TAG_COLUMNS, catalog_table, tag_rows
    from nlp_bench.report.table import terminal_width
    from nlp_bench.spec.benchmark import load_benchmark

    click.echo(catalog_table(tag_rows(load_benchmark(benchmark_name)), TAG_COLUMNS, terminal_width()), nl=False)
