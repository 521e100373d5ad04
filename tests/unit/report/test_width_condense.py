"""What a narrow table gives up before a figure (report/condense.py), and the progress line at a width: the
bar, the count and the elapsed time stay, at 80 columns and in a file."""

import re

import pytest

from nlp_bench.report.condense import common_line, run_prefixes, same_on_every_row, shorter_ids


def test_point_ids_keep_the_parts_that_tell_them_apart():
    ids = ["gpt-13b_n8_tp2_pp4_mbs1_gas32", "gpt-13b_n16_tp2_pp4_mbs1_gas16", "gpt-13b_n16_tp1_pp4_mbs1_gas8"]
    short, pattern = shorter_ids(ids)
    assert [short[i] for i in ids] == ["n8_tp2_gas32", "n16_tp2_gas16", "n16_tp1_gas8"]
    assert pattern == "gpt-13b_*_*_pp4_mbs1_*"
    uneven = ["gpt-13b_n8_tp2_pp4_mbs1_gas32", "gpt-13b_n16_tp2_pp4_mbs1_gas32_vp2"]
    assert shorter_ids(uneven) == ({uneven[0]: "n8_tp2_pp4_mbs1_gas32", uneven[1]: "n16_tp2_pp4_mbs1_gas32_vp2"},
                                   "gpt-13b_*")
    assert shorter_ids(["a_b", "a_b"]) == ({"a_b": "a_b"}, None)  # alike: nothing to tell apart
    assert shorter_ids(["a_b", "c_d"]) == ({"a_b": "a_b", "c_d": "c_d"}, None)  # nothing shared


def test_run_ids_become_the_shortest_prefixes_bench_still_takes():
    ids = ["20261128-191000.123456Z-abc123", "20261128-191000.123999Z-def456", "20261128-201500.000001Z-0a0b0c"]
    short = run_prefixes([*ids, ids[0]])
    assert [short[i] for i in ids] == ["20261128-191000.1234", "20261128-191000.1239", "20261128-201500"]
    assert all(sum(o.startswith(short[i]) for o in ids) == 1 for i in ids)


def test_columns_alike_on_every_row_are_said_once():
    headers = ["point", "system", "state", "queue", "Nodes"]
    rows = [["a", "jupiter", "COMPLETED", "-", "8"], ["b", "jupiter", "COMPLETED", "-", "16"]]
    common = same_on_every_row(headers, rows, keep=("point",))
    assert common == {"system": "jupiter", "state": "COMPLETED", "queue": ""}
    assert same_on_every_row(headers, rows[:1]) == {}, "one row has nothing to be alike with"
    assert common_line(common, 30) == "same on every row:\nsystem=jupiter,\nstate=COMPLETED\n"
    assert common_line({"queue": ""}, 80) == ""


INFO = "36,249 tokens/s, loss 10.123 (tokens/s: JUBE's, every interval so far)"


@pytest.mark.parametrize("columns", ["80", "60", None])
def test_the_progress_line_keeps_its_bar_count_and_time(capsys, monkeypatch, columns):
    """At 80 columns the line kept the point and the figures and lost the bar, `12/40` and the time, in a
    file too (where rich takes 80 columns); without COLUMNS a file gets FILE_WIDTH, room for it all."""
    from nlp_bench.report.console import FILE_WIDTH, progress_bar

    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    with progress_bar("gpt-175b_n96_tp8_pp8_mbs1_gas16", 40, info=True) as bar:
        bar.update(completed=12, total=40, info=INFO)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    width = int(columns) if columns else FILE_WIDTH
    assert lines and max(len(line) for line in lines) <= width, lines
    (line,) = lines
    assert "━" in line and "12/40" in line and re.search(r"\b0:00:\d\d\b", line) and "36,249 tokens/s" in line, line
    if columns is None:
        assert line.startswith("gpt-175b_n96_tp8_pp8_mbs1_gas16 ") and line.endswith(INFO), line
