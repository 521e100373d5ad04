"""`bench cancel`: stop what a run may still start or run, and say what became of each point."""

from __future__ import annotations

from pathlib import Path

from nlp_bench.errors import BenchError, ResultError, unknown
from nlp_bench.launch.refresher import Refresher
from nlp_bench.report.console import say, warn
from nlp_bench.store import states
from nlp_bench.store.point_folder import PointDir
from nlp_bench.store.runs import find_run


def cancel_points(results_dir: Path, run_ref: str, names: tuple[str, ...] = ()) -> int:
    """`bench cancel`: the points not submitted yet are marked cancelled first (a bench still going through
    the run then leaves them instead of starting the next one meanwhile), then every job that may run is
    cancelled. Returns how many cancels were not confirmed (a damaged point counts)."""
    run = find_run(results_dir, run_ref)
    folders = {p.id: p for p in run.points()}
    for name in names:
        if name not in folders:
            raise ResultError(unknown(f"point of run {run.id}:", name, folders))
    chosen = [folders[name] for name in names or folders]
    _refuse_copies(chosen)
    executors = Refresher()
    unconfirmed = 0
    marked = set()
    for point in chosen:
        try:
            if point.exists() and point.state().state == states.NOT_SUBMITTED \
                    and point.cancel_unsubmitted(point.point().executor):
                marked.add(point.id)
                say(f"{point.id}: cancelled before it was submitted")
        except BenchError as exc:
            unconfirmed += 1
            warn(f"{point.id}: cannot cancel: {exc}")
    for point in chosen:
        if point.id in marked:
            continue
        try:
            attempt = point.attempt() if point.exists() else None
            if attempt is None or attempt.state in states.SETTLED:
                shown = attempt.state if attempt else states.NOT_SUBMITTED if point.exists() else states.MISSING
                say(f"{point.id}: {shown}, nothing to cancel")
                continue
            outcome = executors.executor(attempt.executor).cancel(point.path)
        except BenchError as exc:
            unconfirmed += 1
            warn(f"{point.id}: cannot cancel: {exc}")
            continue
        if outcome.confirmed:
            say(f"{point.id}: cancelled ({outcome.detail})")
        else:
            unconfirmed += 1
            warn(f"{point.id}: cancel NOT confirmed: {outcome.detail}")
    return unconfirmed


def _refuse_copies(points: list[PointDir]) -> None:
    """A run folder copied while its jobs ran holds their ids, but the jobs are the original's: cancelled from
    the copy, the original would record a failure it never had. Refused before anything is cancelled."""
    for point in points:
        try:
            original = point.copy_of() if point.exists() else None
        except BenchError:  # a damaged record is said where its point is cancelled
            continue
        if original is not None:
            raise ResultError(f"{point.path} is a copy of {original}, whose job {point.attempt().job_id} it does "
                              f"not own: cancel it in {original.parent} (nothing was cancelled)")
