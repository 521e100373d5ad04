"""Logs of every shape the parsers may meet: the real-shaped logs of tests/data, cut, spliced, repeated and
salted with noise (a hypothesis strategy shared by the fuzz tests of the parsers and of their limits)."""

from conftest import DATA
from hypothesis import strategies as st

CORPUS = sorted((DATA / "logs").glob("*.log")) + [DATA / "seed003_verification.log"]
TEXTS = [p.read_text() for p in CORPUS]
NOISE = st.text(st.sampled_from(list("0123456789.-+eE|:/[]()%=, \n\r\tabcinfnaN") + ["\x00", "é", "▎", "\ufffd"]),
                max_size=40)


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
