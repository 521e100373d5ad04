"""The sentence a report opens with: the figure a reader should quote, and which of the two measurements it is.

Every point has two throughputs. JUBE's (the Tokens/sec column) averages every logged interval, warm-up
included; it is what the benchmark's rules define, what the reference's 554.70 s was computed from, and so the
only one comparable with the 560 s baseline and with other sites' submissions. The steady state leaves out the
warm-up intervals; it says what the layout sustains, which is what comparing layouts or trainers needs. A
short run differs between the two by tens of percent, so the headline names the one it quotes and gives the
other beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nlp_bench.analysis.metrics import warmup_decided
from nlp_bench.analysis.reference import BASELINE_S, verdict
from nlp_bench.report.figures import figure_text
from nlp_bench.store import states
from nlp_bench.words import counted

JUBE_FIGURE = "JUBE's figure: the mean over every logged interval, warm-up included"
WHY_JUBE = ("the benchmark's rules define the result this way, so it is the figure to compare with the "
            "{baseline:.0f} s baseline and with other submissions")
WHY_JUBE_NO_BASELINE = "the benchmark's rules define the result this way, so it is the figure other sites report"


@dataclass(frozen=True)
class Headline:
    """What the report leads with; `point` is None when no point has completed."""

    title: str
    point: str | None = None
    verdict: str | None = None
    figure: str = JUBE_FIGURE
    why: str = ""
    steady_note: str = ""


def _layout(row: dict[str, Any]) -> str:
    return (f"{counted(row['Nodes'], 'node')}, tp {row['Tensor_Parallel']}, pp {row['Pipeline_Parallel']}, "
            f"mbs {row['MBS']}, gas {row['GAS']}")


def headline(rows: list[dict[str, Any]], results: dict[tuple[str, str], dict]) -> Headline:
    """The 175B point with the shortest time to report where one completed (the benchmark's reported figure),
    else the fastest completed point of the largest model measured."""
    done = [r for r in rows if r.get("state") == states.COMPLETED and r.get("time_to_report_in_seconds")]
    if not done:
        return Headline(title="No point has completed yet: nothing to quote.")
    with_baseline = [r for r in done if r.get("model") in BASELINE_S]
    if with_baseline:
        pool = with_baseline
    else:
        largest = max(r.get("Model_Size") or 0 for r in done)
        pool = [r for r in done if (r.get("Model_Size") or 0) == largest]
    best = min(pool, key=lambda r: r["time_to_report_in_seconds"])
    model, seconds = best.get("model"), best["time_to_report_in_seconds"]
    baseline = BASELINE_S.get(model)
    passed = verdict(model, seconds)
    name = f"{best.get('Model_Size')}B"
    if baseline is not None:
        title = (f"{name}: {figure_text('time_to_report_s', seconds)} s to report 20M tokens on {_layout(best)}: "
                 f"{'within' if passed == 'pass' else 'over'} the {baseline:.0f} s baseline")
        why = WHY_JUBE.format(baseline=baseline)
    else:
        title = (f"{name}, fastest of {counted(len(pool), 'point')}: {figure_text('time_to_report_s', seconds)} s "
                 f"to report 20M tokens on {_layout(best)}")
        why = WHY_JUBE_NO_BASELINE
    result = results.get((best.get("run"), best.get("point"))) or {}
    return Headline(title=title, point=best.get("point"), verdict=passed, why=why,
                    steady_note=steady_note(result, seconds))


def steady_note(result: dict[str, Any], seconds: float) -> str:
    """The steady state beside the quoted figure, and where the gap between them comes from, as measured:
    the warm-up intervals left out and how much slower they ran (none left out: the two are one number)."""
    steady = result.get("steady") or {}
    steady_s = steady.get("time_to_report_s")
    if not steady_s:
        return ""
    skipped, shown = steady.get("warmup_excluded", 0), figure_text("time_to_report_s", steady_s)
    if not warmup_decided(steady.get("intervals") or 0):
        return (f"Steady state: the job logged one interval, too few to tell warm-up from the steady state, so it "
                f"is the same figure ({shown} s).")
    if not skipped:
        return (f"Steady state: no interval of {steady.get('intervals')} ran slow enough to count as warm-up, so it is "
                f"the same figure ({shown} s).")
    times = [r.get("iteration_time_s") for r in result.get("records") or []]
    why = ""
    if len(times) == steady.get("intervals") and all(times):
        warm, rest = times[:skipped], times[skipped:]
        slower = (sum(warm) / len(warm)) / (sum(rest) / len(rest)) - 1
        why = (f"; the gap is those intervals: they took {100 * slower:,.0f}% longer per iteration than the "
               f"{len(rest)} after them")
    return (f"Steady state ({skipped} warm-up interval(s) of {steady.get('intervals')} left out): {shown} s, "
            f"{100 * (steady_s / seconds - 1):+.1f}% against the quoted figure{why}. It is what this layout "
            "sustains once warm, the figure to compare layouts or trainers with.")
