"""Memory per device: weights, gradients and optimizer states, activations of the first pipeline stage,
and a stated allowance for what the model does not count.

The weight and activation terms are Megatron-LM's theoretical memory model
(megatron/training/theoretical_memory_usage.py), generalised to the cases it leaves out with Table 2 of
Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (MLSys 2023), whose
per-layer terms are counted tensor by tensor for grouped-query attention and SwiGLU:
without sequence parallelism the 10·s·b·h bytes per layer that LayerNorms and dropouts keep are not
split over tp; without selective recompute (and without flash attention, which never stores it) the
attention matrix adds 5·a·s²·b/tp bytes; full recompute keeps only each layer's input (2·s·b·h, split
over tp under sequence parallelism). Activations are 16-bit (fp32 doubles them).
"""

from __future__ import annotations

from dataclasses import dataclass

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


def _stage_parameters(model: ModelSpec, vocab_padded: int, c: Candidate) -> list[float]:
    """Parameters on one device of the first, a middle (pp > 2) and the last (pp > 1) pipeline stage, split
    over tp: each stage's share of the layers, the word embedding on the first stage and the output layer
    (untied) or the embedding's copy (tied) on the last. Where tp exceeds the query groups, each rank keeps a
    whole key/value head (a copy) rather than 1/tp of them."""
    lay = c.layout
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


def bytes_per_parameter(c: Candidate) -> float:
    """Mixed precision: 16-bit weight, fp32 gradient, fp32 master and two fp32 moments (18 bytes), of which
    the distributed optimizer keeps the last 12 once per group of ranks holding the same weights (dp x cp);
    fp32 training has no master. The gradient buffer is 16-bit where Megatron accumulates in the weights'
    type: with fp16 (Megatron's default there; --accumulate-allreduce-grads-in-fp32 is not read) and with
    --grad-reduce-in-bf16. FP8's copies of the linear weights are counted apart (`fp8_weight_copies`)."""
    lay, on = c.layout, c.switches
    if on.precision == "fp32":
        return 16.0 if not on.distributed_optimizer else 8.0 + 8.0 / lay.weight_replicas
    grad = 2.0 if on.precision == "fp16" or on.grad_reduce_in_bf16 else 4.0
    return 2.0 + grad + (12.0 if not on.distributed_optimizer else 12.0 / lay.weight_replicas)


def layer_activation_bytes(model: ModelSpec, c: Candidate, recompute: str | None = None) -> float:
    """One layer, one micro-batch, on one device (16-bit), with the candidate's recompute or `recompute`;
    context parallelism splits the sequence."""
    lay, on = c.layout, c.switches
    s, b, h, a, t = model.seq_length / lay.cp, lay.mbs, model.hidden_size, model.num_attention_heads, lay.tp
    recompute = recompute or on.recompute
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh / (t if on.sequence_parallel else 1)
    # the tensor-parallel part: queries and the output projection's input (2 + 2), the MLP's first output (2,
    # or 4 with SwiGLU's gate, times ffn/h) and its activation's output (2 ffn/h), and the keys and values of
    # the query groups (2 + 2 times g/n); 24 for multi-head attention with a GeLU MLP of 4h
    split = 4 + (6 if model.swiglu else 4) * model.ffn_hidden_size / h
    # keys and values: a rank keeps g/tp groups, or one whole group where tp exceeds them
    kv = 4 * model.query_groups / model.num_attention_heads * sbh / min(t, model.query_groups)
    per_layer = (10 + split) * sbh / t if on.sequence_parallel else (10 + split / t) * sbh
    per_layer += kv
    if recompute == "none" and not on.flash_attention:
        per_layer += 5 * a * s * s * b / t
    return per_layer


def _stage_activations(model: ModelSpec, vocab_padded: int, c: Candidate) -> list[float]:
    """The activations of the first, a middle (pp > 2) and the last (pp > 1) stage: stage k keeps its layers
    for each of up to pp - k micro-batches in flight (fewer when gas is smaller; more, by Megatron's
    interleaving penalty, with vp > 1), the first also the embedding's input and dropout, and a single stage
    the output layer and loss. Context parallelism splits every sequence over cp ranks."""
    lay, on = c.layout, c.switches
    s, b, h = model.seq_length / lay.cp, lay.mbs, model.hidden_size
    tp_part = layer_activation_bytes(model, c) * lay.tp  # Megatron divides by tp at the end
    first, middle, last = lay.stage_layers(model.num_layers)

    def in_flight(k: int) -> int:
        return min(lay.pp - k, lay.gas) if lay.vp == 1 else lay.pp

    stages = [(tp_part * first + 8 * s * b + s * b * h) * in_flight(0)]
    if lay.pp > 2:
        stages.append(tp_part * middle * in_flight(1))  # the first middle stage: the most in flight of them
    if lay.pp > 1:
        stages.append(tp_part * last * in_flight(lay.pp - 1))
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
    copies = fp8_weight_copies(c) * model.linear_weights() / c.layout.tp  # a layer's, on one device
    stages = zip(_stage_parameters(model, vocab_padded, c), _stage_layer_counts(model, c), strict=True)
    states, activations = max(zip((p * per_parameter + layers * copies for p, layers in stages),
                                  _stage_activations(model, vocab_padded, c), strict=True), key=sum)
    allowance = WORKSPACE_GIB * GIB + FRAGMENTATION * (states + activations)
    return MemoryEstimate(states, activations, allowance)

