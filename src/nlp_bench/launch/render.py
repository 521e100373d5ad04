"""Render a point into a self-contained sbatch script with the jinja2 templates in slurm/templates."""

from __future__ import annotations

import shlex
from typing import Any

import jinja2

from nlp_bench.paths import slurm_dir
from nlp_bench.spec.benchmark import Point

TEMPLATE = "jobscript.sbatch.j2"


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(slurm_dir() / "templates")),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def shell_value(value: Any) -> str:
    """A flag value as a shell word; $VARIABLES in it still expand when the script runs."""
    text = repr(value) if isinstance(value, float) else str(value)
    if "$" in text:
        return '"' + text.replace('"', '\\"') + '"'
    return shlex.quote(text)


def train_flags(train: dict[str, Any]) -> list[str]:
    """Megatron flags from a `train` mapping: true is a bare switch, false/None leave the flag out."""
    out = []
    for key, value in train.items():
        if value is True:
            out.append(f"--{key}")
        elif value is not False and value is not None:
            out.append(f"--{key} {shell_value(value)}")
    return out


def render_jobscript(point: Point) -> str:
    """The jobscript text for a point; deterministic, so committed reference scripts can be diffed."""
    sbatch = {**point.system.sbatch, **point.sbatch}
    job_name = sbatch.pop("job-name", f"nlp-bench-{point.tag}")
    env = {key: shell_value(value) for key, value in point.system.env.items()}
    template = _environment().get_template(TEMPLATE)
    return template.render(p=point, lay=point.layout, system=point.system, job_name=job_name, sbatch=sbatch, env=env,
                           train_flags=train_flags(point.train))
