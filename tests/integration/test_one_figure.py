"""One log, one number per figure: JUBE's (every interval) and the steady state's are each defined once
(analysis.metrics) and every view shows the same value under its own name: the progress bar, `bench status`,
the result table and its exports, `bench parse`, `bench result compare`, the report's headline."""

import json

import pytest
from conftest import record_job

from nlp_bench.analysis import metrics, parsers

#: seconds per iteration of each logged interval: a slow first one (warm-up), then a noisy steady state
TIMES = [2.4, 1.02, 0.97, 1.05, 0.99, 1.01, 0.96]

SEQ, GBS = 128, 4

def _log(times: list[float]) -> str:
    return "".join(f"[default1]: iteration {5 * i:8d}/      {5 * len(times)} | consumed samples: {20 * i:12d} | "
                   f"elapsed time per iteration (s): {t:.4f} | global batch size: {GBS:5d} | "
                   f"lm loss: 1.0E+01 | tokens per second: {GBS * SEQ / t:.1f} |\n" for i, t in enumerate(times, 1))

@pytest.fixture
def measured(bench, results):
    """A smoke point whose job logged TIMES."""
    assert bench("run", "--tag", "smoke", "--dry-run").exit_code == 0
    folder = next(p for p in results.glob("nlp/*/*/") if (p / "point.json").is_file())
    (folder / "job.out").write_text(_log(TIMES))
    record_job(folder, "COMPLETED", executor="local", job_id="1", exit_code=0)
    return folder

def test_every_view_shows_the_same_jube_and_steady_figures(bench, tmp_path, measured):
    jube = GBS * SEQ / (sum(TIMES) / len(TIMES))
    steady = GBS * SEQ / (sum(TIMES[1:]) / len(TIMES[1:]))
    records = parsers.parse_file(measured / "job.out")
    assert metrics.jube_tokens_per_s(records, SEQ) == pytest.approx(jube)

    table = json.loads(bench("result", "table", "--format", "json").stdout)[0]
    assert table["Tokens/sec"] == pytest.approx(jube) and table["Batch_Size"] == GBS
    exported = tmp_path / "x.json"
    assert bench("result", "export", "--format", "json", "-o", str(exported)).exit_code == 0
    assert json.loads(exported.read_text())[0]["Tokens/sec"] == pytest.approx(jube)

    for seq in (["--seq-length", str(SEQ)], []):  # without --seq-length the log's own tokens/s give the batch
        parsed = json.loads(bench("parse", str(measured / "job.out"), "--json", *seq).stdout)
        assert parsed["summary"]["tokens_per_s_all_intervals"] == pytest.approx(jube, rel=1e-4)
        assert parsed["summary"]["warmup_excluded"] == 1
        assert parsed["summary"]["tokens_per_s"]["mean"] == pytest.approx(steady, rel=1e-4)

    status = bench("status").stdout
    assert f"{jube:,.2f}" in status and "JUBE's figure" in status

    from nlp_bench.app.local_jobs import LogFollower

    follower = LogFollower(measured / "job.out", metrics.JubeFigure(SEQ, GBS))
    assert follower.update().iteration == 35 and follower.figure.value == pytest.approx(jube)

    compared = json.loads(bench("result", "compare", "--format", "json").stdout)[0]
    assert compared["Tokens/sec"] == pytest.approx(jube)

    from nlp_bench.report.headline import steady_note

    result = json.loads((measured / "result.json").read_text())
    assert result["summary"]["tokens_per_s"] == pytest.approx(jube)
    note = steady_note(result, 2e7 / jube)
    assert f"{2e7 / steady:,.2f} s" in note and "1 warm-up interval(s) of 7 left out" in note
    slower = TIMES[0] / (sum(TIMES[1:]) / 6) - 1
    assert f"they took {100 * slower:,.0f}% longer per iteration" in note
