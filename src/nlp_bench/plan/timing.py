"""Time per iteration of a layout on a system, in physical units, with the overlap Megatron achieves.

The model is specified in docs/planner.md ("Time per iteration"): every term, formula and constant, and
why each is as it is. `work` counts a layout's FLOPs, bytes and messages, which do not depend on the fitted
efficiencies; `timed` divides them by the rates those efficiencies give, so a fit counts the work once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from nlp_bench import flops
from nlp_bench.plan import experts
from nlp_bench.plan.candidate import Candidate
from nlp_bench.plan.memory import layer_activation_bytes, most_loaded_shard
from nlp_bench.spec.layout import virtual_stages
from nlp_bench.spec.models import ModelSpec
from nlp_bench.spec.systems import System

#: How much wider an FP8 GEMM must be than a 16-bit one to reach the same share of its (twice as fast) rate:
#: the GEMM curve's half size in FP8 over BF16's. benchmark/perf/gemm_rates.py on an H100 and an H200
#: (benchmark/perf/measured/, 2026-11-26): a layer's GEMMs at 8192 tokens, each device's rates over its best
#: square GEMM in that precision, fitted as rate · d / (d + half) with one half per precision over both
#: devices: 287 in FP8 (E4M3 through torch._scaled_mm), 118 in BF16 (per device 302 and 274 against 146 and 92).
FP8_HALF_RATIO = 287 / 118

#: Bytes an FP8 run moves per linear weight and iteration to cast its weights: Transformer Engine casts each
#: weight once, at the iteration's first micro-batch (Megatron-LM marks it; later micro-batches reuse the
#: cast), reading it in 16 bits and writing it in FP8 as is and transposed (the amax in the same kernel).
#: With the weights kept in FP8 (--fp8-param-gather; NeMo's fp8_params) only the transpose is made: an FP8
#: read and an FP8 write.
_FP8_WEIGHT_CAST_BYTES = 2 + 1 + 1
_FP8_PARAM_TRANSPOSE_BYTES = 1 + 1


@dataclass(frozen=True)
class Efficiency:
    """The time model's fitted constants: two efficiencies in (0, 1] and the GEMM curve's half size."""

    gemm: float = 0.8  # fraction of peak the largest matrix products reach
    gemm_half: float = 400.0  # smallest GEMM side (columns per device) at which half of `gemm` is reached
    network: float = 0.7  # fraction of nominal link bandwidth the collectives reach
    memory: float = 0.7  # fraction of device-memory bandwidth element-wise ops and the optimizer stream at

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TimeEstimate:
    iteration_s: float
    compute_s: float  # per micro-batch per stage
    tp_s: float
    p2p_s: float  # a 1F1B step's pair of sends, what of it is waited for in the steady state
    dp_s: float  # the data-parallel reduction and gather, whole
    dp_exposed_s: float  # what of it the iteration waits for
    optimizer_s: float
    bubble_fraction: float
    sends_s: float = 0.0  # the iteration's waited sends, the fill's and the drain's included
    weight_casts_s: float = 0.0  # FP8's casts of the weights, once an iteration


class NotPlannable(ValueError):
    """The system profile lacks a figure the time model needs."""


def _logits_flops(model: ModelSpec, vocab_padded: int, sequences: float) -> float:
    """The output layer's FLOPs, forward and backward, for `sequences` sequences."""
    return 6.0 * sequences * model.seq_length * model.hidden_size * vocab_padded


def hardware_flops(model: ModelSpec, vocab_padded: int, c: Candidate) -> float:
    """FLOPs one iteration executes: Megatron's model FLOPs plus what recompute repeats. Full recompute runs
    the transformer layers' forward again, not the output layer's (it lies outside the checkpointed layers;
    Narayanan et al.'s count charges it once too). Megatron's count halves the causal attention core (only half
    of the scores are used; a fused kernel skips the masked blocks); unfused attention (baddbmm, the masked softmax, bmm with the values)
    multiplies the whole score matrix, the masked half too (Narayanan et al.'s count charges it whole)."""
    lay, on = c.layout, c.switches
    shape = model.flops_shape(lay.global_batch_size, vocab_padded)
    b, s, h, n = lay.global_batch_size, model.seq_length, model.hidden_size, model.num_layers
    core = 1.0 if on.flash_attention else 2.0  # halves of the causal score matrix the attention core multiplies
    executed = flops.megatron_model_flops(shape) + (core - 1) * 6.0 * b * s * s * h * n
    if on.recompute == "full":
        return executed + (executed - _logits_flops(model, vocab_padded, b)) / 3  # the layers' forward again
    if on.recompute == "selective":
        return executed + core * 2.0 * b * s * s * h * n * on.recomputed("core_attn") + \
            recomputed_flops(model, c)
    return executed


