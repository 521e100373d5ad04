"""Every grid and every tag the repository ships dry-runs on a fresh clone: a copy of the site layer, no
Megatron-LM checkout, no data, no site variables. Each writes its jobscripts, or stops with one line that
says what it needs and which setting gives it. The examples are listed from the files, so a new grid, tag or
tag's system is checked without an edit here."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from conftest import ROOT

from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.spec.trainers import MEGATRON_LM, REPO_ENV

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

@pytest.fixture
def fresh(site, monkeypatch):
    """The site copy as a fresh clone has it: none of the variables a site sets for bench or its jobs."""
    for name in [n for n in os.environ if n.startswith("NLP_BENCH_") and n != "NLP_BENCH_ROOT"] + [REPO_ENV]:
        monkeypatch.delenv(name, raising=False)
    return site

def _check(out, results: Path) -> None:
    assert "Traceback" not in out.output, out.output
    if out.exit_code == 2:
        errors = [line for line in out.output.splitlines() if line.startswith("bench: error:")]
        assert len(errors) == 1 and NEEDS.match(errors[0]), out.output
        return
    assert out.exit_code == 0, out.output
    assert list(results.glob("*/*/*/jobscript.sbatch")), out.output

@pytest.mark.parametrize("grid", GRIDS, ids=lambda path: path.stem)
def test_a_shipped_grid_dry_runs_on_a_fresh_clone(fresh, bench, results, grid):
    _check(bench("sweep", str(fresh / "benchmark" / "grids" / grid.name), "--dry-run"), results)

@pytest.mark.parametrize("benchmark,tag,system,trainer", _tags())
def test_a_shipped_tag_dry_runs_on_a_fresh_clone(fresh, bench, results, benchmark, tag, system, trainer):
    chosen = ["--trainer", trainer] if trainer else []
    _check(bench("run", "--benchmark", benchmark, "--tag", tag, "--system", system, *chosen, "--dry-run"), results)
