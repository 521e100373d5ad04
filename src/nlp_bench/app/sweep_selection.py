"""What a sweep keeps of a grid's stream of points: a bounded number, or the fastest the planner predicts,
every other one counted and logged with its reason."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from nlp_bench.errors import PlanError
from nlp_bench.spec.benchmark import Point
from nlp_bench.store.dropped import DroppedLog

#: points a sweep writes without being told it may write more (--max-points)
DEFAULT_MAX_POINTS = 1000
#: the layout fields a dropped point is logged and shown by
SHOWN_LAYOUT = ("nodes", "tp", "pp", "mbs", "gas")


@dataclass
class Selection:
    """What a sweep keeps of a grid's stream of outcomes: at most `limit` points (or the `top` fastest by
    the planner's prediction) in memory, every other outcome counted and logged to the DroppedLog."""

    log: DroppedLog
    limit: int
    top: int | None
    keep_unfit: bool
    predict: Callable
    points: list[Point] = field(default_factory=list)
    predicted: dict[str, dict] = field(default_factory=dict)
    runnable: int = 0  # points that passed every check: more than `points` holds when over the limit
    _heap: list = field(default_factory=list)

    def offer(self, point: Point) -> None:
        found = self.predict(point)
        if found is not None and not found["fits"] and not self.keep_unfit:
            self.log.add(_layout(point), f"planner: {found['reason']}", "planner: does not fit in device memory")
            return
        self.runnable += 1
        if self.top is None:
            if len(self.points) < self.limit:
                self.points.append(point)
                self._remember(point, found)
            return
        if found is None:
            raise PlanError(f"--top needs predictions, and system {point.system.name!r} lacks the figures the "
                            "planner times with")
        entry = (found["tokens_per_s"], -self.runnable, point, found)
        out = heapq.heappushpop(self._heap, entry) if len(self._heap) >= self.top else heapq.heappush(self._heap, entry)
        if out is not None:
            tps, _, slower, found = out
            self.log.add(_layout(slower), f"planner: not among the {self.top} fastest (predicted {tps:,.0f} tokens/s, "
                         f"{found['tokens_per_s_low']:,.0f}-{found['tokens_per_s_high']:,.0f} if the planner errs as "
                         f"on its corpus{'; an extrapolation' if found['extrapolated'] else ''})",
                         f"planner: not among the {self.top} fastest")

    def _remember(self, point: Point, found: dict | None) -> None:
        if found is not None:
            self.predicted[point.id] = found

    def finish(self) -> list[Point]:
        """The points to write: in grid order, or fastest first with --top."""
        if self.top is not None:
            for *_, point, found in sorted(self._heap, key=lambda e: (-e[0], -e[1])):
                self.points.append(point)
                self._remember(point, found)
        return self.points


def _layout(point: Point) -> dict[str, int]:
    return {k: getattr(point.layout, k) for k in SHOWN_LAYOUT}