def recomputed_flops(model: ModelSpec, c: Candidate) -> float:
    """The GEMM FLOPs selective recompute's modules other than the attention core run once more in an
    iteration: their forward (2 FLOPs a multiply-add). `mlp`: the dense layers' MLPs; `shared_experts`: the
    MoE layers' shared experts; `moe`: the whole MoE layer (router, shared and the top-k routed experts of
    each token); `mla_up_proj`: latent attention's query and key/value up-projections. `layernorm` and
    `moe_act` recompute element-wise work only (timed as the bytes they write again, `work`)."""
    on = c.switches
    if on.recompute != "selective":
        return 0.0
    tokens = c.layout.global_batch_size * model.seq_length
    h, gates = model.hidden_size, 3 if model.swiglu else 2
    moe_layers = sum(model.moe.layer_pattern(model.num_layers)) if model.moe else 0
    out = 0.0
    if on.recomputed("mlp"):
        out += 2.0 * tokens * gates * h * model.ffn_hidden_size * (model.num_layers - moe_layers)
    if model.moe is not None and (on.recomputed("shared_experts") or on.recomputed("moe")):
        out += 2.0 * tokens * gates * h * model.moe.shared_expert_intermediate_size * moe_layers
    if model.moe is not None and on.recomputed("moe"):
        e = model.moe
        out += 2.0 * tokens * h * (e.router_topk * gates * e.ffn_hidden_size + e.num_experts) * moe_layers
    if model.mla is not None and on.recomputed("mla_up_proj"):
        m, n = model.mla, model.num_attention_heads
        q_up = (m.q_lora_rank or 0) * n * (m.qk_head_dim + m.qk_pos_emb_head_dim)
        out += 2.0 * tokens * (q_up + m.kv_lora_rank * n * (m.qk_head_dim + m.v_head_dim)) * model.num_layers
    return out


def check_plannable(system: System) -> None:
    missing = [k for k in ("intra_node_gbps", "inter_node_gbps", "memory_bandwidth_gbps") if getattr(system, k) is None]
    if system.matmul_rate()[0] is None:
        missing.insert(0, "peak_tflops or matmul_tflops")
    if missing:
        raise NotPlannable(f"system {system.name!r} has no {', '.join(missing)}: the planner cannot time it")


def _ring_factor(ranks: int, all_reduce: bool) -> tuple[float, int]:
    """(the fraction of the data each device sends, the number of steps) of a ring collective: an
    all-reduce moves 2(n-1)/n of the data in 2(n-1) steps, a gather or scatter (n-1)/n in n-1."""
    if ranks <= 1:
        return 0.0, 0
    steps = (2 if all_reduce else 1) * (ranks - 1)
    return steps / ranks, steps


