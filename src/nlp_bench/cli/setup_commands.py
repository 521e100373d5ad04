"""`bench setup megatron-lm`: the set-up job a site runs once before `--trainer megatron-lm`."""

from __future__ import annotations

from pathlib import Path

import click

from nlp_bench.cli.one_line import BenchGroup


@click.group("setup", cls=BenchGroup)
def bench_setup() -> None:
    """Set-up jobs a site runs once."""


@bench_setup.command("megatron-lm")
@click.option("--reference", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="The site's copy of the reference (github.com/FZJ-JSC/jubench-megatron-lm): its "
                   "benchmark/aux/add_tflops_logging.patch is applied, its src/apex built.")
@click.option("--commit", default=None,
              help="The Megatron-LM commit (or tag) to check out; default: the one the reference pins.")
@click.option("--system", "system_name", default="juwels-booster", show_default=True, help="System profile.")
@click.option("--into", default=None,
              help="Where Megatron-LM goes (default: the profile's megatron_lm_repo; MEGATRON_LM_REPO at "
                   "submission overrides both).")
@click.option("--url", default="https://github.com/NVIDIA/Megatron-LM.git", show_default=True,
              help="Where to clone it from.")
@click.option("--venv", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Make and use a virtual environment here (on top of the site's packages), as the reference "
                   "does; default: install into the environment the profile's env_setup activates.")
@click.option("--packages", default=None,
              help="Python packages to pip install, space-separated ('' for none); default: the reference's "
                   "nltk sentencepiece einops mpmath ninja.")
@click.option("--flash-attn/--no-flash-attn", default=True, show_default=True,
              help="pip install flash-attn (built without isolation), as the reference does.")
@click.option("--apex", default=None, help="Apex source to build (default: the reference's src/apex; '' for none).")
@click.option("--time", default=None, help="The job's time limit (default 02:00:00: Apex and flash-attn build long).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("setup-megatron-lm.sbatch"), show_default=True, help="The script to write.")
@click.option("--submit", is_flag=True, help="Also sbatch it (from its folder, where its output goes).")
def setup_megatron_lm(reference: Path, commit, system_name, into, url, venv, packages, flash_attn, apex, time,
                      output: Path, submit: bool) -> None:
    """Write the set-up job for --trainer megatron-lm: Megatron-LM cloned and checked out at the commit, the
    reference's patch applied (taken from --reference, as it is there), the Python packages, Apex and the
    fused kernels built; a finished set-up is left as it is when the job runs again."""
    from nlp_bench.app.megatron_setup import submit_setup, write_setup

    wanted = None if packages is None else packages.split()
    job = write_setup(system_name, commit, reference, output, into, url, venv, wanted, flash_attn, apex, time)
    click.echo(f"wrote {job.script}: Megatron-LM {job.commit} into {job.into}")
    for key in job.placeholders:
        click.echo(f"bench: warning: {key} of profile {system_name} is still a placeholder: edit "
                   f"slurm/systems/{system_name}.yaml, or the script, before submitting it", err=True)
    if submit:
        click.echo(f"submitted job {submit_setup(job)}; its output: {job.script.with_suffix('.out')}")
    else:
        click.echo(f"submit it with: sbatch {job.script}")
    click.echo(f"then: bench doctor --trainer megatron-lm --tag 13 --system {system_name} (it names the version and "
               "commit it finds and checks the tag's flags for it)")
