"""Memory per device: weights, gradients and optimizer states, activations of the first pipeline stage,
and a stated allowance for what the model does not count.

The weight and activation terms are Megatron-LM's theoretical memory model
(megatron/training/theoretical_memory_usage.py), generalised to the cases it leaves out with Table 2 of
Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (MLSys 2023), whose
per-layer terms are counted tensor by tensor for grouped-query attention and SwiGLU:
without sequence parallelism the 10·s·b·h bytes per layer that LayerNorms and dropouts keep are not
split over tp; without selective recompute (and without flash attention, which never stores it) the
attention matrix adds 5·a·s²·b/tp bytes; full recompute keeps only each layer's input (2·s·b·h, split
over tp under sequence parallelism). Activations are 16-bit (fp32 doubles them). Selective recompute's
modules (Megatron-core 0.20's --recompute-modules) and the layer inputs Transformer Engine caches in FP8 are
counted tensor by tensor in `layer_activation_bytes`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from nlp_bench.plan.candidate import Candidate
from nlp_bench.spec.models import ModelSpec

GIB = 2**30
#: What the formulas leave out: NCCL buffers and cuBLAS workspaces (a fixed amount) and the allocator's
#: fragmentation (a fraction of what is counted). Bounded by evidence, not measured: the JUPITER reference
#: layout (175B, tp 8, pp 8, mbs 1, gas 16, selective recompute, distributed optimizer) ran on 40 GB A100s
#: at 48 nodes, where the formulas count 35.6 GiB of states and activations; so at most ~3.8 GiB of a
#: 40 GiB card's ~39.4 usable went to everything else. 1.5 GiB + 5% (3.3 GiB there) stays inside that bound.
#: (Earlier values, 2 GiB + 10%, predicted 41.2 GiB for a layout that ran.)
WORKSPACE_GIB = 1.5
FRAGMENTATION = 0.05


def transformer_parameters(model: ModelSpec) -> float:
    """The layers and the final norm as Megatron's memory model counts them: query groups, MLP kind and norms
    as the model has them, the linear layers' biases left out."""
    final_norm = model.hidden_size * (1 if model.normalization == "RMSNorm" else 2)
    return model.num_layers * model.layer_parameters(biases=False) + final_norm


def _stage_spans(model: ModelSpec, c: Candidate) -> list[tuple[int, int]]:
    """The layers (from, to) of the stages _stage_parameters lists: the first, the first middle one, the last."""
    lay, n = c.layout, model.num_layers
    first, middle, last = lay.stage_layers(n)
    if lay.pp == 1:
        return [(0, n)]
    return [(0, round(first)), *([(round(first), round(first + middle))] if lay.pp > 2 else []), (n - round(last), n)]


def stage_moe_layers(model: ModelSpec, c: Candidate) -> list[int]:
    """The layers with experts of each stage _stage_parameters lists (0 for a dense model)."""
    if model.moe is None:
        return [0] * len(_stage_spans(model, c))
    pattern = model.moe.layer_pattern(model.num_layers)
    return [sum(pattern[a:b]) for a, b in _stage_spans(model, c)]


def stage_split(model: ModelSpec, vocab_padded: int, c: Candidate) -> list[tuple[float, float]]:
    """(parameters on one device outside the routed experts, routed experts' parameters on one device) of
    each stage _stage_parameters lists, as Megatron-core places them (theoretical_memory_usage.py of core
    0.20): attention, norms, router, shared experts and dense MLPs split over tp, the routed experts over
    expert tp x ep, the multi-token prediction modules on the last stage, the embedding on the first and the
    output layer on the last. A dense model's second part is 0, its first _stage_parameters's."""
    if model.moe is None and model.mla is None:
        return [(p, 0.0) for p in _stage_parameters(model, vocab_padded, c)]
    lay = c.layout
    embedding = model.hidden_size * vocab_padded
    pattern = model.moe.layer_pattern(model.num_layers) if model.moe else (0,) * model.num_layers
    spans = _stage_spans(model, c)
    out = []
    (dense_layer, _), (moe_rest, moe_routed) = model.layer_split(False), model.layer_split(True)
    for k, (a, b) in enumerate(spans):
        moe = sum(pattern[a:b])
        dense, routed = (b - a - moe) * dense_layer + moe * moe_rest, moe * moe_routed
        if k == 0:
            dense += embedding * (2 if lay.pp == 1 and model.untie_embeddings else 1)
        if k == len(spans) - 1:
            dense += model.hidden_size * (1 if model.normalization == "RMSNorm" else 2)  # the final norm
            mtp_dense, mtp_routed = model.mtp_split()
            dense += model.mtp_num_layers * mtp_dense + (embedding if lay.pp > 1 else 0)
            routed += model.mtp_num_layers * mtp_routed
        out.append((dense / lay.tp, routed / lay.expert_shards))
    return out