@dataclass(frozen=True)
class Work:
    """A layout's work in FLOPs, bytes and message counts: what the time model divides by rates. It does
    not depend on the efficiencies, so a fit computes it once per point."""

    flops: float  # per micro-batch on the stage the pipeline waits for
    side: float  # smallest GEMM side on one device
    elementwise_bytes: float  # per micro-batch
    tp_bytes: float  # per micro-batch, sent by each device
    tp_steps: int
    tp_bandwidth: float  # nominal, bytes/s
    p2p_bytes: float  # per send
    p2p_bandwidth: float
    reduce_bytes: float  # per iteration, sent by each device
    reduce_steps: int
    gather_bytes: float
    gather_steps: int
    dp_bandwidth: float
    optimizer_bytes: float
    weight_cast_bytes: float  # per iteration: FP8's casts of the stage's weights (TE's first micro-batch)
    micro_batches: int  # per iteration (gas): the steady state's slots
    bubble: float  # the bubble's slots: (pp - 1) / vp
    bubble_flops: float  # the other stages' mean FLOPs per micro-batch, as a share of the slowest's
    bubble_layers: float  # their mean layers, as a share of the slowest's
    sends: int  # activation sends (pairs) of one iteration
    pp: int
    vp: int
    overlap_p2p: bool  # each send behind the chunk computed meanwhile (interleaving only)
    reduce_behind_backward: bool
    gather_behind_forward: bool
    #: Megatron's --overlap-param-gather-with-optimizer-step: the first chunk's gather behind the others' steps
    first_gather_behind_optimizer: bool
    latency: float
    matmul: float  # FLOP/s a large GEMM reaches (the measured matmul rate, not the datasheet peak)
    memory_bandwidth: float  # bytes/s
    fp8_flops: float = 0.0  # of `flops`, what runs at the FP8 matmul rate
    fp8_matmul: float = 0.0
    cp_bytes: float = 0.0  # context parallelism's ring, per micro-batch, sent by each device
    cp_steps: int = 0
    cp_bandwidth: float = 1.0
    cp_hidden_flops: float = 0.0  # the attention core it overlaps with
    tp_overlap: bool = False
    #: with tensor-parallel overlap, the linear-layer FLOPs run as tp chunks (the forward GEMMs, the
    #: projection's and fc2's input gradients'), and the side of a chunk's GEMM
    chunked_flops: float = 0.0
    chunk_side: float = 1.0
    attention_flops: float = 0.0  # of `flops`, the attention core a fused kernel runs at `attention_rate`
    attention_rate: float = 1.0  # FLOP/s on the planner's count (half the causal score matrix)
    core_flops: float = 0.0  # of `flops`, unfused attention's batched GEMMs, timed at `core_side`
    core_side: float = 1.0
    experts: experts.ExpertWork | None = None  # an MoE model's terms (plan/experts.py)


def _within_node(system: System, devices: int) -> float:
    """Bytes/s each of a group of `devices` devices of one node sends to the others of the group."""
    whole = system.intra_node_gbps * 1e9
    if system.intra_node_pair_gbps is None:
        return whole
    return min(whole, max(1, devices - 1) * system.intra_node_pair_gbps * 1e9)


