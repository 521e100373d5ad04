"""`bench result compare` and `bench status` at 80 columns, in-process: the figures stay, the columns alike on
every row are said once and long point ids are cut to what tells them apart, before anything else goes."""

import csv
import io

from conftest import record_job
from measured_runs import fake_sweep

from nlp_bench.store import states


def test_at_80_columns_compare_keeps_tokens_and_time_to_report(bench, results, tmp_path, monkeypatch):
    """It kept the 31-character point ids and four layout columns, and left out Tokens/sec and
    time_to_report_in_seconds."""
    fake_sweep(bench, results, tmp_path)
    expected = list(csv.DictReader(io.StringIO(bench("result", "compare", "--format", "csv").output)))
    monkeypatch.setenv("COLUMNS", "80")
    out = bench("result", "compare").output
    assert max(len(line) for line in out.splitlines()) <= 80, out
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("---")) + 1
    rows = lines[start:start + len(expected)]
    for line, row in zip(rows, expected, strict=True):
        cells = line.split()
        for column, digits in (("Tokens/sec", 2), ("time_to_report_in_seconds", 2), ("ratio", 3)):
            assert f"{float(row[column]):.{digits}f}" in cells, (column, line, row)
        assert set(cells[0].split("_")) < set(row["point"].split("_")), (line, row)  # the parts that differ
    said = " ".join(out.split("\npoint")[0].split())
    assert said.startswith("same on every row: point=gpt-13b_*_*_*_mbs1_*,") and "MBS=1" in said, out


def test_at_80_columns_status_shows_the_failure_and_says_the_alike_once(bench, results, tmp_path, monkeypatch):
    """It left out the job, the elapsed time and the failure, and repeated `60/1000` and `-` on every row."""
    fake_sweep(bench, results, tmp_path)
    folder = sorted((results / "nlp").glob("*/gpt-13b_n8_tp2_pp4*"))[0]
    record_job(folder, states.FAILED, failure_class="python_exception", failure_detail="ValueError: " + "x" * 300)
    monkeypatch.setenv("COLUMNS", "80")
    out = bench("status").output
    assert max(len(line) for line in out.splitlines()) <= 80, out
    assert "left out for the width" not in out and "python_exception" in out, out
    flat = " ".join(out.split())
    assert "same on every row: job=1, iteration=60/1000" in flat and out.count("60/1000") == 1, out
