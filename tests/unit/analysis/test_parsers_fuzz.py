"""Whatever bytes a log holds, the parsers return records or raise the project's ParseError, and the
summary of any records they return can be computed."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from log_mutations import mutated_logs

from nlp_bench.analysis import metrics, parsers
from nlp_bench.analysis.formats import FORMATS


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


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_logs())
def test_mutated_real_shaped_logs(text):
    _check(text)