def work(model: ModelSpec, vocab_padded: int, c: Candidate, system: System) -> Work:
    lay, on = c.layout, c.switches
    check_plannable(system)
    inter = system.inter_node_gbps * 1e9  # a node's cards together
    dpn = lay.devices_per_node
    act = 4 if on.precision == "fp32" else 2
    grad = 2 if on.precision == "fp16" or on.grad_reduce_in_bf16 else 4
    s, h = model.seq_length, model.hidden_size

    full = 4 / 3 if on.recompute == "full" else 1.0
    # one micro-batch on one device: the layers' share of each, and the output layer's (on the last stage)
    logits = _logits_flops(model, vocab_padded, lay.mbs) / lay.tp_cp
    all_layers = hardware_flops(model, vocab_padded, c) / (lay.stage_devices * lay.gas) - logits
    per_layer = all_layers / model.num_layers
    first, middle, last = lay.stage_layers(model.num_layers)
    # the stage the pipeline waits for: the most layers, the last stage counting the output layer
    layers = max(first, middle if lay.pp > 2 else 0.0)
    if last * per_layer + logits >= layers * per_layer:
        layers, per_micro_batch = last, last * per_layer + logits
    else:
        per_micro_batch = layers * per_layer
    bubble_flops, bubble_layers = 1.0, 1.0
    if lay.pp > 1:
        all_layers_of_stages = first + (lay.pp - 2) * middle + last
        bubble_flops = (all_layers_of_stages * per_layer + logits - per_micro_batch) / (lay.pp - 1) / per_micro_batch
        # where the slowest is a last stage holding the output layer alone, its per-layer work is taken as theirs
        bubble_layers = (all_layers_of_stages - layers) / (lay.pp - 1) / layers if layers else 1.0
    linear_share = min(layers * per_layer, layers * _linear_flops(model, c, full))
    passes = 4 if on.recompute == "full" else 3
    every = layer_activation_bytes(model, c, recompute="none", sixteen_bit=True)
    # selective recompute writes what it does not keep (its modules' outputs, e.g. unfused scores) once more
    again = every - layer_activation_bytes(model, c, sixteen_bit=True) if on.recompute == "selective" else 0.0
    elementwise = layers * (passes * every + again)
    params, shard_layers = most_loaded_shard(model, vocab_padded, c)
    weight_casts, fp8_weights = 0.0, 0.0
    if on.fp8:
        elementwise += layers * _fp8_cast_bytes(model, c, on.recompute == "full")
        weight_casts = layers * model.linear_weights() / lay.tp * \
            (_FP8_PARAM_TRANSPOSE_BYTES if on.fp8_param_gather else _FP8_WEIGHT_CAST_BYTES)
        fp8_weights = shard_layers * model.linear_weights() / lay.tp if on.fp8_param_gather else 0.0
    weight_bytes = params * act - fp8_weights * (act - 1)  # one copy of the most loaded stage's weights
    if not on.gradient_accumulation_fusion:
        elementwise += params * (act + 2 * grad)

    # the backward's waited collectives: one all-reduce's worth under sequence parallelism, else none, or two
    # without the asynchronous all-reduce
    backward = 1 if on.sequence_parallel else (0 if on.async_tp_allreduce else 2)
    collectives = (4 if on.recompute == "full" else 2) + backward
    tp_fraction, tp_steps = _ring_factor(lay.tp, True)
    tokens = lay.mbs * s / lay.cp  # one micro-batch's tokens on one rank of the cp group

    replicas = lay.weight_replicas
    if on.distributed_optimizer:
        (reduce_fraction, reduce_steps), (gather_fraction, gather_steps) = (_ring_factor(replicas, False),) * 2
    else:
        (reduce_fraction, reduce_steps), gather_fraction, gather_steps = _ring_factor(replicas, True), 0.0, 0
    shard = params / (replicas if on.distributed_optimizer else 1)
    return _with_experts(model, vocab_padded, c, system, (layers, act, grad), Work(
        flops=per_micro_batch, side=min(h / lay.tp, tokens), elementwise_bytes=elementwise,
        tp_bytes=layers * collectives * tp_fraction * tokens * h * act, tp_steps=int(layers * collectives * tp_steps),
        tp_bandwidth=_within_node(system, lay.tp) if lay.tp <= dpn else inter,
        p2p_bytes=tokens * h * act / lay.tp if lay.pp > 1 else 0.0,
        p2p_bandwidth=_within_node(system, 2) if lay.world <= dpn else inter / dpn,
        reduce_bytes=reduce_fraction * params * grad, reduce_steps=reduce_steps,
        gather_bytes=gather_fraction * weight_bytes, gather_steps=gather_steps,
        dp_bandwidth=_within_node(system, replicas) if lay.stage_devices <= dpn else inter / dpn,
        optimizer_bytes=_optimizer_bytes(params, shard, on.precision, weight_bytes / params, grad),
        weight_cast_bytes=weight_casts,
        micro_batches=lay.gas, bubble=lay.bubble_slots, bubble_flops=bubble_flops,
        bubble_layers=bubble_layers, sends=lay.vp * lay.gas + lay.pp - 1 if lay.pp > 1 else 0, pp=lay.pp, vp=lay.vp,
        overlap_p2p=on.overlap_p2p_comm and lay.vp > 1, reduce_behind_backward=on.overlap_grad_reduce,
        gather_behind_forward=on.overlap_param_gather,
        first_gather_behind_optimizer=on.overlap_param_gather_with_optimizer_step and lay.vp > 1,
        latency=(system.link_latency_us or 0.0) * 1e-6, matmul=system.matmul_rate()[0] * 1e12,
        memory_bandwidth=system.memory_bandwidth_gbps * 1e9,
        fp8_flops=linear_share if on.fp8 else 0.0,
        fp8_matmul=_fp8_matmul(system, on.compute_precision) if on.fp8 else 0.0,
        **_context_exchange(model, c, system, layers, act, per_layer * layers - linear_share),
        **_attention_core(model, c, system, per_layer * layers - linear_share),
        **_overlap_chunks(model, c, linear_share, min(h / lay.tp, tokens / lay.tp))))


