"""`bench run`, `bench sweep`, `bench status` and `bench cancel`: running points and following them."""

from __future__ import annotations

from pathlib import Path

import click

from nlp_bench.spec.batch import BATCH_RULES, DEFAULT_BATCH_RULE
from nlp_bench.spec.switches import RECOMPUTE
from nlp_bench.spec.trainers import TRAINERS

_BATCH = click.option(
    "--batch", type=click.Choice(BATCH_RULES), default=None,
    help=f"Where the layout differs from the tag's and gas is not given: keep the tag's global batch (gas follows; "
         f"the default, {DEFAULT_BATCH_RULE}) or its gas (the batch follows dp x mbs, as the reference's scaling "
         "runs did).")


def planned_options(command):
    """What `bench plan` ranks beside the sizes, so that each of its rows is a `bench run` line."""
    for option in reversed([
        click.option("--vp", type=click.IntRange(min=1), default=None,
                     help="Model chunks per pipeline rank, the vp of `bench plan` (Megatron's virtual pipeline size): "
                          "2 or more interleaves the pipeline, passed as --num-layers-per-virtual-pipeline-stage "
                          "= layers / (pp x vp); 1: no interleaving. Default: the tag's."),
        click.option("--recompute", type=click.Choice(RECOMPUTE), default=None,
                     help="Activation recompute, as `bench plan` ranks it: none, selective (--recompute-granularity "
                          "selective) or full (--recompute-granularity full, uniform, 1 layer). Default: the tag's."),
        click.option("--distributed-optimizer/--no-distributed-optimizer", "distributed_optimizer", default=None,
                     help="Shard the optimizer states over the replicas (--use-distributed-optimizer), or not. "
                          "Default: the tag's."),
    ]):
        command = option(command)
    return command


#: the #SBATCH options a run may set over its profile's, each with its own option
SLURM_OPTIONS = ("account", "partition", "time", "qos", "reservation")


def slurm_options(command):
    """#SBATCH options over the profile's and the tag's, for this run's jobs."""
    for name in reversed(SLURM_OPTIONS):
        command = click.option(f"--{name}", f"slurm_{name}", default=None, metavar="VALUE",
                               help=f"#SBATCH --{name} for these jobs (over the profile's sbatch.{name}).")(command)
    command = click.option("--sbatch", "sbatch_items", multiple=True, metavar="KEY=VALUE",
                           help="Any other #SBATCH option for these jobs, e.g. --sbatch constraint=a100 "
                                "(repeatable; KEY alone for a switch).")(command)
    return click.option("--force", is_flag=True,
                        help="Submit points the planner predicts not to fit in device memory.")(command)


def sbatch_overrides(sbatch_items: tuple[str, ...], **named: str | None) -> tuple[tuple[str, str], ...]:
    """The #SBATCH options given on the command line, checked as the profile's are."""
    from nlp_bench.spec.systems import check_sbatch_option

    found = {key.removeprefix("slurm_"): value for key, value in named.items() if value is not None}
    for item in sbatch_items:
        key, sep, value = item.partition("=")
        found[key.strip()] = value if sep else True
    for key, value in found.items():
        check_sbatch_option(key, value, "--sbatch")
    return tuple(found.items())


def launch_options(command):
    """Options `run` and `sweep` share about how their jobs start and are watched."""
    command = slurm_options(command)
    command = click.option(
        "--trainer", type=click.Choice(TRAINERS), default=None,
        help="What trains: the built-in trainer or Megatron-LM's pretrain_gpt.py (the checkout from the system "
             "profile's megatron_lm_repo or MEGATRON_LM_REPO); default: the tag's, else the system's.")(command)
    command = click.option(
        "--after", metavar="JOBID[:JOBID...]", default=None,
        help="On Slurm: start only after these jobs completed successfully (--dependency=afterok).")(command)
    command = click.option(
        "--hang-timeout", type=click.IntRange(min=0), default=None, metavar="SECONDS",
        help="End a job whose trainer prints no new iteration line for this long (default 1800; 0: never). "
             "Written into the jobscript; NLP_BENCH_HANG_TIMEOUT overrides it at submission.")(command)
    return click.option("--resume", "resume_ref", metavar="RUN", default=None,
                        help="Run again the points of RUN that did not complete (nothing else is read).")(command)


