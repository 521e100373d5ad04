"""`bench plan` and `bench plan validate` at 80 columns keep their figures: the nodes, the memory per device,
tokens/s, its interval and time_to_report of every row; in a file every column (issue 53, findings 2 and 9)."""

from __future__ import annotations

import json
import re


def _table_line(text: str, rank: int) -> str:
    return next(line for line in text.splitlines() if re.match(rf" *{rank}  ", line))


def test_plan_at_80_columns_keeps_every_figure_of_every_row(bench, monkeypatch):
    rows = [r for r in json.loads(bench("plan", "--tag", "175", "--json").output) if r["fits"]]
    monkeypatch.setenv("COLUMNS", "80")
    text = bench("plan", "--tag", "175").output
    assert max(map(len, text.splitlines())) <= 80, text
    assert "in every row: nodes 96" in text
    assert "GiB/" in text and "device" in text and "interval" in text
    for rank, row in enumerate(rows, 1):
        line = _table_line(text, rank)
        for figure in (f"{row['memory_gib']:.1f}", f"{row['tokens_per_s']:,.0f}",
                       f"{row['tokens_per_s_low']:,.0f}-{row['tokens_per_s_high']:,.0f}",
                       f"{row['time_to_report_s']:,.1f}", row["recompute"]):
            assert figure in line, (figure, line)


def test_plan_varying_nodes_at_80_columns_keeps_them_in_the_table(bench, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    text = bench("plan", "--tag", "175", "--nodes", "64", "--nodes", "128", "--tp", "8", "--pp", "8", "--vp", "1",
                 "--recompute", "selective", "--top", "4").output
    assert max(map(len, text.splitlines())) <= 80, text
    header = next(line for line in text.splitlines() if line.lstrip().startswith("#"))
    assert "nodes" in header
    assert {int(_table_line(text, rank).split()[1]) for rank in range(1, 5)} == {64, 128}


def test_plan_in_a_file_shows_every_column(bench, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    text = bench("plan", "--tag", "175").output
    header = next(line for line in text.splitlines() if line.lstrip().startswith("#"))
    assert header.split() == ["#", "nodes", "tp", "pp", "dp", "vp", "mbs", "gas", "GBS", "recompute", "dist-opt",
                              "GiB/device", "tokens/s", "interval", "time_to_report", "s", "corpus"]
    assert "in every row" not in text and "left out" not in text


def test_validate_at_80_columns_keeps_each_rows_figures(bench, monkeypatch):
    found = json.loads(bench("plan", "validate", "--json").output)
    monkeypatch.setenv("COLUMNS", "80")
    text = bench("plan", "validate").output
    assert max(map(len, text.splitlines())) <= 80, text
    for row in found["rows"]:
        line = next(line for line in text.splitlines() if line.startswith(row["id"] + " "))
        for figure in (f"{row['measured']:,.0f}", f"{row['predicted']:,.0f}", f"{100 * row['error']:+.1f}%",
                       "yes" if row["inside"] else "NO"):
            assert figure in line, (figure, line)


def test_plan_help_lists_the_options_plan_takes(bench):
    out = bench("plan", "--help")
    assert out.exit_code == 0
    section = out.output.split("Options without a command", 1)[1]
    for option in ("--tag", "--system", "--nodes", "--vp", "--recompute", "--top", "--json", "--model"):
        assert re.search(rf"^\s+{option}\b", section, re.M), out.output
    assert out.output.splitlines()[-1].strip()  # no empty entry for the RUN arguments
