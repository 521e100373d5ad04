"""The site: `bench system list|show|detect` (the profiles there are, one of them whole, a new one from the live
Slurm), `bench doctor` (is a first run ready) and `bench data preprocess` (training data in Megatron's indexed
format)."""

from __future__ import annotations

from pathlib import Path

import click

from nlp_bench.cli.one_line import BenchGroup
from nlp_bench.spec.trainers import TRAINERS


@click.group(cls=BenchGroup)
def system() -> None:
    """System profiles: the site layer in slurm/systems/."""


@system.command("list")
def system_list() -> None:
    """The system profiles of slurm/systems/ (shipped and the site's own): scheduler, launcher, devices per
    node, peak and partition. `bench system show NAME` prints one whole."""
    from nlp_bench.report.catalog import SYSTEM_COLUMNS, catalog_table, system_rows
    from nlp_bench.report.table import terminal_width

    rows, problems = system_rows()
    click.echo(catalog_table(rows, SYSTEM_COLUMNS, terminal_width()), nl=False)
    for line in problems:
        click.echo(f"bench: warning: {line}", err=True)


@system.command("show")
@click.argument("name")
def system_show(name: str) -> None:
    """The profile NAME as its file holds it (YAML, with its comments and sources), once it has been checked."""
    from nlp_bench.spec.systems import load_system

    profile = Path(load_system(name).profile_path)
    click.echo(f"# {profile}")
    click.echo(profile.read_text(), nl=False)


@system.command("detect")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The profile to write, e.g. slurm/systems/NAME.yaml (NAME becomes the profile's name).")
@click.option("--partition", default=None, help="The partition to profile (default: the cluster's default).")
@click.option("--account", default=None, help="Write this account into the profile (and use it for --probe).")
@click.option("--probe", is_flag=True,
              help="Also run a one-minute job on a node of the partition: the GPUs nvidia-smi sees and the CPUs.")
@click.option("--set", "given_items", multiple=True, metavar="KEY=VALUE",
              help="A figure Slurm cannot tell, e.g. inter_node_gbps=100 (GB/s a node injects, all NICs, one "
                   "direction) or link_latency_us=5; also peak_tflops, matmul_tflops, device_memory_gib, "
                   "memory_bandwidth_gbps, intra_node_gbps. Repeatable.")
@click.option("--force", is_flag=True, help="Replace an existing file.")
def system_detect(output: Path, partition: str | None, account: str | None, probe: bool,
                  given_items: tuple[str, ...], force: bool) -> None:
    """Write a system profile from the live Slurm (sinfo/scontrol): nodes, GPUs per node from Gres, CPUs,
    memory, partitions and time limits, the device's peak figures where the GPU is known; what Slurm cannot
    tell is marked FILL IN, unless given with --set."""
    from nlp_bench.app.site_profile import detect, parse_given, write_profile
    from nlp_bench.spec.systems import systems_dir

    if output.exists() and not force:
        raise click.UsageError(f"{output} exists; pass --force to replace it")
    given = parse_given(given_items)
    text, missing = detect(output.stem, partition, account, probe, given=given)
    write_profile(output, text)
    click.echo(f"wrote {output}")
    if missing:
        click.echo(f"fill in: {', '.join(missing)} (marked FILL IN in the file)")
    if output.resolve().parent != systems_dir().resolve():
        click.echo(f"`--system {output.stem}` looks in {systems_dir()}/: move the file there to use it")
    click.echo(f"next: bench doctor --system {output.stem}")


@click.command("doctor")
@click.option("--system", "system_name", default=None, help="System profile (default: the tag's).")
@click.option("--tag", default="smoke", show_default=True, help="The tag whose data files to check.")
@click.option("--benchmark", "benchmark_name", default="nlp", show_default=True, help="Benchmark definition.")
@click.option("--trainer", type=click.Choice(TRAINERS), default=None,
              help="The trainer to check for (megatron-lm: its checkout too); default: the tag's, else the system's.")
@click.option("--on-node", is_flag=True,
              help="Also run a one-minute job: the environment and the GPUs as a compute node sees them.")
@click.pass_context
def bench_doctor(ctx: click.Context, system_name: str | None, tag: str, benchmark_name: str, trainer: str | None,
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


@click.group(cls=BenchGroup)
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
    from nlp_bench.data.preprocess import preprocess
    from nlp_bench.report.console import progress_bar

    with progress_bar("tokenizing", None, transient=True) as bar:
        prefix, docs, tokens = preprocess(input_path, output_prefix, vocab_file, merge_file, append_eod, workers,
                                          json_key, progress=bar.advance)
    click.echo(f"wrote {prefix}.bin and {prefix}.idx: {docs} documents, {tokens} tokens")