def _stage_parameters(model: ModelSpec, vocab_padded: int, c: Candidate) -> list[float]:
    """Parameters on one device of the first, a middle (pp > 2) and the last (pp > 1) pipeline stage, split
    over tp: each stage's share of the layers, the word embedding on the first stage and the output layer
    (untied) or the embedding's copy (tied) on the last. Where tp exceeds the query groups, each rank keeps a
    whole key/value head (a copy) rather than 1/tp of them."""
    lay = c.layout
    if model.moe is not None or model.mla is not None:
        return [dense + routed for dense, routed in stage_split(model, vocab_padded, c)]
    embedding = model.hidden_size * vocab_padded
    kv = 2 * model.query_groups * model.head_dim * model.hidden_size
    copies = kv * (1 / model.query_groups - 1 / lay.tp) if lay.tp > model.query_groups else 0.0
    per_layer = transformer_parameters(model) / model.num_layers / lay.tp + copies
    first, middle, last = lay.stage_layers(model.num_layers)
    if lay.pp == 1:
        return [first * per_layer + embedding / lay.tp * (2 if model.untie_embeddings else 1)]
    ends = embedding / lay.tp
    return [first * per_layer + ends, *([middle * per_layer] if lay.pp > 2 else []), last * per_layer + ends]


def _stage_layer_counts(model: ModelSpec, c: Candidate) -> list[float]:
    """The transformer layers of the stages _stage_parameters lists, in its order."""
    lay = c.layout
    first, middle, last = lay.stage_layers(model.num_layers)
    return [first] if lay.pp == 1 else [first, *([middle] if lay.pp > 2 else []), last]


def most_loaded_shard(model: ModelSpec, vocab_padded: int, c: Candidate) -> tuple[float, float]:
    """(parameters, transformer layers) of the pipeline stage that holds most parameters, on one device."""
    return max(zip(_stage_parameters(model, vocab_padded, c), _stage_layer_counts(model, c), strict=True))


def parameters_on_most_loaded_shard(model: ModelSpec, vocab_padded: int, c: Candidate) -> float:
    """The parameters of the pipeline stage that holds most, on one device."""
    return most_loaded_shard(model, vocab_padded, c)[0]


def fp8_weight_copies(c: Candidate) -> float:
    """Bytes a linear weight keeps beyond its 16 bits with FP8: Transformer Engine caches its FP8 cast as is
    and transposed across micro-batches (2); with --fp8-param-gather the weight itself is the FP8 one (a byte
    in place of two) and only its transpose is kept beside it (0 beyond the 16 bits)."""
    if not c.switches.fp8 or c.switches.fp8_param_gather:
        return 0.0
    return 2.0


def bytes_per_parameter(c: Candidate, replicas: int | None = None) -> float:
    """Mixed precision: 16-bit weight, fp32 gradient, fp32 master and two fp32 moments (18 bytes), of which
    the distributed optimizer keeps the last 12 once per group of ranks holding the same weights (dp x cp);
    fp32 training has no master. The gradient buffer is 16-bit where Megatron accumulates in the weights'
    type: with fp16 (Megatron's default there; --accumulate-allreduce-grads-in-fp32 is not read) and with
    --grad-reduce-in-bf16. FP8's copies of the linear weights are counted apart (`fp8_weight_copies`). The
    routed experts' states are sharded over their own replicas, expert dp (`replicas`: Megatron-core's
    distributed optimizer shards them over its intra-expert-dp group)."""
    on = c.switches
    replicas = replicas or c.layout.weight_replicas
    if on.precision == "fp32":
        return 16.0 if not on.distributed_optimizer else 8.0 + 8.0 / replicas
    grad = 2.0 if on.precision == "fp16" or on.grad_reduce_in_bf16 else 4.0
    return 2.0 + grad + (12.0 if not on.distributed_optimizer else 12.0 / replicas)


