"""Whatever bytes a log holds, the parsers return records or raise the project's ParseError, and the
summary of any records they return can be computed."""

from conftest import DATA
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nlp_bench.analysis import metrics, parsers
from nlp_bench.analysis.formats import FORMATS

CORPUS = sorted((DATA / "logs").glob("*.log")) + [DATA / "seed003_verification.log"]
TEXTS = [p.read_text() for p in CORPUS]
NOISE = st.text(st.sampled_from(list("0123456789.-+eE|:/[]()%=, \n\r\tabcinfnaN") + ["\x00", "é", "▎", "\ufffd"]),
                max_size=40)


def _check(text: str) -> None:
    for fmt in (None, *FORMATS.known()):
        try:
            parsed = parsers.parse(text, fmt)
        except parsers.ParseError:
            continue
        assert parsed.records and parsed.format in FORMATS.known()
        for seq in (None, 2048):
            views, summary = metrics.steady_summary(parsed.records, seq)
            assert len(views) == len(parsed.records) and summary["intervals"] == len(parsed.records)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_arbitrary_bytes(data):
    _check(data.decode("utf-8", errors="replace"))


@st.composite
def mutated_logs(draw):
    text = draw(st.sampled_from(TEXTS))
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["cut", "insert", "delete", "duplicate", "replace"]))
        at = draw(st.integers(0, len(text)))
        if kind == "cut":
            text = text[:at]
        elif kind == "insert":
            text = text[:at] + draw(NOISE) + text[at:]
        elif kind == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 30)):]
        elif kind == "duplicate":
            end = min(len(text), at + draw(st.integers(1, 400)))
            text = text[:end] + text[at:end] + text[end:]
        else:
            text = text[:at] + draw(NOISE) + text[at + draw(st.integers(1, 10)):]
    return text


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_logs())
def test_mutated_real_shaped_logs(text):
    _check(text)
