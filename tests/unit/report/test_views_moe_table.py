"""A point of a mixture-of-experts model in the result table, its exports and the HTML report: its expert
parallelism and its active and total parameters, and what its MFU counts (the active parameters' FLOPs,
causal attention halved). A table and a report of dense points read as they did.

The MoE point is a dry run of moe-tiny whose point.json is given ep 2 (the layout a two-rank expert-parallel
run records) and whose log is then written as a finished job's (tests/measured_runs.py): no training."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from measured_runs import measured_logs

from nlp_bench import flops
from nlp_bench.spec.layout import Layout
from nlp_bench.spec.models import get_model

#: each tag one CPU node of two ranks, tp 1, pp 1: moe-tiny (ep 2 written into its point.json) and llama-tiny
TAG = """    system: local
    nodes: 1
    tp: 1
    pp: 1
    mbs: 2
    gas: 2
    train: {train-iters: 40, lr: 0.001, mock-data: true}
"""
BENCHMARK = "name: b\ntags:\n" + "".join(f"  {tag}:\n    model: {model}\n{TAG}"
                                          for tag, model in (("moe", "moe-tiny"), ("dense", "llama-tiny")))


def _run(bench, results: Path, tmp_path: Path, tag: str) -> Path:
    """The tag's point dry-run and measured (moe: with ep 2 in its layout); its folder."""
    path = tmp_path / "b.yaml"
    path.write_text(BENCHMARK)
    before = set(results.glob("b/*/*/"))
    out = bench("run", "--benchmark", str(path), "--tag", tag, "--dry-run")
    assert out.exit_code == 0, out.output
    (folder,) = set(results.glob("b/*/*/")) - before
    if tag == "moe":
        point = json.loads((folder / "point.json").read_text())
        lay = point["layout"]
        point["layout"] = Layout(lay["nodes"], lay["devices_per_node"], lay["tp"], lay["pp"], lay["mbs"], lay["gas"],
                                 ep=2).to_dict()
        (folder / "point.json").write_text(json.dumps(point, indent=2))
    measured_logs([folder], lambda lay: 0.5)
    return folder


@pytest.fixture
def moe_point(bench, results, tmp_path) -> Path:
    return _run(bench, results, tmp_path, "moe")


def _counts() -> tuple[int, int]:
    model = get_model("moe-tiny")
    return model.active_parameters(32000), model.total_parameters(32000)


def test_the_row_of_an_moe_point_has_its_ep_and_parameters(bench, moe_point):
    (row,) = list(csv.DictReader(io.StringIO(bench("result", "table", "--format", "csv").output)))
    active, total = _counts()
    assert (row["EP"], row["Active_Params"], row["Total_Params"]) == ("2", str(active), str(total))
    assert active < total and row["MFU"]


def test_at_80_columns_the_moe_row_shows_ep_active_and_total(bench, moe_point, monkeypatch):
    """At 80 columns one row cannot show every column: the experts' three stay (tp and pp of 1 go first), and
    the MFU, left out, needs no line under the table."""
    monkeypatch.setenv("COLUMNS", "80")
    out = bench("result", "table").output
    assert max(len(line) for line in out.splitlines()) <= 80, out
    cells = _cells(out)
    active, total = _counts()
    assert (cells["EP"], cells["Active Params"], cells["Total Params"]) == ("2", f"{active / 1e6:.3g}M",
                                                                          f"{total / 1e6:.3g}M"), out
    assert "MFU" not in cells and "experts" not in out, out


def test_where_the_table_shows_the_mfu_it_says_what_an_moe_rows_counts(bench, moe_point, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)  # to a pipe: every column
    out = bench("result", "table").output
    assert {"EP", "MFU", "Active_Params"} <= set(out.split()), out
    assert "experts" in bench("result", "table", "--columns", "MFU,EP").output
    flat = " ".join(out.split())
    assert ("MFU of a row with experts (Active_Params): active parameters only (each token's top-k routed experts "
            "and the shared experts; not the router's GEMM), causal attention halved, as Megatron-LM "
            "core_v0.20.0's num_floating_point_operations counts them") in flat, out


def _cells(out: str) -> dict[str, str]:
    """A fitted table's one row by header (a wrapped header's lines joined), read by the header's columns."""
    lines = out.splitlines()
    rule = next(i for i, line in enumerate(lines) if set(line.strip()) == {"─"})
    row, head = lines[rule + 1], lines[:rule]
    spans, start = [], None
    for x in range(len(row) + 1):  # a column is a run of non-blank characters in the row or any header line
        filled = any(x < len(line) and line[x] != " " for line in [row, *head])
        if filled and start is None:
            start = x
        elif not filled and start is not None:
            spans.append((start, x))
            start = None
    return {" ".join(line[a:b].strip() for line in head if line[a:b].strip()): row[a:b].strip() for a, b in spans}


