"""Every grid and every tag the repository ships dry-runs on a fresh clone: a copy of the site layer, no
Megatron-LM checkout, no data, no site variables. Each writes its jobscripts, or stops with one line that
says what it needs and which setting gives it. The examples are listed from the files, so a new grid, tag or
tag's system is checked without an edit here."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT

from nlp_bench.errors import SpecError
from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.spec.trainers import MEGATRON_LM, REPO_ENV, megatron_checkout

GRIDS = sorted((ROOT / "benchmark" / "grids").glob("*.yaml"))

BENCHMARKS = sorted((ROOT / "benchmark").glob("*.yaml"))

#: a refusal that is the machine's, not the example's: what is needed, then the setting that gives it
#: ("--trainer megatron-lm needs a Megatron-LM checkout: set megatron_lm_repo in ... or MEGATRON_LM_REPO")
NEEDS = re.compile(r"^bench: error: .*\bneeds? .+: (set|install) \S+")

def _tags() -> list:
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

def test_the_shipped_examples_are_found():
    """A glob that found nothing would pass every check below by having none."""
    assert GRIDS and BENCHMARKS and len(_tags()) > len(BENCHMARKS)

def test_a_refusal_passes_only_where_it_names_what_is_needed(monkeypatch):
    """The machine's refusal (no checkout where one is required) passes; the example's own fault, such as the
    refusal of gpu-small's --mock-data for the reference's Megatron-LM this test was written on, does not."""
    monkeypatch.delenv(REPO_ENV, raising=False)
    with pytest.raises(SpecError) as needed:
        megatron_checkout("", "local")
    assert NEEDS.match(f"bench: error: {needed.value}")
    assert not NEEDS.match("bench: error: tag 'gpu-small' on local-gpu (no Megatron-LM checkout here, so for the "
                           "reference's version; set MEGATRON_LM_REPO): Megatron-LM 0.4.0rc0 (f772743329) has no "
                           "flag --mock-data (its flags: flags/0.4.0rc0.tsv); drop it for --trainer megatron-lm")
