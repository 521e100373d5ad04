"""Which trainer a point runs: the built-in one (`python -m nlp_bench.train`) or Megatron-LM's own
`pretrain_gpt.py`. Both take the same Megatron flags under the same launch, so a point differs only in
the program torchrun starts; what Megatron-LM does not know is refused when the script is rendered."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from pathlib import Path

from nlp_bench.errors import SpecError, unknown
from nlp_bench.paths import benchmark_dir

BUILTIN, MEGATRON_LM = "builtin", "megatron-lm"
TRAINERS = (BUILTIN, MEGATRON_LM)
#: the environment variable that names the Megatron-LM checkout, over the system profile's megatron_lm_repo
REPO_ENV = "MEGATRON_LM_REPO"
ENTRY = "pretrain_gpt.py"


def check_trainer(name: str, where: str) -> str:
    if name not in TRAINERS:
        raise SpecError(f"{where}: {unknown('trainer', str(name), TRAINERS)}")
    return name


def megatron_flags_path() -> Path:
    return benchmark_dir() / "rules" / "megatron-lm-flags.txt"


@functools.lru_cache(maxsize=1)
def megatron_flags() -> frozenset[str]:
    """Megatron-LM's flag names (without the leading --), from the list kept with its source."""
    path = megatron_flags_path()
    if not path.is_file():
        raise SpecError(f"the list of Megatron-LM's flags is missing: {path}")
    lines = (line.strip() for line in path.read_text().splitlines())
    return frozenset(line[2:] for line in lines if line.startswith("--"))


def check_megatron_flags(flags: Iterable[str], where: str) -> None:
    """Refuse a flag Megatron-LM would stop on, before a job waits in the queue to find out."""
    known = megatron_flags()
    strange = sorted(f for f in flags if f not in known)
    if strange:
        raise SpecError(f"{where}: Megatron-LM has no flag {', '.join('--' + f for f in strange)} "
                        f"(its flags: {megatron_flags_path()}); drop it for --trainer megatron-lm")


def megatron_checkout(profile_repo: str, system: str) -> Path:
    """The Megatron-LM checkout a submission will run, checked now: $MEGATRON_LM_REPO, else the profile's."""
    text = os.environ.get(REPO_ENV) or profile_repo
    if not text:
        raise SpecError(f"--trainer megatron-lm needs a Megatron-LM checkout: set megatron_lm_repo in "
                        f"slurm/systems/{system}.yaml or {REPO_ENV}")
    repo = Path(os.path.expanduser(os.path.expandvars(text)))
    if not (repo / ENTRY).is_file():
        source = REPO_ENV if os.environ.get(REPO_ENV) else f"megatron_lm_repo of slurm/systems/{system}.yaml"
        raise SpecError(f"Megatron-LM's {ENTRY} not found in {repo} (from {source}); point it at a "
                        "github.com/NVIDIA/Megatron-LM checkout")
    return repo
