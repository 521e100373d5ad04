"""Which trainer a point runs: the built-in one (`python -m nlp_bench.train`) or Megatron-LM's own
`pretrain_gpt.py`. Both take the same Megatron flags under the same launch, so a point differs only in
the program torchrun starts; what the Megatron-LM version a point runs does not know is translated or
refused when the script is rendered (spec.megatron)."""

from __future__ import annotations

import os
from pathlib import Path

from nlp_bench.errors import SpecError, unknown

BUILTIN, MEGATRON_LM = "builtin", "megatron-lm"
TRAINERS = (BUILTIN, MEGATRON_LM)
#: the environment variable that names the Megatron-LM checkout, over the system profile's megatron_lm_repo
REPO_ENV = "MEGATRON_LM_REPO"
ENTRY = "pretrain_gpt.py"


def check_trainer(name: str, where: str) -> str:
    if name not in TRAINERS:
        raise SpecError(f"{where}: {unknown('trainer', str(name), TRAINERS)}")
    return name


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
