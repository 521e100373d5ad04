"""A dry run, as a user deciding whether to submit reads it: the planner's prediction of every point in one
line (tokens/s, its interval, time_to_report against the baseline, memory per device, extrapolated or not),
the tracked way to submit (`--resume`, which status and the table follow) rather than a loop of sbatch, and
points not handed to the scheduler yet that read as waiting their turn, in old records too."""

import json
import re

from conftest import csv_rows

from nlp_bench import flops
from nlp_bench.store import states
from nlp_bench.store.point_folder import PointDir


def _prediction(results) -> dict:
    (path,) = results.glob("nlp/*/*/prediction.json")
    return json.loads(path.read_text())


def test_a_dry_run_prints_its_prediction_in_one_line(bench, results):
    out = bench("run", "--tag", "175", "--dry-run")
    assert out.exit_code == 0, out.output
    found = _prediction(results)
    (line,) = [line for line in out.output.splitlines() if line.strip().startswith("predicted:")]
    tokens, seconds = found["tokens_per_s"], flops.time_to_report(found["tokens_per_s"])
    assert f"{tokens:,.0f} tokens/s ({found['tokens_per_s_low']:,.0f}-{found['tokens_per_s_high']:,.0f})" in line
    sign = "<=" if seconds <= 560 else ">"
    assert f"time_to_report {seconds:,.1f} s {sign} 560 s" in line, line
    assert re.search(rf"{found['memory_gib']:.1f} of \d+ GiB per device", line), line
    assert ("extrapolated" in line) == found["extrapolated"] and ("inside the planner's corpus" in line) != \
        found["extrapolated"], line


def test_an_extrapolated_prediction_says_so_and_what_lies_outside(bench, results):
    out = bench("run", "--tag", "gpu-small", "--dry-run")
    assert out.exit_code == 0, out.output
    found = _prediction(results)
    assert found["extrapolated"] and found["outside_corpus"], found
    (line,) = [line for line in out.output.splitlines() if line.strip().startswith("predicted:")]
    assert f"extrapolated ({found['outside_corpus'][0]}" in line, line
    table = csv_rows(bench("result", "table", "--format", "csv").output)
    assert table[0]["Extrapolated"] == "True" and table[0]["Predicted_Tokens/sec"], table


def test_a_dry_run_sweep_says_the_tracked_way_and_its_points_read_as_waiting(bench, results, tmp_path):
    grid = tmp_path / "g.yaml"
    grid.write_text("tag: smoke\nsystem: local\nmatrix: {gas: [1, 2]}\n")
    out = bench("sweep", str(grid), "--dry-run")
    assert out.exit_code == 0, out.output
    run = next(results.glob("nlp/*/run.json")).parent
    assert f"bench sweep --resume {run}" in out.output and "sbatch" not in out.output, out.output
    ids = sorted(p.name for p in run.iterdir() if (p / "point.json").is_file())
    assert [line.split(":")[0].strip() for line in out.output.splitlines() if ": predicted:" in line] == ids
    status = bench("status", str(run))
    assert status.output.count(states.NOT_SUBMITTED) == 2 and "NOT_SUBMITTED" not in status.output, status.output
    rows = csv_rows(bench("result", "table", str(run), "--format", "csv").output)
    assert [r["state"] for r in rows] == ["TO_SUBMIT"] * 2


def test_a_one_point_slurm_dry_run_says_the_tracked_way_first_and_by_hand_second(bench, results):
    out = bench("run", "--tag", "smoke", "--system", "local-slurm", "--dry-run")
    assert out.exit_code == 0, out.output
    run = next(results.glob("nlp/*/run.json")).parent
    lines = out.output.splitlines()
    tracked = next(i for i, line in enumerate(lines) if f"bench run --resume {run}" in line)
    assert "untracked" in lines[tracked + 1] and "sbatch jobscript.sbatch" in lines[tracked + 1], out.output


def test_a_record_that_says_not_submitted_still_reads(bench, results):
    """state.json written before the state was spelt TO_SUBMIT: read, shown and resumed as the same state."""
    assert bench("run", "--tag", "smoke", "--dry-run").exit_code == 0
    (folder,) = (p.parent for p in results.glob("nlp/*/*/point.json"))
    (folder / "state.json").write_text(json.dumps({"state": "NOT_SUBMITTED", "attempts": [
        {"number": 1, "executor": "local", "state": "NOT_SUBMITTED", "failure_detail": "could not start bash"}]}))
    assert PointDir(folder).state().state == states.NOT_SUBMITTED == "TO_SUBMIT"
    out = bench("run", "--resume", folder.parent.name, "--dry-run")
    assert out.exit_code == 0 and "1 point(s) to run again" in out.output, out.output
    assert "TO_SUBMIT" in bench("status").output


def test_the_tracked_way_refuses_what_a_run_refuses(bench, results):
    """A dry run's point predicted not to fit: `--resume`, the way the dry run suggests to submit it, refuses
    it as `bench run` would, in one line, before anything reaches the scheduler (--force submits anyway)."""
    out = bench("run", "--tag", "175", "--tp", "2", "--pp", "2", "--gas", "1", "--dry-run")
    assert out.exit_code == 0 and "predicted not to fit" in out.output, out.output
    assert _prediction(results)["fits"] is False
    (run,) = [p.name for p in results.glob("nlp/*")]
    refused = bench("sweep", "--resume", run)
    assert refused.exit_code == 2, refused.output
    assert "is predicted not to fit" in refused.stderr and "nothing was submitted" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    (point,) = results.glob("nlp/*/*/")
    assert PointDir(point).state().state == states.NOT_SUBMITTED
