"""Why `bench run` refuses to submit a point for reasons of the point itself, whatever machine it starts
from: the one decision that both the refusal before submission (app.execute) and the verdict in the header
of a dry run's jobscript (app.stages) read, so that a script never calls itself runnable when its
submission would be refused."""

from __future__ import annotations

from nlp_bench.spec.benchmark import Point


def point_refusals(point: Point, prediction: dict | None, force: bool) -> list[str]:
    """One line per reason, each naming the point: a layout its trainer cannot run on the system
    (spec.benchmark's unrunnable: never submitted, even with `force`), or the planner's `prediction` that it
    does not fit in device memory (unless `force`). The site profile's checks (app.doctor.site_checks) come on
    top: they depend on the machine the run starts from, so a jobscript's header cannot say them."""
    if point.unrunnable:
        return [f"{point.id}: {point.unrunnable}"]
    line = not_fitting(point.id, prediction, force)
    return [line] if line else []


def not_fitting(point_id: str, prediction: dict | None, force: bool) -> str | None:
    """The refusal of a point the planner predicted not to fit in device memory (None where it fits, was
    not predicted, or `force` says submit anyway): read by a new run and by --resume of a dry run's points
    alike, so the tracked way to submit refuses what `bench run` refuses."""
    if force or prediction is None or prediction.get("fits") is not False:
        return None
    return f"{point_id} is predicted not to fit: {prediction['reason']} (bench plan; --force submits it anyway)"
