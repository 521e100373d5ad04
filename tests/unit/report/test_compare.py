"""`bench result compare` in-process: measured rows against the published reference, with the 560 s verdict;
and the tables, plots, status and exports made from those rows, read back."""

import json

import pytest
from conftest import record_job
from measured_runs import completed_175b, fake_sweep

from nlp_bench import __version__
from nlp_bench.analysis.reference import compare, reference_rows, verdict
from nlp_bench.store import states


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


def test_compare_a_measured_run(bench, results):
    completed_175b(bench, results)
    out = bench("result", "compare", "--format", "csv")
    assert out.exit_code == 0, out.output
    header, row = out.output.splitlines()[:2]
    cells = dict(zip(header.split(","), row.split(","), strict=False))
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
    from nlp_bench.store.runs import find_run

    completed_175b(bench, results)
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
    completed_175b(bench, results)
    target = tmp_path / f"table.{fmt}"
    out = bench("result", "export", "--format", fmt, "-o", str(target))
    text = target.read_text()
    assert out.exit_code == 0 and needle in text and "34063" in text and "<NA>" not in text, out.output


def test_plots_for_a_sweep(bench, results, tmp_path):
    fake_sweep(bench, results, tmp_path)
    out = bench("result", "plot", "-o", str(tmp_path / "plots"))
    assert out.exit_code == 0, out.output
    files = {p.name: p for p in (tmp_path / "plots").iterdir()}
    for stem in ("strong_scaling", "time_to_report", "heatmap_gpt-13b_n8", "heatmap_gpt-13b_n16",
                 "trace_gpt-13b_n8_tp2_pp4_mbs1_gas256"):
        png, svg = files[f"{stem}.png"], files[f"{stem}.svg"]
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000, stem
        assert "<svg" in svg.read_text()[:500] and svg.stat().st_size > 5000, stem
    assert len(files) == 2 * (2 + 2 + 8)  # scaling, time to report, two heatmaps, eight traces

def test_plot_without_completed_points_is_one_line(bench, results, tmp_path):
    assert bench("run", "--tag", "smoke", "--dry-run").exit_code == 0
    from click.testing import CliRunner

    from nlp_bench.cli import cli

    out = CliRunner().invoke(cli, ["--results-dir", str(results), "result", "plot", "-o", str(tmp_path / "p")])
    assert out.exit_code == 2 and "no completed point" in out.stderr

def test_table_over_runs_sorted_and_filtered(bench, results, tmp_path):
    from nlp_bench.api import load_results

    fake_sweep(bench, results, tmp_path)
    assert bench("run", "--tag", "13", "--dry-run").exit_code == 0  # a second run, not submitted
    every = bench("result", "table", "--all", "--format", "csv")
    assert every.exit_code == 0 and len(every.output.splitlines()) == 1 + 8 + 1, every.output
    fast = bench("result", "table", "--all", "--format", "csv", "--filter", "Nodes == 16 and Tokens_sec > 100000",
                 "--sort", "-Tokens/sec")
    lines = fast.output.splitlines()
    assert fast.exit_code == 0 and len(lines) == 2 and ",gpt-13b_n16_tp2_pp4_mbs1_gas128" in lines[1], fast.output
    header, *ordered = bench("result", "table", "--all", "--format", "csv", "--sort", "Tokens_sec").output.splitlines()
    assert "TO_SUBMIT" in ordered[-1], "rows without the value come last"
    where = [header.split(",").index(name) for name in ("point", "trainer", "trainer_version")]
    assert [ordered[-2].split(",")[i] for i in where] == ["gpt-13b_n16_tp2_pp4_mbs1_gas128", "builtin", __version__]
    frame = load_results(results)
    assert len(frame) == 9 and frame["Tokens/sec"].notna().sum() == 8 and str(frame["Nodes"].dtype) == "Int64"
    from click.testing import CliRunner

    from nlp_bench.cli import cli

    for args, needle in ((["--filter", "Tokens_secc > 1"], "unknown column Tokens_secc"),
                         (["--sort", "nosuch"], "--sort: unknown column 'nosuch'"),
                         (["--filter", "__import__('os')"], "only min, max, abs, int may be called")):
        out = CliRunner().invoke(cli, ["--results-dir", str(results), "result", "table", "--all", *args])
        assert out.exit_code == 2 and needle in out.stderr, out.output