def layer_activation_bytes(model: ModelSpec, c: Candidate, recompute: str | None = None,
                           moe_share: float | None = None, *, moe_layer: bool = False,
                           sixteen_bit: bool = False) -> float:
    """One layer, one micro-batch, on one device, with the candidate's recompute or `recompute`; context
    parallelism splits the sequence. With experts, `moe_share` of the layers (by default the model's share)
    are MoE layers (`_moe_layer_activations`), the rest dense; `moe_layer` marks the call that counts an MoE
    layer's attention with its shared experts as the MLP (`model` then has no experts of its own);
    `sixteen_bit` counts every tensor in 16 bits, whatever FP8 caches (what element-wise work touches, which
    the time model counts: the casts to FP8 are timed apart).

    Each tensor is counted with what keeps it (bytes per token and unit of hidden size), as Megatron-core
    0.20 with Transformer Engine's layer specs stores it; selective recompute drops what its modules
    (`Switches.recompute_modules`) recompute, FP8 the bytes Transformer Engine caches in FP8:

    - the norms' inputs (2 + 2) and the two dropout masks (1 + 1) always stay (the layer's and the
      checkpoints' inputs);
    - the first linear's input, the input norm's output (2): dropped by `layernorm` where the norm is a
      module of its own (latent attention's, feeding the two down-projections; a GQA layer fuses it into
      its QKV GEMM, TE's LayerNormLinear, and has nothing to drop); in FP8 TE caches it as 1 byte, but latent
      attention's two down-projections each cache their own copy (2);
    - the queries (2) and the keys and values (4 g/n): dropped by `mla_up_proj` in latent attention (the
      up-projections' and RoPE's outputs; the latents they recompute from are not counted, as before);
    - the attention output, the projection's input (2): flash attention keeps it in 16 bits for its own
      backward, so FP8 adds TE's 1-byte copy beside it (3); unfused, FP8 keeps only the copy (1);
    - the MLP's input, the pre-MLP norm's output (2): in a dense layer the norm is fused into fc1 (1 byte in
      FP8) and `mlp` drops it with the MLP; in an MoE layer the norm is a module (the router and the experts
      take its output) and the router keeps it in 16 bits, the shared experts' fc1 adds its FP8 copy (1);
      `layernorm` drops both (TE then keeps the recomputed original, not a copy); `moe` keeps it as the
      recomputed layer's input;
    - fc1's output, the activation's input (2 a unit of fc1's width: 4 ffn/h with SwiGLU's gate, 2 with
      GeLU): half with --activation-func-fp8-input-store (SwiGLU); dropped with the MLP by `mlp` (dense
      layers) or `shared_experts` / `moe` (an MoE layer's shared experts);
    - the activation's output, fc2's input (2 ffn/h): 1 in FP8; dropped with the MLP as above;
    - unfused attention's score matrix (5 a s² b/tp): dropped by `core_attn` (flash attention never keeps it).

    Without sequence parallelism the norms', masks' and first linears' inputs are not split over tp; full
    recompute keeps only each layer's input (2·s·b·h, split over tp under sequence parallelism).
    Activations are 16-bit (fp32 doubles them, `_stage_activations`)."""
    if model.moe is not None:
        share = sum(model.moe.layer_pattern(model.num_layers)) / model.num_layers if moe_share is None else moe_share
        moe = _moe_layer_activations(model, c, recompute, sixteen_bit) if share else 0.0
        return share * moe + (1 - share) * layer_activation_bytes(_without_experts(model, None), c, recompute,
                                                                  sixteen_bit=sixteen_bit)
    lay, on = c.layout, c.switches
    s, b, h, a, t = model.seq_length / lay.cp, lay.mbs, model.hidden_size, model.num_attention_heads, lay.tp
    recompute = recompute or on.recompute
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh / (t if on.sequence_parallel else 1)
    mla, fp8 = model.mla is not None, on.fp8 and not sixteen_bit
    fp8_store = on.activation_func_fp8_input_store and model.swiglu and not sixteen_bit

    def again(module: str) -> bool:
        return on.recomputed(module, recompute)

    qkv_in = 0.0 if mla and again("layernorm") else 2.0 if mla or not fp8 else 1.0
    width = model.ffn_hidden_size / h  # the MLP's (an MoE layer's shared experts'; 0: none)
    if moe_layer:
        mlp_again = again("shared_experts") or again("moe")
        fc1_in = 0.0 if again("layernorm") and not again("moe") else \
            2.0 + (1.0 if fp8 and width and not mlp_again else 0.0)
    else:
        mlp_again = again("mlp")
        fc1_in = 0.0 if mlp_again else 1.0 if fp8 else 2.0
    fc1_out = (4 if model.swiglu else 2) * width * (0.5 if fp8_store else 1)
    act_out = (1 if fp8 else 2) * width
    mlp_kept = 0.0 if mlp_again else fc1_out + act_out
    queries = 0.0 if mla and again("mla_up_proj") else 2.0
    attn_out = (3.0 if on.flash_attention else 1.0) if fp8 else 2.0
    unsplit = 6 + qkv_in + fc1_in  # norms' inputs and masks, the first linears' inputs
    split = queries + attn_out + mlp_kept
    # keys and values: a rank keeps g/tp groups, or one whole group where tp exceeds them
    kv = 0.0 if mla and again("mla_up_proj") else \
        4 * model.query_groups / model.num_attention_heads * sbh / min(t, model.query_groups)
    per_layer = (unsplit + split) * sbh / t if on.sequence_parallel else (unsplit + split / t) * sbh
    per_layer += kv
    if not again("core_attn") and not on.flash_attention:
        per_layer += 5 * a * s * s * b / t
    return per_layer