def test_a_dense_table_and_report_say_nothing_of_experts(bench, results, tmp_path, monkeypatch):
    _run(bench, results, tmp_path, "dense")
    (row,) = list(csv.DictReader(io.StringIO(bench("result", "table", "--format", "csv").output)))
    assert (row["EP"], row["Active_Params"], row["Total_Params"]) == ("", "", "") and row["MFU"]
    for width in ("80", "200"):
        monkeypatch.setenv("COLUMNS", width)
        out = bench("result", "table").output
        assert "EP" not in out.split() and "Active" not in out and "experts" not in out, out
    monkeypatch.delenv("COLUMNS")
    wide = bench("result", "table", "--wide").output  # every column, as it says: the experts' ones empty
    lines = wide.splitlines()
    cells = dict(zip(lines[1].split(), lines[3].split(), strict=True))
    assert [cells[c] for c in ("EP", "Active_Params", "Total_Params")] == ["-"] * 3 and "experts" not in wide, wide
    report = tmp_path / "dense.html"
    assert bench("result", "report", "-o", str(report)).exit_code == 0
    html = report.read_text()
    assert 'id="mfu-experts"' not in html and "Active_Params" not in html and "EP <b>" not in html
    assert "EP" not in html.split('id="empty-columns">')[1].split("</p>")[0]
    basis = json.loads(next(results.glob("b/*/*/result.json")).read_text())["summary"]["mfu_basis"]
    assert basis["formula"] == flops.FORMULAS[flops.MEGATRON_MODEL] and "parameters" not in basis


def test_the_report_shows_ep_active_and_total_and_what_the_mfu_counts(bench, results, moe_point, tmp_path):
    report = tmp_path / "moe.html"
    assert bench("result", "report", "-o", str(report)).exit_code == 0
    html = report.read_text()
    active, total = _counts()
    said = " ".join(html.split("id=\"same-columns\"")[1].split("</p>")[0].split())
    assert "EP <b>2</b>" in said and f"Active_Params <b>{active / 1e6:.3g}M</b>" in said, said
    assert f"Total_Params <b>{total / 1e6:.3g}M</b>" in said, said
    note = " ".join(html.split('id="mfu-experts">')[1].split("</p>")[0].split())
    assert note.startswith(f"The MFU of 1 point with experts ({moe_point.name}: EP is its expert parallelism"), note
    assert (f"counts {flops.MOE_MFU_BASIS}, in place of the formula above: {flops.MOE_FORMULA}."
            in note.replace("&#39;", "'")), note
    basis = json.loads((moe_point / "result.json").read_text())["summary"]["mfu_basis"]
    assert (basis["parameters"], basis["formula"]) == ("active", flops.MOE_FORMULA)


def test_a_table_of_both_keeps_the_dense_row_empty_in_the_experts_columns(bench, results, tmp_path, monkeypatch):
    _run(bench, results, tmp_path, "dense")
    _run(bench, results, tmp_path, "moe")
    monkeypatch.setenv("COLUMNS", "80")
    out = bench("result", "table", "--all").output
    assert max(len(line) for line in out.splitlines()) <= 80, out
    lines = out.splitlines()
    rule = next(i for i, line in enumerate(lines) if set(line.strip()) == {"─"})
    header = " ".join(lines[:rule])
    assert "EP" in header.split() and "Active" in header, out
    dense, moe = sorted(lines[rule + 1:rule + 3], key=lambda line: "moe" in line)
    assert "2" in moe.split() and dense.split().count("-") >= 3, out


def test_an_export_from_before_the_experts_columns_reads_back(tmp_path):
    from nlp_bench.analysis.results import MOE_COLUMNS, RESULT_COLUMNS
    from nlp_bench.report.table import read_export

    old = [c for c in RESULT_COLUMNS if c not in MOE_COLUMNS]
    path = tmp_path / "table.csv"
    path.write_text(",".join(old) + "\n" + ",".join("1" if c == "Nodes" else "" for c in old) + "\n")
    frame = read_export(path, "csv")
    assert list(frame.columns) == RESULT_COLUMNS and frame["Nodes"].tolist() == [1]
    assert frame["EP"].isna().all()


@pytest.mark.parametrize("count,text", [(4_338_688, "4.34M"), (999_600_000, "1B"), (999_400_000, "999M"),
                                        (46_702_792_704, "46.7B"), (671_026_419_200, "671B"), (37e12, "37T"),
                                        (512, "512")])
def test_parameter_counts_are_three_digits_and_a_unit(count, text):
    from nlp_bench.report.table import format_cell

    assert format_cell("Active_Params", count) == format_cell("Total_Params", count) == text
