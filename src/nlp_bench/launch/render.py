"""Render a point into a self-contained sbatch script with the jinja2 templates in slurm/templates."""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Sequence
from typing import Any

import jinja2

from nlp_bench.launch.launcher import launcher_for
from nlp_bench.paths import slurm_dir
from nlp_bench.spec.benchmark import EXPERT_FLAGS, Point, expert_flags
from nlp_bench.spec.systems import System
from nlp_bench.spec.trainers import MEGATRON_LM
from nlp_bench.store import protocol
from nlp_bench.store.names import COMPILE_ERR, COMPILE_OUT, JOB_ERR, JOB_OUT, PROVENANCE_PACKAGE, TRAIN_ARGS_FILE

TEMPLATE = "jobscript.sbatch.j2"
#: Seconds without a new iteration line after which a job's watchdog ends it. Generous: a 175B start-up
#: (data index, first pipeline fill) or a checkpoint save takes minutes, and a false alarm costs a rerun.
HANG_TIMEOUT_S = 1800
#: The Python packages whose versions a job records in provenance.env, those its python has: the framework,
#: torch-xla and the Neuron stack (its PJRT plugin, compiler, NxD libraries), and what GPU runs add to torch.
PROVENANCE_PACKAGES = ("torch", "torch-xla", "torch-neuronx", "libneuronxla", "neuronx-cc", "neuronx-distributed",
                       "neuronx-distributed-training", "triton", "transformer-engine")


@functools.lru_cache(maxsize=4)
def _environment(root: str) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(root),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


_VARIABLE = re.compile(r"(\$\{[A-Za-z_][A-Za-z0-9_]*\})")


def shell_value(value: Any) -> str:
    """A value as one shell word that runs nothing: every part is single-quoted except ${NAME}
    references (a site's data folder, say), which stay expandable and double-quoted. `$(...)`,
    backticks, `;`, quotes and newlines in a value are only ever text."""
    text = repr(value) if isinstance(value, float) else str(value)
    parts = [part for part in _VARIABLE.split(text) if part]
    if not parts:
        return "''"
    return "".join(f'"{part}"' if _VARIABLE.fullmatch(part) else shlex.quote(part) for part in parts)


def site_path(text: str) -> str:
    """A profile's path (checked to hold no quote, backtick or parenthesis) as one shell word in which its
    $NAMEs expand when the job runs; a leading ~ becomes $HOME, which bash would not expand inside quotes."""
    if text == "~" or text.startswith("~/"):
        text = "$HOME" + text[1:]
    return f'"{text}"'


#: the variables the jobscript exports the expert layout's flags in, beside TP_SIZE and PP_SIZE
_EXPERT_VARIABLES = {EXPERT_FLAGS["ep"]: "EP_SIZE", EXPERT_FLAGS["etp"]: "ETP_SIZE"}


def train_flags(train: dict[str, Any]) -> list[str]:
    """Megatron flags from a `train` mapping: true is a bare switch, false/None leave the flag out."""
    out = []
    for key, value in train.items():
        if value is True:
            out.append(f"--{key}")
        elif value is not False and value is not None:
            out.append(f"--{key} {shell_value(value)}")
    return out


#: The flags a compile job's short trial run leaves out: its length is its own, and it must not write
#: or read the run's checkpoints or TensorBoard events.
_RUN_ONLY = ("train-iters", "train-samples", "save", "load", "save-interval", "tensorboard-dir", "exit-duration-in-mins")


