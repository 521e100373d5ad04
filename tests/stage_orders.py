"""An order for the run stages (app.stages): the shipped smoke tag on the local executor, with a fixed
prediction so that what the stages write of it can be compared."""

from nlp_bench.app.stage_records import LaunchOptions, Order
from nlp_bench.launch.executor import get_executor
from nlp_bench.spec.benchmark import load_benchmark

PREDICTED = {"tokens_per_s": 500.0, "tokens_per_s_low": 400.0, "tokens_per_s_high": 600.0, "memory_gib": 0.1,
             "fits": True, "reason": "fits", "extrapolated": True, "calibrated": False}


def smoke_order(root, dry_run: bool = True, **options) -> Order:
    """The smoke tag's one point on the local executor, its results under `root`, launched with `options`."""
    point = load_benchmark("nlp").point("smoke", "local")
    return Order(root, point.benchmark, point.tag, (point,), get_executor("local"), LaunchOptions(**options), dry_run,
                 {point.id: PREDICTED})
