"""Reading a log in-process costs memory in proportion to its records, whatever its lines hold; a line too long
to be a log line is skipped and counted wherever the text is cut; streaming a file gives what the whole text
gives; summaries of any finite records are JSON (no NaN, no Infinity)."""

import json
import math
import os
import re
import tempfile
import tracemalloc

import pytest
from conftest import DATA
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jupiter_log import GOOD, JUPITER
from log_mutations import mutated_logs

from nlp_bench.analysis import metrics, parsers
from nlp_bench.analysis.formats import FORMATS, megatron

LOGS = DATA / "logs"

def _iteration(n: int) -> str:
    return GOOD.replace("iteration       10/", f"iteration {n:8d}/")

def test_a_long_line_among_good_lines_is_skipped_and_counted(tmp_path):
    long_record = _iteration(25) + " " * (parsers.MAX_LINE + 10) + "|"  # a record, but no log prints such a line
    text = "\n".join([_iteration(10), "x" * 200_000, _iteration(20), long_record, _iteration(30)]) + "\n"
    log = tmp_path / "job.out"
    log.write_text(text)
    for parsed in (parsers.parse(text), parsers.parse_log(log), parsers.parse_log(log, chunk_bytes=4096)):
        assert [r.iteration for r in parsed.records] == [10, 20, 30]
        assert parsed.skipped_long_lines == 2 and parsed.format == "megatron-jupiter"
    exact = "iteration 40/ 100 | elapsed time per iteration (s): 1.0 |"
    at_limit = exact + " " * (parsers.MAX_LINE - len(exact))
    assert parsers.parse(at_limit + "\n").records[0].iteration == 40, "a line of exactly MAX_LINE is read"
    with pytest.raises(parsers.NoRecords, match="skipped 1 line"):
        parsers.parse(at_limit + " \n")
    assert parsers.parse_line(at_limit) is not None and parsers.parse_line(at_limit + " ") is None

def test_a_long_torn_last_line_is_counted_too(tmp_path):
    log = tmp_path / "job.out"
    log.write_text(_iteration(10) + "\n" + "y" * (3 * parsers.MAX_LINE))
    for chunk in (1000, parsers.CHUNK_BYTES):
        parsed = parsers.parse_log(log, chunk_bytes=chunk)
        assert [r.iteration for r in parsed.records] == [10] and parsed.skipped_long_lines == 1

def test_a_progress_bar_log_is_one_long_line_of_short_redraws(tmp_path):
    """NxD Training redraws its bar with carriage returns: one `\\n` line of hundreds of KB is normal there,
    and each redraw is read."""
    bars = (LOGS / "nxdt.log").read_bytes().decode().split("\n")[1]
    redraws = bars.split("\r")
    line = "\r".join(redraws[:1] * 2000 + redraws)  # the first step drawn 2000 times, then the rest
    assert len(line) > 4 * parsers.MAX_LINE
    log = tmp_path / "nxdt.log"
    log.write_bytes((line + "\n").encode())
    expected = parsers.parse(bars + "\n").records
    assert len(expected) == 4
    for parsed in (parsers.parse_log(log), parsers.parse_log(log, chunk_bytes=777), parsers.parse(line + "\n")):
        assert parsed.format == "progress-bar" and parsed.skipped_long_lines == 0
        assert [(r.iteration, r.loss) for r in parsed.records] == [(r.iteration, r.loss) for r in expected]

def test_an_iteration_number_too_long_for_int_is_no_record():
    """Python refuses int() of more than 4300 digits (ValueError): such a line is no record, not a crash."""
    line = "iteration " + "7" * 5000 + "/ 10 | elapsed time per iteration (s): 1.0 |"
    assert parsers.parse_line(line, terminated=True) is None
    assert parsers.parse_text(line + "\n" + GOOD + "\n")[0].iteration == 10
    assert parsers.parse_text("Epoch 0: 1%|| " + "9" * 5000 + "/2 [x, 1s/it, loss=1.0]\n") == []
    bert = "LOG x - (0, " + "9" * 5000 + ") step_loss : 1.0  learning_rate : 1  throughput : 2\n"
    assert parsers.parse_text(bert) == []

FINITE = st.floats(allow_nan=False, allow_infinity=False)

POSITIVE = st.floats(min_value=5e-324, allow_nan=False, allow_infinity=False)