def routed_load(model: ModelSpec) -> float:
    """The routed token copies an expert rank holds, as a multiple of its even share: at most the capacity
    factor with one (Megatron drops what exceeds it, pads up to it with --moe-pad-expert-input-to-capacity);
    dropless, the even share itself. A dropless router's load is only as even as its balancing makes it (at
    worst every copy of the ep group on one rank, ep times the share): the planner takes the aux-loss or
    expert-bias balancing to hold it near even, and says so."""
    e = model.moe
    return 1.0 if e is None or e.capacity_factor is None else e.capacity_factor


@functools.cache
def _without_experts(model: ModelSpec, ffn_hidden_size: int | None) -> ModelSpec:
    """The model's dense layers (`ffn_hidden_size` None), or an MoE layer's attention with its shared experts as
    the MLP: what the dense activation formula counts (made once per model, as the planner asks per layout)."""
    return replace(model, moe=None, **({} if ffn_hidden_size is None else {"ffn_hidden_size": ffn_hidden_size}))


def _moe_layer_activations(model: ModelSpec, c: Candidate, recompute: str | None, sixteen_bit: bool) -> float:
    """One MoE layer's activations, one micro-batch, one device: the attention and norms as a dense layer's,
    the shared experts as a dense MLP of their width (none: no MLP), and per routed token copy (top-k of each
    token; the rank computes `Layout.routed_share` of the micro-batch's copies, times `routed_load`) the
    permuted input the first expert GEMM's weight gradient needs (2h; TE's grouped GEMM caches it as 1h in
    FP8) and the expert MLP's intermediates as a dense MLP keeps them (fc1's output 4 a unit of width with
    SwiGLU, 2 with GeLU, halved by --activation-func-fp8-input-store; the activation's output 2, 1 in FP8,
    none with `moe_act` recomputing it; the width split over expert tp); and the router's fp32 scores (4
    bytes per expert and token, split over tp x cp). Recomputing `moe` keeps only the layer's input (counted
    with the attention)."""
    e, lay, on = model.moe, c.layout, c.switches
    out = layer_activation_bytes(_without_experts(model, e.shared_expert_intermediate_size), c, recompute,
                                 moe_layer=True, sixteen_bit=sixteen_bit)
    if (recompute or on.recompute) == "full" or on.recomputed("moe", recompute):
        return out
    tokens = lay.mbs * model.seq_length
    fp8 = on.fp8 and not sixteen_bit
    fc1_out = (4 if model.swiglu else 2) * (0.5 if on.activation_func_fp8_input_store and model.swiglu
                                            and not sixteen_bit else 1)
    act_out = 0.0 if on.recomputed("moe_act", recompute) else 1.0 if fp8 else 2.0
    width = (fc1_out + act_out) * e.ffn_hidden_size / lay.expert_tp
    copies = e.router_topk * routed_load(model) * tokens * lay.routed_share
    scores = 4 * e.num_experts * tokens / lay.tp_cp
    return out + copies * ((1 if fp8 else 2) * model.hidden_size + width) + scores