def _with_experts(model: ModelSpec, vocab_padded: int, c: Candidate, system: System,
                  stage: tuple[float, int, int], w: Work) -> Work:
    """An MoE model's work: its terms (plan/experts.py), and its dense and expert parameters reduced,
    gathered and stepped over their own replicas (dp x cp, expert dp). `stage`: the layers of the stage the
    pipeline waits for, and the bytes of an activation and of a reduced gradient."""
    layers, act, grad = stage
    moe = experts.expert_work(model, vocab_padded, c, system, layers, _within_node, grad, act)
    if moe is None:
        return w
    return replace(w, experts=moe, reduce_bytes=moe.reduce_bytes, reduce_steps=moe.reduce_steps,
                   gather_bytes=moe.gather_bytes, gather_steps=moe.gather_steps,
                   optimizer_bytes=_optimizer_bytes(moe.params, moe.shard, c.switches.precision, act, grad))


def _overlap_chunks(model: ModelSpec, c: Candidate, linear_flops: float, side: float) -> dict:
    """Tensor-parallel overlap as Transformer Engine's userbuffers run it (its default configuration, as
    Megatron-LM and NeMo pass it): the all-gather before each forward GEMM and the reduce-scatter after it
    are split into tp chunks pipelined with the GEMM (ring exchange, or a chunked pipeline), so each forward
    GEMM runs as tp GEMMs of 1/tp of the tokens; so do the projection's and fc2's input-gradient GEMMs
    (ring exchange of the output gradient). qkv's and fc1's input gradients and every weight gradient run
    whole beside a bulk collective. Of the linear FLOPs (forward, again with full recompute, input and
    weight gradients alike), the forwards' and the projection's and fc2's input gradients' share."""
    lay, on = c.layout, c.switches
    if not (on.tp_comm_overlap and on.sequence_parallel and lay.tp > 1):
        return {}
    h, g = model.hidden_size, model.query_groups * model.head_dim
    qkv, proj = h * (h + 2 * g), h * h
    fc1, fc2 = h * model.ffn_hidden_size * (2 if model.swiglu else 1), h * model.ffn_hidden_size
    forwards = 2 if on.recompute == "full" else 1
    share = (forwards + (proj + fc2) / (qkv + proj + fc1 + fc2)) / (forwards + 2)
    return {"tp_overlap": True, "chunked_flops": linear_flops * share, "chunk_side": side}


def _optimizer_bytes(params: float, shard: float, precision: str, weight: float, grad: int) -> float:
    """Bytes Megatron's optimizer step moves through one device's memory (its mixed-precision optimizer,
    each pass a kernel of its own): on the device's shard, with fp16 the 16-bit gradients copied to fp32 and
    unscaled (2 + 4, then 4 + 4), the gradient norm read (4), Adam reading the fp32 weight, gradient and two
    moments and writing weight and moments (28), and the fp32 weights copied to the model's (4 + `weight`,
    the bytes a model weight is kept in: 2, less where FP8 keeps the linear layers' in one);
    then every weight's main gradient zeroed for the next iteration."""
    step = 4 + 28 + (4 + weight if precision != "fp32" else 0) + (14 if precision == "fp16" else 0)
    return shard * step + params * grad


def _linear_flops(model: ModelSpec, c: Candidate, full: float) -> float:
    """One layer's linear-layer FLOPs for one micro-batch on one device (what FP8 recipes run in FP8; the
    attention core stays in 16 bits): 6 per weight per token, forward and backward, again for a full
    recompute's forward."""
    lay = c.layout
    return 6.0 * model.linear_weights() * lay.mbs * model.seq_length * full / lay.tp_cp


def _fp8_cast_bytes(model: ModelSpec, c: Candidate, full: bool) -> float:
    """One layer's FP8 casts for one micro-batch on one device, as Transformer Engine runs them: each linear
    layer's input is written in FP8 twice (as is and transposed, for the weight-gradient GEMM), 2 bytes a
    value where the cast is fused into the op that makes the input (LayerNorm before qkv and fc1, the
    activation before fc2), 4 (a 16-bit read besides) for the projection's input; each output gradient is
    read in 16 bits and written twice, 4 bytes. The attention's and the MLP's inputs are whole hidden states
    on every tp rank, the projection's and fc2's split over tp; full recompute casts the inputs again."""
    lay = c.layout
    h, t = model.hidden_size, lay.tp
    qkv = h + 2 * model.query_groups * model.head_dim
    fc1 = model.ffn_hidden_size * (2 if model.swiglu else 1)
    inputs = 2 * (h + h + model.ffn_hidden_size / t) + 4 * h / t
    gradients = 4 * (qkv / t + h + fc1 / t + h)
    return (inputs * (2 if full else 1) + gradients) * lay.mbs * model.seq_length / lay.cp


