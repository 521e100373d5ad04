"""Why a job failed, in a few classes a user can act on, from its final state and its output."""

from __future__ import annotations

import re

from nlp_bench.store import states

# (class, pattern) in order of precedence: the first match names the failure.
_PATTERNS = [
    ("hang", re.compile(r"nlp-bench: watchdog: no new iteration line for .*")),
    ("out_of_memory", re.compile(r"CUDA out of memory|OutOfMemoryError|torch\.OutOfMemoryError|oom-kill|Killed process|MemoryError")),
    ("timeout", re.compile(r"DUE TO TIME LIMIT|time limit is near")),
    ("node_failure", re.compile(r"DUE TO NODE FAILURE|NODE_FAIL")),
    ("comm_timeout", re.compile(r"Watchdog caught collective operation timeout|NCCL.*[Tt]imeout|Gloo.*[Tt]imed? ?out")),
    ("rendezvous", re.compile(r"RendezvousConnectionError|RendezvousTimeoutError|The connection to the C10d store has failed")),
    ("usage", re.compile(r"nlp_bench\.train: error: .*|bench: error: .*|nlp-bench: this script is laid out for .*")),
]
_EXCEPTION = re.compile(r"^(?:\[default\d+\]:)?\s*((?:[A-Za-z_][\w.]*)?(?:Error|Exception|Interrupt)\b:?.*)$")


def classify(state: str, exit_code: int | None, output: str) -> tuple[str | None, str | None]:
    """(failure class, one-line detail) or (None, None) for a successful job."""
    if state == states.COMPLETED and not exit_code:
        return None, None
    for name, pattern in _PATTERNS:
        match = pattern.search(output)
        if match:
            return name, _line_around(output, match.start(), match.end())
    if state == states.TIMEOUT:
        return "timeout", "the job reached its time limit"
    if state == states.CANCELLED:
        return "cancelled", "the job was cancelled"
    if state == states.NODE_FAIL:
        return "node_failure", "a node of the job failed"
    if state == states.OUT_OF_MEMORY:
        return "out_of_memory", "the job ran out of host memory"
    if state == states.LOST:
        return "lost", "neither the scheduler nor the job's log says how the job ended"
    last_exception = None
    for line in output.splitlines():
        match = _EXCEPTION.match(line)
        if match:
            last_exception = match.group(1).strip()
    if last_exception:
        return "python_exception", last_exception
    return "nonzero_exit", f"exit code {exit_code}"


def _line_around(output: str, start: int, end: int, limit: int = 300) -> str:
    """The whole log line a match sits in, which says more than the match (job id, node, time)."""
    first = output.rfind("\n", 0, start) + 1
    last = output.find("\n", end)
    line = output[first:last if last >= 0 else len(output)].strip()
    return line if len(line) <= limit else line[: limit - 3] + "..."