@st.composite
def extreme_records(draw):
    records = []
    for iteration in range(1, draw(st.integers(1, 8)) + 1):
        records.append(parsers.Record(
            iteration, None, draw(st.none() | POSITIVE), global_batch_size=draw(st.none() | st.integers(1, 2**62)),
            samples_per_s=draw(st.none() | POSITIVE), tokens_per_s=draw(st.none() | POSITIVE),
            tflops_per_gpu=draw(st.none() | POSITIVE), loss=draw(st.none() | FINITE)))
    return records

@settings(max_examples=300, deadline=None)
@given(extreme_records(), st.none() | st.integers(1, 2**40) | st.just(10**400), st.integers(1, 10**30))
def test_summaries_of_any_finite_records_are_json(records, seq_length, tokens):
    """Whatever finite numbers a log gives (a time of 5e-324 s, a rate of 1e308), the figures computed from
    them are finite or null: never inf or nan, never an OverflowError."""
    views, summary = metrics.steady_summary(records, seq_length, tokens)
    json.dumps({"records": views, "summary": summary}, allow_nan=False)
    for view in views:
        assert all(v is None or math.isfinite(v) for v in view.values() if isinstance(v, float))

@st.composite
def logs_as_bytes(draw):
    """A real-shaped log, perhaps with bytes that are not UTF-8 and CRLF line breaks, as bytes."""
    text = draw(mutated_logs())
    if draw(st.booleans()):
        text = text.replace("\n", "\r\n")
    data = bytearray(text.encode("utf-8"))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(data)))
        data[at:at] = draw(st.binary(min_size=1, max_size=3))
    return bytes(data)

@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs_as_bytes(), st.integers(1, 97), st.sampled_from([None, "megatron", "nxdt", "hf-bert"]))
def test_streaming_a_file_gives_what_the_whole_text_gives(data, chunk_bytes, fmt):
    """Chunk boundaries fall anywhere: inside a line, between \\r and \\n, inside a multi-byte character."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "job.out")
        with open(path, "wb") as fh:
            fh.write(data)
        try:
            whole = parsers.parse(data.decode("utf-8", errors="replace"), fmt)
        except parsers.NoRecords:
            whole = None
        try:
            streamed = parsers.parse_log(path, fmt, chunk_bytes=chunk_bytes)
        except parsers.NoRecords:
            streamed = None
    assert streamed == whole

def _line_breaks(text: str) -> str:
    """The text with every line end a parse knows made `\n`: `\r`, and a run of NULs (a hole in the file)."""
    return re.sub("\x00+", "\n", text).replace("\r", "\n")

def _without_long_lines(text: str, limit: int) -> tuple[str, int]:
    """The text with its lines longer than `limit` left out, and how many there were (the plain way)."""
    lines = _line_breaks(text).split("\n")
    torn = lines.pop()
    kept = [line for line in lines if len(line) <= limit]
    skipped = len(lines) - len(kept) + (len(torn) > limit)
    return "".join(line + "\n" for line in kept) + (torn if len(torn) <= limit else ""), skipped

@st.composite
def logs_with_long_lines(draw):
    text = draw(mutated_logs())
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from(["\n", "\r", ""])) + "q" * draw(st.integers(1, 900)) + text[at:]
    return text

@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs_with_long_lines(), st.integers(30, 600), st.lists(st.integers(0, 5000), max_size=12))
def test_long_lines_are_left_out_wherever_the_pieces_are_cut(text, limit, cuts):
    """Reading in pieces with a line-length limit gives what reading the text without its long lines gives,
    and counts them, wherever the pieces are cut."""
    bounds = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    short, expected_skipped = _without_long_lines(text, limit)
    names = FORMATS.names()
    scans, skipped, _ = parsers._read(pieces, names, limit)
    want, _, _ = parsers._read([short], names, limit=len(short) + 1)
    assert skipped == expected_skipped
    assert [scan.result() for scan in scans] == [scan.result() for scan in want]

def _one_line_at_a_time(text: str) -> list:
    """Megatron records by their definition: each line read alone from its first "iteration" (the last one,
    without its line break, as possibly cut), the first line giving an iteration's record counting."""
    lines = _line_breaks(text).split("\n")
    torn = lines.pop()
    seen = {}
    for line, terminated in [*((line, True) for line in lines), (torn, False)]:
        at = line.find("iteration")
        record = parsers.parse_line(line[at:], terminated) if at >= 0 else None
        if record is not None:
            seen.setdefault(record.iteration, record)
    return [seen[i] for i in sorted(seen)]