def render_jobscript(point: Point, hang_timeout_s: int | None = None, compile_job: bool = False,
                     refused: Sequence[str] = ()) -> str:
    """The jobscript text for a point; deterministic, so committed reference scripts can be diffed. With
    `compile_job`, the script of the compile job that precedes it on systems with a compile_command. `refused`:
    why `bench run` refuses to submit the point (app.refusals), which the header says in place of "runnable"."""
    sbatch = {**point.system.sbatch, **point.sbatch}
    job_name = sbatch.pop("job-name", f"nlp-bench-{point.tag}")
    env = {key: shell_value(value) for key, value in point.env.items()}
    train = dict(point.train)
    if compile_job:
        train = {k: v for k, v in train.items() if k not in _RUN_ONLY}
        iters = point.system.compile_iters
        # the trial run is short, but its learning-rate schedule stays the run's (a decay shorter than the
        # warm-up is refused), and it counts in the run's unit: the graphs are the same either way
        if "train-samples" in point.train:
            train["train-samples"] = iters * point.layout.global_batch_size
            train.setdefault("lr-decay-samples", point.train["train-samples"])
        else:
            train["train-iters"] = iters
            if "train-iters" in point.train:
                train.setdefault("lr-decay-iters", point.train["train-iters"])
        job_name += "-compile"
    launcher = launcher_for(point.system)
    template = _environment(str(slurm_dir() / "templates")).get_template(TEMPLATE)
    made = point.megatron_lm or {}  # the checkout a Megatron-LM point was made for (spec.megatron.target)
    return template.render(
        p=point, lay=point.layout, system=point.system, launcher=launcher, rendezvous=launcher.rendezvous(point.system),
        job_name=job_name, sbatch=sbatch, env=env,
        expert_sizes=[(_EXPERT_VARIABLES[flag], flag, value) for flag, value in expert_flags(point.layout).items()],
        train_flags=train_flags(train), compile=compile_job, megatron=point.trainer == MEGATRON_LM,
        megatron_repo=shlex.quote(made["repo"]) if made.get("repo") else site_path(point.system.megatron_lm_repo),
        megatron_version=made.get("version"),
        megatron_table=made.get("flag_table"),
        train_args_file=TRAIN_ARGS_FILE, start_line=protocol.START_LINE, exit_line=protocol.EXIT_LINE,
        out_name=COMPILE_OUT if compile_job else JOB_OUT, err_name=COMPILE_ERR if compile_job else JOB_ERR,
        # the command is a site setting; NLP_BENCH_COMPILE_COMMAND replaces it at submission (a stand-in, say)
        launch_prefix=f'${{NLP_BENCH_COMPILE_COMMAND:-{point.system.compile_command}}} ' if compile_job else "",
        hang_timeout_s=0 if compile_job else HANG_TIMEOUT_S if hang_timeout_s is None else int(hang_timeout_s),
        neuron_cc_flags=shell_value(point.system.neuron_cc_flags), packages=" ".join(PROVENANCE_PACKAGES),
        package_prefix=PROVENANCE_PACKAGE, refused=[" ".join(line.split()) for line in refused])


def render_compile_script(point: Point, refused: Sequence[str] = ()) -> str | None:
    """The compile job's script, or None on a system without ahead-of-time compilation."""
    return render_jobscript(point, compile_job=True, refused=refused) if point.system.compile_command else None


SETUP_TEMPLATE = "setup_megatron_lm.sbatch.j2"


def render_setup_script(system: System, *, commit: str, into: str, into_expands: bool, url: str, patch: str,
                        apex: str, venv: str, packages: list[str], sbatch: dict[str, Any], script_name: str,
                        out_name: str) -> str:
    """The set-up job of `bench setup megatron-lm` (the reference's setup_venv and build steps). `into` is a
    site path where `into_expands` (a $NAME in it expands, see site_path); every other value is one word taken
    as it is."""
    template = _environment(str(slurm_dir() / "templates")).get_template(SETUP_TEMPLATE)
    return template.render(
        system=system, commit=shlex.quote(commit), into=site_path(into) if into_expands else shlex.quote(into), url=shlex.quote(url), patch=shlex.quote(patch),
        apex=shlex.quote(apex), venv=shlex.quote(venv) if venv else "", sbatch=sbatch, script_name=script_name,
        out_name=out_name, packages=" ".join(shlex.quote(p) for p in packages))