def data_option(command):
    """--data-path: a dataset of the site's in place of the tag's (the reference's OSCAR, or mock data)."""
    return click.option(
        "--data-path", default=None, metavar="PREFIX",
        help="Train on this Megatron indexed dataset (PREFIX.bin and PREFIX.idx, as `bench data preprocess` "
             "writes them) instead of the tag's data (mock data, or $NLP_BENCH_DATA/oscar_text_document).")(command)


def _resume_takes_no(**given) -> None:
    """A resumed run reruns its own jobscripts: options that would change them cannot apply."""
    clash = [name.replace("_", "-") for name, value in given.items() if value is not None]
    if clash:
        shown = ", ".join(n if n == "grid" else f"--{n}" for n in clash)
        raise click.UsageError(f"--resume reruns the run's own jobscripts as they are; {shown} cannot apply "
                               f"(start a new run for that)")


@click.command("run")
@click.option("--tag", default=None, help="Benchmark tag (needed): smoke, 13, 175, ... (bench tag list).")
@click.option("--system", default=None, help="System profile from slurm/systems/ (default: the tag's).")
@click.option("--benchmark", "benchmark_name", default="nlp", show_default=True,
              help="Benchmark name in benchmark/ or a path to a benchmark YAML file.")
@click.option("--nodes", type=int, default=None, help="Override the tag's node count.")
@click.option("--tp", type=int, default=None, help="Override tensor-parallel size.")
@click.option("--pp", type=int, default=None, help="Override pipeline-parallel size.")
@click.option("--mbs", type=int, default=None, help="Override micro-batch size.")
@click.option("--gas", type=int, default=None, help="Override gradient-accumulation steps.")
@click.option("--ep", type=int, default=None,
              help="Override expert-parallel size (an MoE tag; Megatron's --expert-model-parallel-size).")
@click.option("--etp", type=int, default=None,
              help="Override the experts' tensor-parallel size (Megatron's --expert-tensor-parallel-size; "
                   "default: the tag's, else tp).")
@_BATCH
@click.option("--global-batch-size", type=click.IntRange(min=1), default=None,
              help="Train this global batch (gas follows from dp x mbs).")
@planned_options
@click.option("--dry-run", is_flag=True, help="Write the workspace and jobscript; do not submit.")
@click.option("--wait", "wait_", is_flag=True, help="On Slurm: block until the job ends, then print the row.")
@data_option
@launch_options
@click.pass_context
def bench_run(ctx: click.Context, tag, system, benchmark_name, nodes, tp, pp, mbs, gas, ep, etp, batch, global_batch_size,
              vp, recompute, distributed_optimizer, dry_run, wait_, data_path, hang_timeout, after, trainer, resume_ref,
              force, sbatch_items, **slurm) -> None:
    """Render the tag's point into a new run workspace and run it (local) or submit it (Slurm). A point the
    planner predicts not to fit, or a site profile a job cannot run from as it is, is refused (--dry-run
    warns)."""
    from nlp_bench.app.execute import LaunchOptions, execute_run, resume

    sbatch = sbatch_overrides(sbatch_items, **slurm)
    options = LaunchOptions(wait_, hang_timeout, after, sbatch, force)
    if resume_ref:
        _resume_takes_no(tag=tag, system=system, nodes=nodes, tp=tp, pp=pp, mbs=mbs, gas=gas, ep=ep, etp=etp, batch=batch,
                         global_batch_size=global_batch_size, vp=vp, recompute=recompute,
                         distributed_optimizer=distributed_optimizer, hang_timeout=hang_timeout, trainer=trainer,
                         sbatch=" ".join(k for k, _ in sbatch) or None, data_path=data_path,
                         benchmark=None if benchmark_name == "nlp" else benchmark_name)
        ctx.exit(resume(ctx.obj["results_dir"], resume_ref, options, dry_run))
    ctx.exit(execute_run(ctx.obj["results_dir"], benchmark_name, tag, system, dry_run,
                         dict(nodes=nodes, tp=tp, pp=pp, mbs=mbs, gas=gas, ep=ep, etp=etp, batch=batch or DEFAULT_BATCH_RULE,
                              global_batch_size=global_batch_size, vp=vp, recompute=recompute,
                              distributed_optimizer=distributed_optimizer), options, trainer, data_path))


