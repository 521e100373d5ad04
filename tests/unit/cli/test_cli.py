"""User errors are one line and exit 2; `bench --help` stays light."""

import json
import re

from conftest import ROOT


def test_unknown_run_among_existing(bench, results):
    assert bench("run", "--tag", "13", "--dry-run").exit_code == 0
    out = bench("result", "table", "2001")
    assert out.exit_code == 2 and "no run under" in out.output and "the newest are" in out.output

def test_resume_dry_run_only_lists(bench, results):
    assert bench("sweep", str(ROOT / "benchmark" / "grids" / "smoke.yaml"), "--dry-run").exit_code == 0
    run_dir = next(results.glob("nlp/*"))
    before = sorted(p.name for p in run_dir.rglob("*"))
    out = bench("sweep", "--resume", run_dir.name, "--dry-run")
    assert out.exit_code == 0, out.output
    assert "4 point(s) to run again" in out.output and out.output.count("would run again ") == 4
    assert sorted(p.name for p in run_dir.rglob("*")) == before, "a dry resume must not touch the run"

def test_the_global_batch_is_one_shown_choice_for_run_sweep_and_plan(bench, results, tmp_path):
    """`bench run --tag 175 --nodes 48` trained a global batch of 48 without a word while `bench plan` kept 96."""

    def point_json(out) -> dict:
        run = re.search(r"^run (\S+):", out.output, re.M).group(1)
        return json.loads(next((results / "nlp" / run).glob("*/point.json")).read_text())

    out = bench("run", "--tag", "175", "--nodes", "48", "--dry-run")
    assert "global batch 96 (the tag's, kept; gas 32 follows)" in out.output
    assert point_json(out)["layout"]["global_batch_size"] == 96
    out = bench("run", "--tag", "175", "--nodes", "48", "--batch", "keep-gas", "--dry-run")
    assert "global batch 48 (gas 16 kept from the tag (--batch keep-gas)" in out.output and "the tag's is 96" in out.output
    assert point_json(out)["layout"]["global_batch_size"] == 48
    out = bench("run", "--tag", "13", "--mbs", "3", "--dry-run")
    assert out.exit_code == 2 and "the tag's global batch 1024 is no multiple of dp 4 x mbs 3" in out.output
    grid = tmp_path / "g.yaml"
    grid.write_text('tag: "175"\nmatrix: {nodes: [48, 192]}\n')
    out = bench("sweep", str(grid), "--dry-run", "--no-plan")
    assert "global batch 96 (keep-global-batch)" in out.output, out.output
    out = bench("sweep", str(grid), "--dry-run", "--no-plan", "--batch", "keep-gas")
    assert "global batch 48 to 192 (keep-gas; the tag's is 96)" in out.output, out.output
    out = bench("plan", "--tag", "175", "--nodes", "48", "--top", "1")
    assert "global batch 96 (the tag's, kept; gas follows from dp x mbs)" in out.output

def test_a_sweep_says_why_each_point_was_dropped_in_the_users_words(bench, results):
    """The shipped 13B grid's drops named internal rules ("by tp-pp-world") or "integer division or modulo by
    zero", and `-v` added nothing: each dropped point is now listed with its reason, all of them with -v."""
    grid = str(ROOT / "benchmark" / "grids" / "13b-tp-pp-mbs.yaml")
    short = bench("sweep", grid, "--dry-run")
    assert short.exit_code == 0, short.output
    total = int(re.search(r"points, (\d+) dropped", short.output).group(1))
    assert total > 10 and f"and {total - 10} more (--verbose lists them" in short.output
    full = bench("sweep", grid, "--dry-run", "-v")
    dropped = [line for line in full.output.splitlines() if line.strip().startswith("dropped nodes=")]
    assert len(dropped) == total, full.output
    assert any("tp 8 x pp 8 = 64 devices per replica, more than the 32 that 8 node(s) have" in d for d in dropped)
    assert any(re.search(r"needs [\d.]+ GiB per device, 40 GiB available", d) for d in dropped)
    assert "tp-pp-world" not in full.output and "division" not in full.output
