"""`bench result compare`: measured rows against the published reference, with the 560 s verdict."""

import pytest

from conftest import DATA
from nlp_bench.analysis.reference import compare, reference_rows, verdict
from nlp_bench.launch import states


def test_reference_rows_compare_to_themselves_and_175b_passes():
    refs = reference_rows()
    rows = {r["model"]: r for r in compare(refs, refs)}
    big, small = rows["gpt-175b"], rows["gpt-13b"]
    assert big["Tokens/sec"] == 36055.39 and big["time_to_report_in_seconds"] == pytest.approx(554.70, abs=0.005)
    assert big["verdict"] == "pass" and big["ratio"] == 1.0 and big["reference"] == "same layout"
    assert small["time_to_report_in_seconds"] == pytest.approx(329.07, abs=0.005) and small["verdict"] is None


def test_verdict_is_the_560_s_rule():
    assert verdict("gpt-175b", 560.0) == "pass" and verdict("gpt-175b", 560.01) == "fail"
    assert verdict("gpt-13b", 10_000) is None and verdict("gpt-175b", None) is None


def _completed_175b(bench, results):
    """A 175B point whose job.out is the seed's verification log (96 nodes, tp 8, pp 8)."""
    assert bench("run", "--tag", "175", "--dry-run").exit_code == 0
    folder = next(results.glob("nlp/*/*/"))
    (folder / "job.out").write_text((DATA / "seed003_verification.log").read_text())
    states.record(folder, states.COMPLETED, executor="slurm", job_id="1", exit_code=0)
    return folder


def test_compare_a_measured_run(bench, results):
    _completed_175b(bench, results)
    out = bench("result", "compare", "--format", "csv")
    assert out.exit_code == 0, out.output
    header, row = out.output.splitlines()[:2]
    cells = dict(zip(header.split(","), row.split(",")))
    tokens = 96 * 2048 / ((7.2310 + 5.3551 + 5.6192 + 5.3291 + 5.3247) / 5)  # every interval, as the table
    assert float(cells["Tokens/sec"]) == pytest.approx(tokens)
    assert float(cells["ratio"]) == pytest.approx(tokens / 36055.39) and cells["reference"] == "same layout"
    assert float(cells["ratio_per_device"]) == pytest.approx(tokens / 36055.39)
    assert cells["verdict"] == "fail"  # 587 s: these five intervals include the slow first one
    pretty = bench("result", "compare")
    assert pretty.exit_code == 0 and "fail" in pretty.output and "same layout" in pretty.output


def test_compare_errors(bench, results):
    assert bench("run", "--tag", "smoke", "--dry-run").exit_code == 0
    from click.testing import CliRunner

    from nlp_bench.cli import cli

    for args, needle in ((["result", "compare"], "no completed point"),
                         (["result", "compare", "--reference", "nosuch"], "unknown reference 'nosuch'; references: jupiter")):
        out = CliRunner().invoke(cli, ["--results-dir", str(results), *args])
        assert out.exit_code == 2 and needle in out.stderr, out.output


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet", "sqlite"])
def test_exports_read_back_into_equal_frames(bench, results, tmp_path, fmt):
    """A completed point and a point that never ran (nulls everywhere), through every readable format."""
    import pandas as pd

    from nlp_bench.analysis.results import rows_frame, run_rows
    from nlp_bench.report.table import read_export
    from nlp_bench.sweep.workspace import find_run

    _completed_175b(bench, results)
    assert bench("run", "--tag", "13", "--dry-run").exit_code == 0
    rows = [row for run_ in sorted((results / "nlp").iterdir()) for row in run_rows(find_run(results, str(run_)))]
    target = tmp_path / f"table.{fmt}"
    out = bench("result", "export", str(next((results / "nlp").iterdir())), "--format", fmt, "-o", str(target))
    assert out.exit_code == 0, out.output
    from nlp_bench.report.table import export

    export(rows, fmt, target)
    pd.testing.assert_frame_equal(read_export(target, fmt), rows_frame(rows))
    assert not list(tmp_path.glob(".*.tmp")), "no temporary file is left behind"


@pytest.mark.parametrize("fmt,needle", [("html", "<table"), ("tex", "\\begin{tabular}"), ("md", "| system")])
def test_text_exports(bench, results, tmp_path, fmt, needle):
    _completed_175b(bench, results)
    target = tmp_path / f"table.{fmt}"
    out = bench("result", "export", "--format", fmt, "-o", str(target))
    text = target.read_text()
    assert out.exit_code == 0 and needle in text and "34063" in text and "<NA>" not in text, out.output