def _attention_core(model: ModelSpec, c: Candidate, system: System, core_flops: float) -> dict:
    """Flash attention's core at the rate the device was measured to run a fused causal kernel at; each rank
    of a cp group runs it over its own s/cp tokens. The rates count the whole score matrix (System.attention_rate)
    where the planner's FLOPs count the half a causal kernel computes, so on the planner's count a kernel runs
    at half the rate. The table's rates are for head dimension 128 and serve every head dimension (a kernel
    runs 10-11% slower at 64 in FlashAttention-2's own A100 figure). Without a measurement, flash attention's
    core is timed as GEMMs of the layer's side.
    Unfused attention multiplies batched GEMMs whose smallest side is the head dimension (scores: s x d by
    d x s; their product with the values: s x s by s x d), timed on the curve at that side."""
    lay, on = c.layout, c.switches
    if not on.flash_attention:
        return {"core_flops": core_flops, "core_side": min(model.head_dim, model.seq_length / lay.cp)}
    rate = system.attention_rate(model.seq_length / lay.cp)
    return {"attention_flops": core_flops, "attention_rate": rate * 1e12 / 2} if rate else {}


def _fp8_matmul(system: System, precision: str = "fp8") -> float:
    rate = system.matmul_rate(fp8=True, precision=precision)[0]
    if rate is None:
        raise NotPlannable(f"system {system.name!r} has no peak_fp8_tflops or matmul_fp8_tflops: the planner "
                           "cannot time FP8 on it")
    return rate * 1e12


def _context_exchange(model: ModelSpec, c: Candidate, system: System, layers: int, act: int,
                      core_flops: float) -> dict:
    """Context parallelism's ring: each layer passes every rank's keys and values round the cp group (cp - 1
    steps) in the forward, and keys, values and their gradients in the backward (three times the forward's
    bytes in all); Megatron overlaps each step with the attention core on the chunk it holds."""
    lay = c.layout
    if lay.cp == 1:
        return {}
    kv = 2 * model.query_groups * model.head_dim / min(lay.tp, model.query_groups)
    # cp - 1 hops of a rank's seq / cp tokens each
    sent = layers * 3 * lay.mbs * model.seq_length * (1 - 1 / lay.cp) * kv * act
    inside = lay.tp_cp <= lay.devices_per_node
    bandwidth = _within_node(system, lay.cp) if inside else system.inter_node_gbps * 1e9 / lay.devices_per_node
    return {"cp_bytes": sent, "cp_steps": layers * 3 * (lay.cp - 1), "cp_bandwidth": bandwidth,
            "cp_hidden_flops": core_flops}


def _behind_chunks(total: float, per_micro_batch: float, w: Work, head_start: float = 0.0) -> float:
    """What a data-parallel collective of the vp chunks' weights leaves exposed when each chunk's share
    starts once its last backward starts (or must end before its first forward): the chunks take turns pp
    chunk-steps apart, the network serves their shares in turn, so the last k shares have the last chunk's
    step and k - 1 gaps of pp steps to hide in; the worst k is the first or the last. A gather that starts
    `head_start` seconds early (behind the optimizer's step) hides that much more of the queue."""
    step = per_micro_batch / w.vp
    return max(0.0, max((k * total / w.vp - ((k - 1) * w.pp + 1) * step) for k in (1, w.vp)) - head_start)