def _stage_activations(model: ModelSpec, vocab_padded: int, c: Candidate) -> list[float]:
    """The activations of the first, a middle (pp > 2) and the last (pp > 1) stage: stage k keeps its layers
    for each of up to pp - k micro-batches in flight (fewer when gas is smaller; more, by Megatron's
    interleaving penalty, with vp > 1), the first also the embedding's input and dropout, and a single stage
    the output layer and loss. Context parallelism splits every sequence over cp ranks."""
    lay, on = c.layout, c.switches
    s, b, h = model.seq_length / lay.cp, lay.mbs, model.hidden_size
    first, middle, last = lay.stage_layers(model.num_layers)
    moe = stage_moe_layers(model, c)
    every = layer_activation_bytes(model, c) * lay.tp  # Megatron divides by tp at the end

    def tp_part(k: int, layers: float) -> float:
        """Stage k's layers; with experts, with its own share of MoE layers, and on the last stage the
        multi-token prediction modules as layers more."""
        extra = model.mtp_num_layers if k == len(moe) - 1 else 0
        if model.moe is None or not layers:
            return every * (layers + extra)
        return layer_activation_bytes(model, c, moe_share=moe[k] / layers) * lay.tp * (layers + extra)

    def in_flight(k: int) -> int:
        return min(lay.pp - k, lay.gas) if lay.vp == 1 else lay.pp

    stages = [(tp_part(0, first) + 8 * s * b + s * b * h) * in_flight(0)]
    if lay.pp > 2:
        stages.append(tp_part(1, middle) * in_flight(1))  # the first middle stage: the most in flight of them
    if lay.pp > 1:
        stages.append(tp_part(len(moe) - 1, last) * in_flight(lay.pp - 1))
    interleaving = 1 + lay.interleaving_extra
    output = s * b * h * 4 * (1 + vocab_padded / h) if lay.pp == 1 else 0.0
    factor = 2.0 if on.precision == "fp32" else 1.0
    return [factor * (memory * interleaving + output) / lay.tp for memory in stages]


def activation_bytes(model: ModelSpec, vocab_padded: int, c: Candidate) -> float:
    """The activations of the stage that holds most, on one device."""
    return max(_stage_activations(model, vocab_padded, c))


@dataclass(frozen=True)
class MemoryEstimate:
    weights_and_optimizer: float  # bytes
    activations: float
    allowance: float

    @property
    def total(self) -> float:
        return self.weights_and_optimizer + self.activations + self.allowance

    @property
    def gib(self) -> float:
        return self.total / GIB


def footprint(model: ModelSpec, vocab_padded: int, c: Candidate) -> MemoryEstimate:
    """The pipeline stage that needs most: its weights and optimizer states with its activations (with
    uneven stages, not necessarily the stage that holds most of either)."""
    per_parameter = bytes_per_parameter(c)
    if model.moe is not None or model.mla is not None:  # FP8 copies of every weight the stage holds, all experts
        per_expert = bytes_per_parameter(c, c.layout.edp)
        stages = [dense * per_parameter + routed * per_expert + fp8_weight_copies(c) * (dense + routed)
                  for dense, routed in stage_split(model, vocab_padded, c)]
    else:
        copies = fp8_weight_copies(c) * model.linear_weights() / c.layout.tp  # a layer's, on one device
        stages = [p * per_parameter + layers * copies for p, layers in
                  zip(_stage_parameters(model, vocab_padded, c), _stage_layer_counts(model, c), strict=True)]
    states, activations = max(zip(stages, _stage_activations(model, vocab_padded, c), strict=True), key=sum)
    allowance = WORKSPACE_GIB * GIB + FRAGMENTATION * (states + activations)
    return MemoryEstimate(states, activations, allowance)

