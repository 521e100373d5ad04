"""Every grid and every tag the repository ships (shipped_examples.py) dry-runs through a whole `bench sweep`
or `bench run` on a fresh clone: a copy of the site layer, no Megatron-LM checkout, no data, no site
variables. Each writes its jobscripts, or stops with one line that says what it needs and which setting
gives it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from shipped_examples import GRIDS, NEEDS, shipped_tags

from nlp_bench.spec.trainers import REPO_ENV


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

@pytest.mark.parametrize("benchmark,tag,system,trainer", shipped_tags())
def test_a_shipped_tag_dry_runs_on_a_fresh_clone(fresh, bench, results, benchmark, tag, system, trainer):
    chosen = ["--trainer", trainer] if trainer else []
    _check(bench("run", "--benchmark", benchmark, "--tag", tag, "--system", system, *chosen, "--dry-run"), results)
