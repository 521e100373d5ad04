"""The examples the repository ships, listed from its files (so a new grid, tag or tag's system is checked
without an edit to a test), and the one refusal a dry run of them on a fresh clone may end in."""

import re

import pytest
from conftest import ROOT

from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.spec.trainers import MEGATRON_LM

GRIDS = sorted((ROOT / "benchmark" / "grids").glob("*.yaml"))

BENCHMARKS = sorted((ROOT / "benchmark").glob("*.yaml"))

#: a refusal that is the machine's, not the example's: what is needed, then the setting that gives it
#: ("--trainer megatron-lm needs a Megatron-LM checkout: set megatron_lm_repo in ... or MEGATRON_LM_REPO")
NEEDS = re.compile(r"^bench: error: .*\bneeds? .+: (set|install) \S+")


def shipped_tags() -> list:
    """(benchmark, tag, system, trainer): each tag on its own system and on every system its `systems` block
    names, with the trainer it names; and on its own system with Megatron-LM, which any tag may be asked for."""
    found = []
    for path in BENCHMARKS:
        for tag, spec in load_benchmark(str(path)).tags.items():
            for system in [spec["system"], *(spec.get("systems") or {})]:
                found.append(pytest.param(path.stem, tag, system, None, id=f"{path.stem}:{tag}@{system}"))
            found.append(pytest.param(path.stem, tag, spec["system"], MEGATRON_LM,
                                      id=f"{path.stem}:{tag}@{spec['system']}+{MEGATRON_LM}"))
    return found