def test_plots_of_two_runs_of_the_same_points_keep_both_traces(bench, results, tmp_path):
    fake_sweep(bench, results, tmp_path)
    fake_sweep(bench, results, tmp_path)  # the same eight points again, in a second run
    runs = sorted(p.name for p in (results / "nlp").iterdir())
    out = bench("result", "plot", *runs, "-o", str(tmp_path / "plots"))
    assert out.exit_code == 0, out.output
    traces = sorted(p.name for p in (tmp_path / "plots").glob("trace_*.png"))
    assert len(traces) == 16 and all(any(run in t for run in runs) for t in traces)

def _table_rows(text: str) -> list[str]:
    """The data lines of a pretty table: those between the header rule and the first blank line after it."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if set(line.strip()) == {"─"}) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]

@pytest.mark.parametrize("width", [40, 60, 80, 100, 120, 160])
def test_pretty_table_fits_the_terminal_and_names_what_it_left_out(bench, results, tmp_path, monkeypatch, width):
    fake_sweep(bench, results, tmp_path)
    monkeypatch.setenv("COLUMNS", str(width))
    out = bench("result", "table")
    assert out.exit_code == 0, out.output
    assert max(len(line) for line in out.output.splitlines()) <= width, out.output
    rows = _table_rows(out.output)
    assert len(rows) == 8, out.output  # one line per point, none wrapped
    if width >= 60:  # each told apart (at 40 the figures take the room)
        assert len(set(rows)) == 8, out.output
    note = " ".join(out.output.split("left out: ")[1].split())
    left_out = note.split(" (")[0].split(", ")
    assert {"point", "failure_class"} <= set(left_out) and "--wide" in note
    assert "run=" in " ".join(out.output.split("─")[0].split()), "alike on every row: said once, above"
    if width >= 100:  # the layout and the JUBE figures come first
        for header in ("Nodes", "Tensor", "Pipeline", "Tokens/sec"):
            assert header in out.output
        assert not {"Tensor_Parallel", "Tokens/sec", "time_to_report_in_seconds"} & set(left_out)

def test_pretty_table_wide_and_chosen_columns(bench, results, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from nlp_bench.analysis.results import RESULT_COLUMNS
    from nlp_bench.cli import cli

    fake_sweep(bench, results, tmp_path)
    monkeypatch.setenv("COLUMNS", "100")
    wide = bench("result", "table", "--wide").output
    header = wide.splitlines()[1].split()
    assert header == RESULT_COLUMNS and len(_table_rows(wide)) == 8 and "left out" not in wide
    chosen = bench("result", "table", "--columns", "point,Tokens_sec, state").output
    assert chosen.splitlines()[1].split() == ["point", "Tokens/sec", "state"] and len(_table_rows(chosen)) == 8
    csv_lines = bench("result", "table", "--format", "csv", "--columns", "Nodes,Tokens/sec").output.splitlines()
    assert csv_lines[0] == "Nodes,Tokens/sec" and len(csv_lines) == 9
    assert bench("result", "table", "--format", "csv").output.splitlines()[0].split(",") == RESULT_COLUMNS
    for args, needle in ((["--columns", "Tokens/secc"], "did you mean"), (["--wide", "--columns", "Nodes"], "give one")):
        out = CliRunner().invoke(cli, ["--results-dir", str(results), "result", "table", *args])
        assert out.exit_code == 2 and needle in out.stderr, out.output

@pytest.mark.parametrize("width", [60, 80, 120])
def test_status_fits_the_terminal_one_line_per_point(bench, results, tmp_path, monkeypatch, width):
    fake_sweep(bench, results, tmp_path)
    folder = sorted((results / "nlp").glob("*/gpt-13b_n8_tp2_pp4*"))[0]
    record_job(folder, states.FAILED, failure_class="python_exception", failure_detail="ValueError: " + "x" * 300)
    monkeypatch.setenv("COLUMNS", str(width))
    out = bench("status").output
    assert max(len(line) for line in out.splitlines()) <= width, out
    rows = _table_rows(out)
    assert len(rows) == 8 and sum("COMPLETED" in r for r in rows) == 7 and sum("FAILED" in r for r in rows) == 1
    assert "job=1, iteration=60/1000" in " ".join(out.split()), "alike on every row: said once"

def test_the_reference_rows_come_beside_the_newest_run_not_instead_of_it(bench, results):
    """`bench result table --reference` without a RUN showed the two reference rows alone."""
    alone = json.loads(bench("result", "table", "--reference", "--format", "json").output)
    assert {r["state"] for r in alone} == {"REFERENCE"}  # no run yet: the reference rows are all there is
    assert bench("run", "--tag", "13", "--dry-run").exit_code == 0
    rows = json.loads(bench("result", "table", "--reference", "--format", "json").output)
    assert {r["state"] for r in rows} == {"REFERENCE", "TO_SUBMIT"} and len(rows) == len(alone) + 1

def test_filter_sort_and_columns_take_one_spelling(bench, results):
    completed_175b(bench, results)
    assert bench("run", "--tag", "13", "--dry-run").exit_code == 0
    both = [bench("result", "table", "--all", "--format", "csv", "--filter", f"{name} > 1000", "--sort", f"-{name}",
                  "--columns", f"point,{name}").output for name in ("Tokens/sec", "Tokens_sec")]
    assert both[0] == both[1] and len(both[0].splitlines()) == 2 and both[0].startswith("point,Tokens/sec")

def test_at_80_columns_the_rows_of_a_sweep_are_told_apart(bench, results, tmp_path, monkeypatch):
    """At 80 columns the table dropped DP, MBS, GAS, the batch, the state and the point: the four rows of the
    smoke sweep looked identical."""
    (tmp_path / "g.yaml").write_text("tag: smoke\nmatrix: {gas: [1, 2, 4, 8]}\n")
    assert bench("sweep", str(tmp_path / "g.yaml"), "--dry-run").exit_code == 0
    for folder in results.glob("nlp/*/*/"):
        if (folder / "point.json").is_file():
            (folder / "job.out").write_text(" iteration        5/      40 | elapsed time per iteration (s): 1.0000 | "
                                            "global batch size:     4 | lm loss: 1.0E+01 |\n")
            record_job(folder, states.COMPLETED, executor="local", job_id="1", exit_code=0)
    monkeypatch.setenv("COLUMNS", "80")
    out = bench("result", "table").output
    assert max(len(line) for line in out.splitlines()) <= 80, out
    rows = _table_rows(out)
    assert len(rows) == 4 and len(set(rows)) == 4 and "GAS" in out, out

@pytest.mark.parametrize("width", [80, 120])
def test_plan_and_compare_fit_the_terminal(bench, results, tmp_path, monkeypatch, width):
    completed_175b(bench, results)
    monkeypatch.setenv("COLUMNS", str(width))
    for args in (["plan", "--tag", "175"], ["plan", "--tag", "13", "--top", "20"], ["plan", "target", "560"],
                 ["result", "compare"], ["result", "compare", "--reference", "jupiter"]):
        out = bench(*args)
        assert out.exit_code == 0, out.output
        assert max(len(line) for line in out.output.splitlines()) <= width, (args, out.output)
    assert "tokens/s" in bench("plan", "--tag", "175").output and "point" in bench("result", "compare").output
