"""The time terms of a mixture-of-experts layer: the expert GEMMs at their own (narrower) side, the
all-to-all that dispatches routed token copies to the ranks holding their experts and combines them back,
expert tp's collectives on those copies, and the routed experts' gradient reduction over expert dp.

The model is specified in docs/planner.md ("Mixture of experts"). `expert_work` counts the work (FLOPs,
bytes, bandwidths) once per layout; `expert_times` divides it by the fitted efficiencies, as plan/timing.py
does for the dense terms it joins.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nlp_bench.plan.candidate import Candidate
from nlp_bench.plan.memory import routed_load, stage_moe_layers, stage_split
from nlp_bench.spec.models import ModelSpec
from nlp_bench.spec.systems import System

#: the all-to-alls a layer waits for per micro-batch: dispatch and combine in the forward, their transposes
#: in the backward (Megatron-core's alltoall token dispatcher, without --overlap-moe-expert-parallel-comm)
A2A_PER_LAYER = 4


@dataclass(frozen=True)
class ExpertWork:
    """One layout's MoE work on the stage the pipeline waits for, per micro-batch unless said."""

    flops: float  # the routed experts' GEMM FLOPs (already part of the dense Work.flops)
    side: float  # the smallest side of an expert GEMM on one device
    inside_bytes: float  # all-to-all bytes each device sends to ep peers in its node
    inside_bandwidth: float
    across_bytes: float  # ... and to ep peers in other nodes
    across_bandwidth: float
    a2a_count: int  # all-to-alls waited for (a latency each)
    etp_bytes: float  # expert tp's all-gather and reduce-scatter of the routed copies
    etp_bandwidth: float
    etp_steps: int
    # per iteration: the data-parallel reduction and gather of dense and expert parameters together, and the
    # optimizer's shard, which replace the dense-only figures of plan/timing.py's Work
    reduce_bytes: float
    reduce_steps: int
    gather_bytes: float
    gather_steps: int
    params: float  # on one device of the stage that holds most
    shard: float  # of them, what its optimizer steps
    overlap: bool = False  # the all-to-alls behind another micro-batch's computation (--overlap-moe-expert-parallel-comm)


def _ring(ranks: int, all_reduce: bool) -> tuple[float, int]:
    """(fraction of the data each device sends, steps) of a ring collective over `ranks`."""
    if ranks <= 1:
        return 0.0, 0
    steps = (2 if all_reduce else 1) * (ranks - 1)
    return steps / ranks, steps


def expert_work(model: ModelSpec, vocab_padded: int, c: Candidate, system: System, layers: float,
                within_node: Callable[[System, int], float], grad: int, act: int) -> ExpertWork | None:
    """The MoE terms of a layout on the stage of `layers` layers the pipeline waits for; None for a dense model.

    Each rank holds mbs x s / (tp x cp) tokens of a micro-batch (sequence parallelism splits them over tp;
    Megatron-core needs it for MoE with tp > 1) and sends each token's top-k copies to the ranks holding
    their experts: with balanced routing (ep - 1)/ep of them leave the rank, in the node to the ep group's
    ranks there (expert tp innermost, so devices_per_node / expert tp of them) and across nodes to the rest,
    each device through its share of the node's network cards."""
    e = model.moe
    if e is None:
        return None
    lay, on = c.layout, c.switches
    moe = max(stage_moe_layers(model, c))  # the MoE layers of the stage that has most
    moe_layers = min(moe, layers) if layers else moe
    # full recompute, or selective recompute of the whole MoE layer, runs the experts' forward again
    again = on.recompute == "full" or on.recomputed("moe")
    full = 4 / 3 if again else 1.0
    tokens = lay.mbs * model.seq_length
    load = min(1.0, routed_load(model))  # a capacity factor below 1 drops copies; above, the balanced share runs
    copies = e.router_topk * load * tokens * lay.routed_share  # the copies this rank's experts multiply
    mlp = (3 if model.swiglu else 2) * model.hidden_size * e.ffn_hidden_size / lay.expert_tp
    flops = 6.0 * mlp * copies * moe_layers * full
    per_expert = copies * lay.ep / e.num_experts  # tokens each local expert's GEMM takes
    side = max(1.0, min(model.hidden_size, e.ffn_hidden_size / lay.expert_tp, per_expert))

    sent = e.router_topk * load * tokens / lay.tp_cp * model.hidden_size * act  # one all-to-all, one device
    a2a = moe_layers * (A2A_PER_LAYER + (2 if again else 0))
    inside_share, across_share = lay.ep_shares
    # expert tp > 1: the dispatched copies all-gathered over expert tp before the experts, their outputs
    # reduce-scattered after, and the transposes in the backward: four one-way collectives of the copies
    etp_fraction, etp_steps = _ring(lay.expert_tp, False)
    etp_bytes = a2a * etp_fraction * copies * model.hidden_size * act
    etp_bandwidth = within_node(system, lay.expert_tp) if lay.expert_tp <= lay.devices_per_node else \
        system.inter_node_gbps * 1e9 / lay.devices_per_node

    dense, routed = max(stage_split(model, vocab_padded, c), key=sum)
    dense_reduce, dense_steps = _ring(lay.weight_replicas, not on.distributed_optimizer)
    expert_reduce, expert_steps = _ring(lay.edp, not on.distributed_optimizer)
    reduce_bytes = (dense_reduce * dense + expert_reduce * routed) * grad
    gather_bytes, gather_steps = 0.0, 0
    shard = dense + routed
    if on.distributed_optimizer:
        gather_bytes = (dense_reduce * dense + expert_reduce * routed) * act
        gather_steps = max(dense_steps, expert_steps)
        shard = dense / lay.weight_replicas + routed / lay.edp
    return ExpertWork(flops, side, a2a * sent * inside_share, within_node(system, lay.ep_in_node), a2a * sent * across_share,
                      system.inter_node_gbps * 1e9 / lay.devices_per_node, a2a,
                      etp_bytes, etp_bandwidth, int(a2a * etp_steps), reduce_bytes, max(dense_steps, expert_steps),
                      gather_bytes, gather_steps, dense + routed, shard, on.overlap_moe_comm and lay.ep > 1)


def expert_times(x: ExpertWork, gemm: float, gemm_half: float, network: float, latency: float,
                 matmul: float, side: float, compute: float = 0.0) -> tuple[float, float]:
    """(what the expert GEMMs add to a micro-batch's GEMM time, the all-to-all and expert-tp time it waits
    for). The expert FLOPs are already timed at the dense side's curve; here they move to their own side's.
    The in-node and cross-node parts of an all-to-all run at once: the slower one counts. With the EP A2A
    overlap (Megatron-core merges adjacent micro-batches' forward and backward) the all-to-alls run behind
    the other micro-batch's `compute` (the dense terms' time of one micro-batch) and only what outlasts it
    is waited for."""
    curve = gemm * side / (side + gemm_half)
    own = gemm * x.side / (x.side + gemm_half)
    t_gemm = x.flops * (1 / own - 1 / curve) / matmul
    t_a2a = max(x.inside_bytes / (x.inside_bandwidth * network), x.across_bytes / (x.across_bandwidth * network))
    t_etp = x.etp_bytes / (x.etp_bandwidth * network) + x.etp_steps * latency
    t_comm = t_a2a + x.a2a_count * latency * (x.inside_bytes + x.across_bytes > 0) + t_etp
    return t_gemm, max(0.0, t_comm - compute - t_gemm) if x.overlap else t_comm
