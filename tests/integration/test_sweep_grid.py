"""Grid files: expansion semantics, every dropped point with its reason, safe expressions, rules."""

import json

import yaml
from conftest import ROOT, run_bench
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nlp_bench.store.dropped import dropped_rows

LARGE_GRID = """tag: "175"
batch: keep-gas
matrix:
  nodes: [{nodes}]
  tp: [1, 2, 4, 8]
  pp: [1, 2, 4, 8]
  mbs: [1, 2]
"""

def test_a_grid_over_the_threshold_writes_nothing(tmp_path, monkeypatch):
    """1,600 combinations, 1,550 runnable points: more than the default 1,000 point folders. One line, exit 2,
    no run folder, nothing left in the temporary folder; --max-points raises the threshold. The process gets a
    temporary folder of its own: the shared /tmp holds the dropped-point files of tests running beside it."""
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(private_tmp))
    path = tmp_path / "large.yaml"
    path.write_text(LARGE_GRID.format(nodes=", ".join(str(n) for n in range(8, 8 + 8 * 50, 8))))
    proc = run_bench("sweep", str(path), "--dry-run", "--no-plan", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench: error: the grid"), proc.stderr
    assert "1,550 runnable points (1,600 combinations), more than --max-points 1,000" in lines[0]
    assert "--top K" in lines[0] and "nothing was written" in lines[0]
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").rglob("run.json"))
    assert not any(private_tmp.iterdir())
    proc = run_bench("sweep", str(path), "--dry-run", "--no-plan", "--max-points", "1600", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(list((tmp_path / "results").rglob("jobscript.sbatch"))) == 1550

def test_top_k_keeps_only_k_of_a_grid_over_the_threshold(tmp_path):
    path = tmp_path / "large.yaml"
    path.write_text(LARGE_GRID.format(nodes=", ".join(str(n) for n in range(8, 8 + 8 * 50, 8))))
    proc = run_bench("sweep", str(path), "--dry-run", "--top", "5", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = next((tmp_path / "results").rglob("run.json")).parent
    assert len(list(run.glob("*/jobscript.sbatch"))) == 5
    meta = json.loads((run / "run.json").read_text())
    assert meta["combinations"] == 1600 and sum(meta["dropped_by_rule"].values()) == 1600 - 5
    assert meta["dropped_by_rule"]["planner: not among the 5 fastest"] > 0

def test_dropped_points_are_counted_by_rule_and_streamed_to_a_compressed_file(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text('tag: "13"\nmatrix: {tp: [1, 2, 3, 4, 5], pp: [1, 2, 3, 4]}\nexclude: ["tp * pp == 2"]\n')
    proc = run_bench("sweep", str(path), "--dry-run", "--no-plan", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = next((tmp_path / "results").rglob("run.json")).parent
    rows = list(dropped_rows(run))
    meta = json.loads((run / "run.json").read_text())
    counts = meta["dropped_by_rule"]
    assert sum(counts.values()) == len(rows) == 20 - len(meta["points"])
    # 32 devices: tp x pp = 3, 5, 6, 9, 10, 12, 15, 20 do not divide them; 1 x 2 and 2 x 1 are excluded
    assert counts == {"exclude 'tp * pp == 2'": 2, "tp x pp does not divide the devices": 11}
    assert all(r["reason"] and r["rule"] in counts for r in rows)
    assert "dropped 2: exclude 'tp * pp == 2'" in proc.stdout

def test_sweep_dry_run_writes_every_point_and_the_reasons(tmp_path):
    proc = run_bench("sweep", str(ROOT / "benchmark" / "grids" / "13b-tp-pp-mbs.yaml"), "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_json = next(tmp_path.glob("results/nlp/*/run.json"))
    meta = json.loads(run_json.read_text())
    scripts = list(run_json.parent.glob("*/jobscript.sbatch"))
    # 48 valid combinations: 3 break a layout rule; the planner predicts 14 need more than the A100's 40 GiB
    dropped = list(dropped_rows(run_json.parent))
    planner = [d for d in dropped if d["reason"].startswith("planner: needs ")]
    assert len(planner) == 14 and all("GiB per device, 40 GiB available" in d["reason"] for d in planner)
    assert len(scripts) == len(meta["points"]) == 45 - 14
    assert len(dropped) == 3 + 14 and all(d["reason"] for d in dropped)
    assert "31 points, 17 dropped" in proc.stdout and f"bench sweep --resume {run_json.parent.name}" in proc.stdout
    assert all((s.parent / "prediction.json").is_file() for s in scripts)
    table = run_bench("result", "table", "--format", "csv", cwd=tmp_path)
    assert table.stdout.count("TO_SUBMIT") == 31

GRID_VALUES = st.one_of(st.integers(-3, 64), st.text(max_size=8), st.lists(st.integers(0, 8), max_size=3),
                        st.none(), st.floats(allow_nan=True))

GRID_FILES = st.dictionaries(
    st.sampled_from(["tag", "system", "matrix", "zip", "derived", "exclude", "constraints", "train", "bogus"]),
    st.one_of(GRID_VALUES, st.dictionaries(st.sampled_from(["tp", "pp", "mbs", "gas", "nodes", "precision", "x"]),
                                           GRID_VALUES, max_size=3),
              st.lists(st.text(max_size=12), max_size=2)),
    max_size=4)

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(GRID_FILES)
def test_fuzzed_grid_files_fail_cleanly(tmp_path, data):
    """Whatever a grid file holds: success, or one line and exit 2, and no half-written run."""
    from click.testing import CliRunner

    from nlp_bench.cli import cli

    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(data))
    results = tmp_path / "r"
    before = set(results.glob("*/*"))  # runs of earlier examples: the fixture's folder is shared
    out = CliRunner().invoke(cli, ["--results-dir", str(results), "sweep", str(path), "--dry-run",
                                   "--max-points", "50"], catch_exceptions=True)
    assert out.exception is None or isinstance(out.exception, SystemExit), repr(out.exception)
    assert out.exit_code in (0, 2), out.output
    if out.exit_code == 2:
        errors = [line for line in out.output.splitlines() if line.startswith("bench: error:")
                  or line.startswith("Error:")]
        assert len(errors) == 1, out.output
        assert set(results.glob("*/*")) == before, "a refused grid must not leave a run behind"
    for run_json in results.glob("*/*/run.json"):
        meta = json.loads(run_json.read_text())
        assert len(list(run_json.parent.glob("*/jobscript.sbatch"))) == len(meta["points"])