@st.composite
def megatron_logs(draw):
    """Real-shaped Megatron logs long enough, and repetitive enough, for the compiled layouts to be used."""
    text = draw(mutated_logs())
    return "".join(draw(st.permutations([text] * 3 + [JUPITER, (LOGS / "megatron_ms.log").read_text()])))

@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(megatron_logs())
def test_compiled_layouts_give_each_line_its_own_record(text):
    """The fast path (one regex per layout over many lines, numbers converted a column at a time) gives
    exactly the records that reading every line on its own gives."""
    original = megatron._NEW_LAYOUT_LINES
    megatron._NEW_LAYOUT_LINES = 0  # compile a layout at the first whole line, however short the log
    try:
        scans, _, _ = parsers._read([text], ["megatron"])
    finally:
        megatron._NEW_LAYOUT_LINES = original
    assert scans[0].layouts, "the layout path must be the one tested"
    assert scans[0].result()[0] == _one_line_at_a_time(text)

def test_a_key_run_into_its_value_is_no_field_in_the_compiled_layout_either():
    """`grad norm1.234` (no colon, no space) is no field read alone; the compiled layout, which lets a known key
    go without its colon as Megatron 2019 wrote it, had read it as grad norm 1.234 (found by the test above)."""
    good = _iteration(100) + "\n"
    bad = _iteration(300).replace("grad norm: ", "grad norm") + "\n"
    assert "grad norm1.234" in bad
    text = good * 20 + bad + good.replace(" 100/", " 400/") * 20
    original = megatron._NEW_LAYOUT_LINES
    megatron._NEW_LAYOUT_LINES = 0
    try:
        scans, _, _ = parsers._read([text], ["megatron"])
    finally:
        megatron._NEW_LAYOUT_LINES = original
    assert scans[0].layouts
    assert scans[0].result()[0] == _one_line_at_a_time(text)
    assert [r.grad_norm is None for r in scans[0].result()[0]] == [False, True, False]

def test_memory_does_not_grow_with_the_text(tmp_path):
    """A file of noise, a few records and a 2 MB line, read 64 KiB at a time: what is allocated at the peak
    is a small part of the file (reading it whole allocated it twice over, bytes and text)."""
    log = tmp_path / "job.out"
    noise = "[default0]:jwb0001:12345:12399 [0] NCCL INFO Channel 03/24 : 0[0] -> 1[1] via P2P/IPC/read\n" * 1000
    with log.open("w") as fh:
        for k in range(1, 81):
            fh.write(noise + _iteration(10 * k) + "\n")
            if k == 40:
                fh.write("w" * 2_000_000 + "\n")
    size = log.stat().st_size
    assert 8_000_000 < size < parsers.PARALLEL_BYTES
    tracemalloc.start()
    try:
        parsed = parsers.parse_log(log, chunk_bytes=1 << 16)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [r.iteration for r in parsed.records] == list(range(10, 810, 10)) and parsed.skipped_long_lines == 1
    assert peak < size / 8, f"peak {peak:,} bytes while reading a {size:,}-byte file"

def test_an_unreadable_field_warns_in_a_compiled_layout_as_line_by_line(tmp_path):
    """Found by the test above: among 20 lines of one layout (read a column at a time), a value like
    `1e.13E+00` left the field empty without the warning that reading the line alone gives."""
    line = (" iteration {i:8d}/     100 | elapsed time per iteration (ms): 2400.0 | global batch size:   512 | "
            "lm loss: 1.1E+01 | seq_load_balancing_loss: {v} | loss scale: 1.0 |\n")
    text = "".join(line.format(i=i, v="1e.13E+00" if i == 8 else "1.2E+00") for i in range(1, 21))
    (tmp_path / "job.out").write_text(text)
    whole = parsers.parse(text)
    assert whole.warnings == {"unreadable 'seq_load_balancing_loss' field (left empty)": 1}
    assert [r.iteration for r in whole.records] == list(range(1, 21))
    assert parsers.parse_log(tmp_path / "job.out", chunk_bytes=1) == whole