def timed(w: Work, eff: Efficiency) -> TimeEstimate:
    """The work at the efficiencies' rates."""
    memory_bw = w.memory_bandwidth * eff.memory
    curve = eff.gemm * w.side / (w.side + eff.gemm_half)
    curve8 = eff.gemm * w.side / (w.side + eff.gemm_half * FP8_HALF_RATIO)
    t_core = w.attention_flops / (w.attention_rate * eff.gemm)  # 0 where the core is timed as GEMMs
    core_curve = eff.gemm * w.core_side / (w.core_side + eff.gemm_half)
    t_gemm = (w.flops - w.fp8_flops - w.attention_flops - w.core_flops) / (w.matmul * curve) + \
        w.core_flops / (w.matmul * core_curve) + \
        (w.fp8_flops / (w.fp8_matmul * curve8) if w.fp8_flops else 0.0) + t_core
    if w.chunked_flops:  # those GEMMs at their chunks' narrower side
        half = eff.gemm_half * (FP8_HALF_RATIO if w.fp8_flops else 1.0)
        chunk_curve = eff.gemm * w.chunk_side / (w.chunk_side + half)
        t_gemm += w.chunked_flops * (1 / chunk_curve - 1 / (curve8 if w.fp8_flops else curve)) / \
            (w.fp8_matmul if w.fp8_flops else w.matmul)
    t_layers = w.elementwise_bytes / memory_bw  # what grows with a stage's layers, not its FLOPs
    if w.cp_bytes:  # the ring hides behind the attention core, as fast as that runs
        t_ring = w.cp_bytes / (w.cp_bandwidth * eff.network) + w.cp_steps * w.latency
        t_layers += max(0.0, t_ring - (t_core or w.cp_hidden_flops / (w.matmul * curve)))
    t_compute = t_gemm + t_layers
    t_tp = w.tp_bytes / (w.tp_bandwidth * eff.network) + w.tp_steps * w.latency
    if w.tp_overlap:  # Megatron's --tp-comm-overlap splits each collective into chunks behind the GEMMs
        t_tp = max(0.0, t_tp - t_gemm)
    if w.experts:  # the expert GEMMs at their own side; the all-to-alls waited for like tp's collectives
        t_experts, t_a2a = experts.expert_times(w.experts, eff.gemm, eff.gemm_half * (FP8_HALF_RATIO if w.fp8_flops else 1),
                                                eff.network, w.latency, w.fp8_matmul or w.matmul, w.side, t_compute)
        t_gemm, t_compute, t_tp = t_gemm + t_experts, t_compute + t_experts, t_tp + t_a2a
    t_send = w.p2p_bytes / (w.p2p_bandwidth * eff.network) + w.latency if w.p2p_bytes else 0.0
    t_p2p = 2 * t_send
    t_sends = w.sends * t_p2p
    if w.overlap_p2p:  # the forward's send behind a chunk's backward, the backward's behind a forward
        chunk = (t_compute + t_tp) / w.vp
        t_p2p = max(0.0, t_send - chunk * 2 / 3) + max(0.0, t_send - chunk / 3)
        path = virtual_stages(w.pp, w.vp) - 1  # the first micro-batch's sends through every chunk, and back: waited whole
        waited = 2 * path + (2 * (w.pp - 1) if w.micro_batches == w.pp else 0)
        t_sends = min(t_sends, (w.sends - path) * t_p2p + waited * t_send)  # never slower than waiting for each
    dp_bw = w.dp_bandwidth * eff.network
    t_reduce = w.reduce_bytes / dp_bw + w.reduce_steps * w.latency
    t_gather = w.gather_bytes / dp_bw + w.gather_steps * w.latency
    t_opt = w.optimizer_bytes / memory_bw
    # the first chunk's gather starts when its own step ends, behind the other chunks' steps
    # (at most its own share: the other chunks' gathers are still dispatched by the schedule)
    head_start = min(t_opt * (w.vp - 1), t_gather) / w.vp if w.first_gather_behind_optimizer else 0.0
    exposed = (_behind_chunks(t_reduce, t_compute * 2 / 3, w) if w.reduce_behind_backward else t_reduce) + \
              (_behind_chunks(t_gather, t_compute / 3, w, head_start) if w.gather_behind_forward else t_gather)
    t_casts = w.weight_cast_bytes / memory_bw
    steady = w.micro_batches * (t_compute + t_tp)
    bubble = w.bubble * (t_gemm * w.bubble_flops + (t_layers + t_tp) * w.bubble_layers)
    iteration = steady + bubble + t_sends + exposed + t_opt + t_casts
    return TimeEstimate(iteration, t_compute, t_tp, t_p2p, t_reduce + t_gather, exposed, t_opt,
                        bubble / (steady + bubble), t_sends, t_casts)


def estimate(model: ModelSpec, vocab_padded: int, c: Candidate, system: System, eff: Efficiency) -> TimeEstimate:
    return timed(work(model, vocab_padded, c, system), eff)
