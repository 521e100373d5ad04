"""Where the site layer (slurm/) and the benchmark definitions (benchmark/) live.

A source checkout (editable install) uses the repository's own folders, so a user's edits to a system
profile take effect at once; a wheel carries copies under nlp_bench/_data. NLP_BENCH_ROOT overrides both.
"""

from __future__ import annotations

import os
from pathlib import Path

from nlp_bench.errors import SpecError

_PACKAGE = Path(__file__).resolve().parent


def project_root() -> Path:
    """The folder that holds benchmark/ and slurm/."""
    env = os.environ.get("NLP_BENCH_ROOT")
    if env:
        root = Path(env)
        if not (root / "benchmark").is_dir():
            raise SpecError(f"NLP_BENCH_ROOT={env} has no benchmark/ folder")
        return root
    for candidate in (_PACKAGE.parent.parent, _PACKAGE / "_data"):
        if (candidate / "benchmark").is_dir() and (candidate / "slurm").is_dir():
            return candidate
    raise SpecError("cannot find the benchmark/ and slurm/ folders; set NLP_BENCH_ROOT to the nlp-bench checkout")


def benchmark_dir() -> Path:
    return project_root() / "benchmark"


def slurm_dir() -> Path:
    return project_root() / "slurm"


def reference_dir() -> Path:
    return project_root() / "results" / "reference"