@click.command()
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
@_BATCH
@click.option("--wait", "wait_", is_flag=True, help="On Slurm: block until every job ends, then print the table.")
@data_option
@launch_options
@click.pass_context
def sweep(ctx: click.Context, grid: Path | None, tag, system, dry_run, max_points, no_rules, verbose, top, no_plan,
          batch, wait_, data_path, hang_timeout, after, trainer, resume_ref, force, sbatch_items, **slurm) -> None:
    """Run every point of a GRID file (matrix, zip, derived, exclude, constraints), or --resume RUN."""
    from nlp_bench.app.execute import LaunchOptions, execute_sweep, resume

    sbatch = sbatch_overrides(sbatch_items, **slurm)
    options = LaunchOptions(wait_, hang_timeout, after, sbatch, force)
    if resume_ref:
        _resume_takes_no(grid=grid, tag=tag, system=system, max_points=max_points, no_rules=no_rules or None,
                         hang_timeout=hang_timeout, top=top, no_plan=no_plan or None, trainer=trainer, batch=batch,
                         sbatch=" ".join(k for k, _ in sbatch) or None, data_path=data_path)
        ctx.exit(resume(ctx.obj["results_dir"], resume_ref, options, dry_run))
    if grid is None:
        raise click.UsageError("give a GRID file, or --resume RUN")
    ctx.exit(execute_sweep(ctx.obj["results_dir"], grid, tag, system, dry_run, no_rules, max_points, verbose,
                           options, top, keep_unfit=no_plan, trainer=trainer, batch=batch,
                           data_path=data_path))


@click.command()
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
    from nlp_bench.report.status import status_table
    from nlp_bench.report.table import terminal_width
    from nlp_bench.store.runs import find_run

    view = View(ctx.obj["results_dir"])
    run_ = find_run(ctx.obj["results_dir"], run_ref)
    width = terminal_width()

    def snapshot():
        rows = view.status_rows(run_)
        title = f"run {run_.id}" + "".join(f"\n{line}" for line in view.refresher.silences)
        return rows, status_table(rows, title, width)

    rows, table = snapshot()
    console = Console(width=width or 10_000)
    if watch:
        with Live(table, console=console, refresh_per_second=4) as live:
            while not view.all_ended(rows):
                time.sleep(interval)
                rows, table = snapshot()
                live.update(table)
    else:
        console.print(table)
    view.tell()


@click.command()
@click.argument("run_ref", metavar="RUN")
@click.argument("points", nargs=-1)
@click.pass_context
def cancel(ctx: click.Context, run_ref: str, points: tuple[str, ...]) -> None:
    """Cancel the unfinished jobs of RUN, or only of the named POINTs (those not submitted yet are marked
    cancelled, so a bench still going through the run leaves them). Exit 1 when a cancel was not confirmed
    (the scheduler refused it, did not answer, or still shows the job running)."""
    from nlp_bench.app.cancel import cancel_points

    ctx.exit(1 if cancel_points(ctx.obj["results_dir"], run_ref, points) else 0)
