"""Time per iteration of a layout on a system, from FLOPs, link bandwidths and two free efficiencies.

    t_iter = (gas + (pp - 1) / vp) · (t_compute + t_tp)        1F1B: the bubble is (pp - 1)/vp micro-batch slots
           + (vp · gas + pp - 1) · t_p2p                         activations between stages, forward and backward
           + (1 - DP_OVERLAP) · t_dp + t_optimizer

t_compute: the micro-batch's hardware FLOPs on one device (Megatron model FLOPs plus what recompute
repeats) at peak × compute × d / (d + HALF_SIZE), d the smaller GEMM side (h/tp or mbs·s): small matrix
products reach less of the peak. t_tp: per layer four all-reduces of the mbs·s·h activations (forward
and backward; all-gather + reduce-scatter under sequence parallelism move the same bytes; six with full
recompute), ring-costed over NVLink, or over the nodes' network when tp spans nodes. t_dp: the gradient
all-reduce (fp32), or reduce-scatter (fp32) + all-gather (16-bit) with the distributed optimizer, over
the network shared by a node's devices. t_optimizer: the Adam update streams its state through device
memory. `compute` and `network` (the fraction of nominal link bandwidth collectives reach) are what
calibration fits; the other constants are stated here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from nlp_bench import flops
from nlp_bench.plan.candidate import Candidate
from nlp_bench.plan.memory import parameters_on_most_loaded_shard
from nlp_bench.spec.models import ModelSpec
from nlp_bench.spec.systems import System

HALF_SIZE = 128  # GEMM side at which the achieved fraction of peak is half its asymptote (stated)
DP_OVERLAP = 0.0  # Megatron overlaps the gradient reduction only with --overlap-grad-reduce
MEMORY_EFFICIENCY = 0.8  # fraction of device-memory bandwidth the optimizer step streams at


@dataclass(frozen=True)
class Efficiency:
    """The planner's free parameters."""

    compute: float = 0.6
    network: float = 0.7

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TimeEstimate:
    iteration_s: float
    compute_s: float  # per micro-batch per stage
    tp_s: float
    p2p_s: float
    dp_s: float
    optimizer_s: float
    bubble_fraction: float


class NotPlannable(ValueError):
    """The system profile lacks a figure the time model needs."""


def _ring(bytes_: float, ranks: int, bandwidth: float, latency: float, all_reduce: bool) -> float:
    """Ring collective: an all-reduce moves 2(n-1)/n of the data, a gather or scatter (n-1)/n."""
    if ranks <= 1:
        return 0.0
    steps = (2 if all_reduce else 1) * (ranks - 1)
    return steps / ranks * bytes_ / bandwidth + steps * latency


def hardware_flops(model: ModelSpec, vocab_padded: int, c: Candidate, swiglu: bool = False) -> float:
    shape = model.flops_shape(c.global_batch_size, vocab_padded, swiglu=swiglu)
    model_flops = flops.megatron_model_flops(shape)
    b, s, h, n = c.global_batch_size, model.seq_length, model.hidden_size, model.num_layers
    if c.recompute == "full":
        return model_flops * 4 / 3  # one more forward
    if c.recompute == "selective":
        return model_flops + 2.0 * b * s * s * h * n  # the attention core's forward again
    return model_flops


def estimate(model: ModelSpec, vocab_padded: int, c: Candidate, system: System, eff: Efficiency,
             swiglu: bool = False) -> TimeEstimate:
    missing = [k for k in ("peak_tflops", "intra_node_gbps", "inter_node_gbps", "memory_bandwidth_gbps")
               if getattr(system, k) is None]
    if missing:
        raise NotPlannable(f"system {system.name!r} has no {', '.join(missing)}: the planner cannot time it")
    latency = (system.link_latency_us or 0.0) * 1e-6
    intra = system.intra_node_gbps * 1e9 * eff.network
    inter = system.inter_node_gbps * 1e9 * eff.network
    act = 4 if c.precision == "fp32" else 2
    s, h = model.seq_length, model.hidden_size

    per_device = hardware_flops(model, vocab_padded, c, swiglu) / c.world
    side = min(h / c.tp, c.mbs * s)
    rate = system.peak_tflops * 1e12 * eff.compute * side / (side + HALF_SIZE)
    t_compute = per_device / c.gas / rate

    layers = model.num_layers / c.pp
    collectives = 6 if c.recompute == "full" else 4
    tp_bw = intra if c.tp <= c.devices_per_node else inter
    t_tp = layers * collectives * _ring(c.mbs * s * h * act, c.tp, tp_bw, latency, True)

    p2p_bytes = c.mbs * s * h * act / (c.tp if c.sequence_parallel else 1)
    p2p_bw = intra if c.tp * c.pp <= c.devices_per_node else inter / min(c.devices_per_node, c.tp)
    t_p2p = 2 * (p2p_bytes / p2p_bw + latency) if c.pp > 1 else 0.0

    params = parameters_on_most_loaded_shard(model, vocab_padded, c, swiglu)
    dp_bw = intra if c.world <= c.devices_per_node else inter / c.devices_per_node
    if c.distributed_optimizer:
        t_dp = (_ring(params * 4, c.dp, dp_bw, latency, False) + _ring(params * act, c.dp, dp_bw, latency, False))
    else:
        t_dp = _ring(params * 4, c.dp, dp_bw, latency, True)
    shard = params / (c.dp if c.distributed_optimizer else 1)
    state_bytes = shard * (4 + 4 * 2 + 4 * 2 + 4 * 2) + params * act  # grad read; master, moments r/w; weights
    t_opt = state_bytes / (system.memory_bandwidth_gbps * 1e9 * MEMORY_EFFICIENCY)

    slots = c.gas + (c.pp - 1) / c.vp
    iteration = slots * (t_compute + t_tp) + (c.vp * c.gas + c.pp - 1) * t_p2p + (1 - DP_OVERLAP) * t_dp + t_opt
    return TimeEstimate(iteration, t_compute, t_tp, t_p2p, t_dp, t_opt, (c.pp - 1) / c.vp / slots)
