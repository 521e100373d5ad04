"""Render a point into a self-contained sbatch script with the jinja2 templates in slurm/templates."""

from __future__ import annotations

import functools
import re
import shlex
from typing import Any

import jinja2

from nlp_bench.paths import slurm_dir
from nlp_bench.spec.benchmark import Point

TEMPLATE = "jobscript.sbatch.j2"
#: Seconds without a new iteration line after which a job's watchdog ends it. Generous: a 175B start-up
#: (data index, first pipeline fill) or a checkpoint save takes minutes, and a false alarm costs a rerun.
HANG_TIMEOUT_S = 1800


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


def train_flags(train: dict[str, Any]) -> list[str]:
    """Megatron flags from a `train` mapping: true is a bare switch, false/None leave the flag out."""
    out = []
    for key, value in train.items():
        if value is True:
            out.append(f"--{key}")
        elif value is not False and value is not None:
            out.append(f"--{key} {shell_value(value)}")
    return out


def render_jobscript(point: Point, hang_timeout_s: int | None = None) -> str:
    """The jobscript text for a point; deterministic, so committed reference scripts can be diffed."""
    sbatch = {**point.system.sbatch, **point.sbatch}
    job_name = sbatch.pop("job-name", f"nlp-bench-{point.tag}")
    env = {key: shell_value(value) for key, value in point.system.env.items()}
    template = _environment(str(slurm_dir() / "templates")).get_template(TEMPLATE)
    return template.render(p=point, lay=point.layout, system=point.system, job_name=job_name, sbatch=sbatch, env=env,
                           train_flags=train_flags(point.train),
                           hang_timeout_s=HANG_TIMEOUT_S if hang_timeout_s is None else int(hang_timeout_s))
