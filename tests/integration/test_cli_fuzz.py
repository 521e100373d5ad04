"""Fuzzed command lines: whatever a user types, `bench` succeeds or says one line and exits 2, and never
leaves a half-written run behind. Run and sweep always get --dry-run: nothing is launched."""

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nlp_bench.cli import cli

TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
NUMBER = st.integers(-3, 200).map(str)
GRIDS = [str(p) for p in sorted((ROOT / "benchmark" / "grids").glob("*.yaml"))]

VALUES = {
    "--tag": st.sampled_from(["smoke", "13", "175", "17", ""]) | TEXT,
    "--system": st.sampled_from(["local", "local-slurm", "juwels-booster", "jupiter", "nosuch"]) | TEXT,
    "--benchmark": st.sampled_from(["nlp", "nosuch", "/nonexistent/b.yaml", GRIDS[0]]) | TEXT,
    "--nodes": NUMBER | TEXT, "--tp": NUMBER, "--pp": NUMBER, "--mbs": NUMBER, "--gas": NUMBER | TEXT,
    "--hang-timeout": NUMBER | TEXT,
    "--after": st.sampled_from(["12", "12:13", "x;touch PWNED", "12_1"]) | TEXT,
    "--max-points": NUMBER,
    "--interval": st.sampled_from(["0.1", "1", "x"]),
    "--format": st.sampled_from(["pretty", "csv", "json", "md", "html", ""]),
}
FLAGS = ["--wait", "--no-rules", "-v", "--bogus", "--help"]
RUN_REFS = st.sampled_from(["RUN", "RUN_PREFIX", "", "2026", "nosuchrun", "../.."]) | TEXT


def _options(names: list[str]):
    pairs = st.lists(st.sampled_from(names).flatmap(lambda n: VALUES[n].map(lambda v: [n, v])), max_size=4)
    flags = st.lists(st.sampled_from(FLAGS), max_size=2)
    return st.tuples(pairs, flags).map(lambda t: [w for pair in t[0] for w in pair] + t[1])


COMMANDS = st.one_of(
    _options(["--tag", "--system", "--benchmark", "--nodes", "--tp", "--pp", "--mbs", "--gas", "--hang-timeout",
              "--after"]).map(lambda o: ["run", "--dry-run", *o]),
    st.tuples(RUN_REFS, _options(["--tag", "--after", "--hang-timeout"])).map(
        lambda t: ["run", "--dry-run", "--resume", t[0], *t[1]]),
    st.tuples(st.sampled_from(GRIDS + ["missing.yaml", ""]) | TEXT,
              _options(["--tag", "--system", "--max-points", "--hang-timeout", "--after"])).map(
        lambda t: ["sweep", t[0], "--dry-run", *t[1]]),
    st.tuples(RUN_REFS, _options(["--interval"])).map(lambda t: ["status", t[0], *t[1]]),
    st.tuples(RUN_REFS, st.lists(TEXT, max_size=2)).map(lambda t: ["cancel", t[0], *t[1]]),
    st.tuples(RUN_REFS, _options(["--format"])).map(lambda t: ["result", "table", t[0], *t[1]]),
    _options(["--format"]).map(lambda o: ["result", "export", "-o", "out.csv", *o]),
    st.lists(TEXT, max_size=3).map(lambda words: ["data", "preprocess", *words]),
    st.lists(TEXT, min_size=1, max_size=3),
)


def _runs(results) -> set[str]:
    return {str(p.relative_to(results)) for p in results.glob("*/*") if p.is_dir()}


def _whole(results) -> None:
    """Every run folder is complete: its run.json, and for each point its point.json and jobscript."""
    for run_json in results.glob("*/*/run.json"):
        meta = json.loads(run_json.read_text())
        for point in meta["points"]:
            folder = run_json.parent / (point if isinstance(point, str) else point["id"])
            assert (folder / "point.json").is_file() and (folder / "jobscript.sbatch").is_file(), folder
    for run_dir in results.glob("*/*"):
        if run_dir.parent.name == "plan":  # the planner's own files (calibration, corpus validation)
            continue
        assert (run_dir / "run.json").is_file(), f"{run_dir} has no run.json"


@pytest.fixture(scope="module")
def seeded(tmp_path_factory) -> Path:
    """A results folder holding one dry run of the smoke tag, made once: each example starts from a copy of
    it (its records hold no absolute path) rather than rendering the run again, 400 times."""
    results = tmp_path_factory.mktemp("seed") / "results"
    made = CliRunner().invoke(cli, ["--results-dir", str(results), "run", "--tag", "smoke", "--dry-run"])
    assert made.exit_code == 0, made.output
    return results


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(COMMANDS)
def test_fuzzed_command_lines_fail_cleanly(tmp_path, seeded, argv):
    work = tmp_path / "w"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    results = work / "results"
    runner = CliRunner()
    shutil.copytree(seeded, results)
    run_id = next(results.glob("*/*")).name
    argv = [{"RUN": run_id, "RUN_PREFIX": run_id[:9]}.get(word, word) for word in argv]
    before = _runs(results)

    cwd = os.getcwd()
    os.chdir(work)  # anything a command writes by a relative path lands in the scratch folder
    try:
        out = runner.invoke(cli, ["--results-dir", str(results), *argv], catch_exceptions=True)
    finally:
        os.chdir(cwd)
    assert out.exception is None or isinstance(out.exception, SystemExit), (argv, repr(out.exception))
    assert out.exit_code in (0, 2), (argv, out.output)
    assert "Traceback" not in out.output
    if out.exit_code == 2:
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("bench: error: "), (argv, out.stderr)
        assert _runs(results) == before, f"{argv} failed but left a run behind"
    _whole(results)
    assert not list(tmp_path.rglob("PWNED*"))
