"""The planner's prediction for one point in one line, for the commands that write a point without running
it (a dry run): a user deciding whether to submit needs the figure, how far to trust it, the benchmark's
verdict and whether it fits, before the node-hours are spent."""

from __future__ import annotations

from typing import Any

from nlp_bench.analysis.reference import BASELINE_S, verdict
from nlp_bench.flops import time_to_report


def prediction_line(found: dict[str, Any], model: str, device_memory_gib: float | None) -> str:
    """tokens/s and its interval, time_to_report against the model's baseline where it has one, the memory of
    one device, and whether the prediction lies inside the planner's corpus (`found`: prediction.json)."""
    tokens = found.get("tokens_per_s")
    if not tokens:
        return f"predicted: nothing ({found.get('reason') or 'the planner cannot time this layout'})"
    parts = [f"{tokens:,.0f} tokens/s"]
    if found.get("tokens_per_s_low") is not None and found.get("tokens_per_s_high") is not None:
        parts[0] += f" ({found['tokens_per_s_low']:,.0f}-{found['tokens_per_s_high']:,.0f})"
    seconds = time_to_report(tokens)
    passed = verdict(model, seconds)
    if passed is None:
        parts.append(f"time_to_report {seconds:,.1f} s")
    else:
        sign = "<=" if passed == "pass" else ">"
        parts.append(f"time_to_report {seconds:,.1f} s {sign} {BASELINE_S[model]:g} s ({passed})")
    memory = found.get("memory_gib")
    if memory is not None:
        room = f" of {device_memory_gib:g}" if device_memory_gib is not None else ""
        parts.append(f"{memory:.1f}{room} GiB per device" + ("" if found.get("fits", True) else " (does not fit)"))
    if found.get("extrapolated"):
        parts.append(f"extrapolated{_outside(found.get('outside_corpus') or [])}: trust the interval less")
    else:
        parts.append("inside the planner's corpus")
    return "predicted: " + ", ".join(parts)


#: how long the list of what lies outside the corpus may run before the line names only the first of it
_OUTSIDE_SHOWN = 60


def _outside(outside: list[str]) -> str:
    """What lies outside the planner's corpus, shortened to its first item where the whole would crowd the line
    (prediction.json keeps it all)."""
    whole = "; ".join(outside)
    if not outside or len(whole) <= _OUTSIDE_SHOWN:
        return f" ({whole})" if whole else ""
    return f" ({outside[0]}; and {len(outside) - 1} more, in prediction.json)"
