"""Errors a user can cause.

The CLI turns every BenchError into one line on stderr and exit code 2, so the message must say what
was wrong and, where it helps, what would have been right.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class BenchError(Exception):
    """Base class for user-facing errors (bad input, impossible layout, missing tool)."""


class SpecError(BenchError):
    """A benchmark definition, model preset or system profile is missing or malformed."""


class LayoutError(BenchError):
    """A parallel layout does not fit the model or the allocation."""


class LaunchError(BenchError):
    """A job could not be rendered, submitted or watched."""


class ResultError(BenchError):
    """A run, point or log could not be found or read."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """A ' (did you mean X?)' hint, or '' when nothing is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown(kind: str, word: str, choices: Iterable[str]) -> str:
    """One-line message for an unknown name, listing what is known."""
    known = sorted(choices)
    return f"unknown {kind} {word!r}{did_you_mean(word, known)}; known: {', '.join(known)}"


class PlanError(BenchError):
    """The planner cannot answer: a system without the figures it needs, nothing to calibrate on."""
