"""Model presets: one definition of a decoder-only transformer that the trainer's flags, the FLOPs, the
planner's memory and the rules read, and Megatron's vocabulary padding.

A ModelSpec says everything that changes the parameters or the arithmetic: the sizes, the query groups of
grouped-query attention, the MLP (GeLU or SwiGLU), the norm, the positions (learned or rotary with its base),
tied or untied output weights, biases, the vocabulary. `megatron_flags` writes it as Megatron-LM's flags and
`from_flags` reads it back from them, so a point's flags and its model cannot disagree.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from nlp_bench import flops
from nlp_bench.errors import SpecError, unknown

#: GPT-2 BPE vocabulary size (gpt2-vocab.json holds this many entries).
GPT2_VOCAB = 50257
#: Llama 3's tokenizer: 128,000 BPE tokens and 256 special ones (config.json's vocab_size)
LLAMA3_VOCAB = 128256

MLPS = ("gelu", "swiglu")
NORMS = ("LayerNorm", "RMSNorm")
POSITIONS = ("learned_absolute", "rope")
#: Megatron-LM's default --rotary-base
ROTARY_BASE = 10000

#: how a router scores the experts (Megatron's --moe-router-score-function)
ROUTER_SCORES = ("softmax", "sigmoid")


@dataclass(frozen=True)
class MoESpec:
    """The experts of a mixture-of-experts model, in Megatron-core's terms.

    Layer i (from 0) has experts where i >= first_k_dense and i % layer_freq == 0 (Megatron's integer
    --moe-layer-freq; first-k dense is its list form, as DeepSeek-V3 uses it), else the dense MLP of
    ModelSpec.ffn_hidden_size. Every expert is the model's MLP (SwiGLU or GeLU, biases as the model has them).
    """

    num_experts: int
    router_topk: int
    #: each routed expert's MLP width (--moe-ffn-hidden-size)
    ffn_hidden_size: int
    #: all shared experts together, as one MLP this wide (--moe-shared-expert-intermediate-size); 0: none
    shared_expert_intermediate_size: int = 0
    first_k_dense: int = 0
    layer_freq: int = 1
    router_score: str = "softmax"
    #: the load-balancing loss's weight (--moe-aux-loss-coeff); 0 with expert_bias is aux-loss-free balancing
    aux_loss_coeff: float = 0.0
    #: aux-loss-free load balancing: a per-expert bias on the routing scores, updated outside the gradient
    #: (--moe-router-enable-expert-bias; a buffer, not a parameter)
    expert_bias: bool = False
    #: what the aux loss balances (--moe-router-load-balancing-type): the global batch's tokens (aux_loss) or
    #: each sequence's (seq_aux_loss, DeepSeek-V3)
    load_balancing: str = "aux_loss"
    #: tokens an expert takes, as a multiple of its even share (--moe-expert-capacity-factor); None: dropless
    capacity_factor: float | None = None
    #: the routed experts' weights scaled by this (--moe-router-topk-scaling-factor; DeepSeek-V3's 2.5)
    topk_scaling_factor: float | None = None
    #: group-limited routing: experts in num_groups groups, a token's top-k drawn from its best group_topk
    #: groups (--moe-router-num-groups, --moe-router-group-topk; DeepSeek-V3's 8 and 4, one group a node)
    num_groups: int | None = None
    group_topk: int | None = None

    def layer_pattern(self, num_layers: int) -> tuple[int, ...]:
        """1 for each layer with experts, 0 for a dense one (Megatron's --moe-layer-freq as a list)."""
        return _layer_pattern(self.first_k_dense, self.layer_freq, num_layers)

    @property
    def dropless(self) -> bool:
        return self.capacity_factor is None


@dataclass(frozen=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2/V3), Megatron's --multi-latent-attention and its sizes:
    queries and keys/values go through low-rank latents; each head's query/key is a part without
    positions (qk_head_dim) and a rotary part (qk_pos_emb_head_dim), the latter's key shared by all heads."""

    #: the query latent (--q-lora-rank); None: queries projected directly from the hidden state
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_head_dim: int
    qk_pos_emb_head_dim: int
    v_head_dim: int


#: marks the integer fields that make the transformer's shape (Megatron's flags of the same names)
_SHAPE = {"shape": True}
#: marks the fields that choose the architecture (each one Megatron flag)
_ARCH = {"arch": True}


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, in Megatron's terms."""

    name: str
    num_layers: int = field(metadata=_SHAPE)
    hidden_size: int = field(metadata=_SHAPE)
    num_attention_heads: int = field(metadata=_SHAPE)
    ffn_hidden_size: int = field(metadata=_SHAPE)
    seq_length: int = field(metadata=_SHAPE)
    max_position_embeddings: int = field(metadata=_SHAPE)
    vocab_size: int = GPT2_VOCAB
    #: key/value heads of grouped-query attention; None is multi-head attention (one per query head)
    num_query_groups: int | None = field(default=None, metadata=_ARCH)
    mlp: str = field(default="gelu", metadata=_ARCH)
    normalization: str = field(default="LayerNorm", metadata=_ARCH)
    position_embedding_type: str = field(default="learned_absolute", metadata=_ARCH)
    rotary_base: int = field(default=ROTARY_BASE, metadata=_ARCH)
    untie_embeddings: bool = field(default=False, metadata=_ARCH)
    bias: bool = field(default=True, metadata=_ARCH)
    #: each attention head's size (--kv-channels); None: hidden_size / num_attention_heads
    kv_channels: int | None = None
    #: RMS/LayerNorm of each head's queries and keys (--qk-layernorm; Qwen3)
    qk_layernorm: bool = False
    #: a learned logit per head that each softmax also normalises over (gpt-oss's attention sinks)
    attention_sinks: bool = False
    #: tokens a sliding-window layer attends back over (--window-size); None: full attention everywhere
    window_size: int | None = None
    #: every window_attn_skip_freq-th layer (counted from 1) attends fully (--window-attn-skip-freq)
    window_attn_skip_freq: int | None = None
    #: experts; None is a dense model
    moe: MoESpec | None = None
    #: latent attention; None is multi-head or grouped-query attention
    mla: MLASpec | None = None
    #: multi-token prediction modules (--mtp-num-layers): each one more transformer layer, trained, that
    #: predicts one token further on
    mtp_num_layers: int = 0
    #: The size the benchmark names the model by, in billions of parameters (the table's Model_Size).
    nominal_billions: float | None = None
    #: where the shape is published
    source: str = ""

    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def swiglu(self) -> bool:
        return self.mlp == "swiglu"

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def builtin_lacks(self) -> tuple[str, ...]:
        """The parts of this model the built-in trainer does not build: a point of it is refused naming them,
        while the spec, the FLOPs and the flags still know the model."""
        lacks = {"multi-head latent attention": self.mla is not None,
                 "multi-token prediction": self.mtp_num_layers > 0,
                 "attention sinks": self.attention_sinks,
                 "sliding-window attention": self.window_size is not None,
                 "query/key layernorm": self.qk_layernorm,
                 f"kv_channels {self.kv_channels} (head size other than hidden/heads)":
                     self.kv_channels is not None and self.kv_channels != self.hidden_size // self.num_attention_heads}
        return tuple(part for part, lacking in lacks.items() if lacking)

    def linear_weights(self) -> int:
        """One transformer layer's weight matrices: query, key/value and output projections, the MLP (what FP8
        recipes run and may keep in FP8). With experts or latent attention, a token's share averaged over the
        layers: the attention's projections, the dense MLP or the shared experts and the top-k routed experts
        it is sent to (the weights its FLOPs multiply)."""
        h, f = self.hidden_size, self.ffn_hidden_size
        if self.moe is None and self.mla is None:
            return h * h + h * 2 * self.query_groups * self.head_dim + h * h + (3 if self.swiglu else 2) * h * f
        return _active_linear_weights(self)

    def layer_parameters(self, biases: bool = True) -> int:
        """One transformer layer: query, key/value and output projections, the MLP, two norms; the linear
        layers' biases where the model has them, unless `biases` is false (Megatron's memory model leaves
        them out)."""
        h, f = self.hidden_size, self.ffn_hidden_size
        kv = 2 * self.query_groups * self.head_dim
        matrices = self.linear_weights()
        linear_biases = (h + kv + h + (2 * f if self.swiglu else f) + h) if self.bias and biases else 0
        norms = 2 * (h if self.normalization == "RMSNorm" else 2 * h)
        return matrices + linear_biases + norms

    def parameters(self, vocab_padded: int) -> int:
        """All parameters: the layers (every expert), the final norm, the word embedding (twice when untied),
        learned positions where there are any; no multi-token prediction module (total_parameters)."""
        return self.total_parameters(vocab_padded)

    def _mlp(self, width: int) -> int:
        """One MLP of this width: its matrices and, where the model has them, biases."""
        h = self.hidden_size
        matrices = (3 if self.swiglu else 2) * h * width
        return matrices + (((2 * width if self.swiglu else width) + h) if self.bias else 0)

    def _norm(self, width: int) -> int:
        return width if self.normalization == "RMSNorm" else 2 * width

    def _attention(self) -> int:
        """One layer's attention: its projections (latent or not), their biases and norms, the sinks."""
        h, n = self.hidden_size, self.num_attention_heads
        if (m := self.mla) is not None:
            qk = m.qk_head_dim + m.qk_pos_emb_head_dim
            queries = h * n * qk if m.q_lora_rank is None else \
                h * m.q_lora_rank + self._norm(m.q_lora_rank) + m.q_lora_rank * n * qk
            keys_values = (h * (m.kv_lora_rank + m.qk_pos_emb_head_dim) + self._norm(m.kv_lora_rank)
                           + m.kv_lora_rank * n * (m.qk_head_dim + m.v_head_dim))
            return queries + keys_values + n * m.v_head_dim * h
        q, kv = n * self.head_dim, 2 * self.query_groups * self.head_dim
        biases = q + kv + h if self.bias else 0
        norms = 2 * self._norm(self.head_dim) if self.qk_layernorm else 0
        return h * (q + kv) + q * h + biases + norms + (n if self.attention_sinks else 0)

    def _layer(self, moe_layer: bool, active: bool) -> int:
        """One transformer layer; of an MoE layer all experts, or (`active`) those a token is routed to."""
        h, e = self.hidden_size, self.moe
        if not moe_layer or e is None:
            mlp = self._mlp(self.ffn_hidden_size)
        else:
            router = h * e.num_experts + (e.num_experts if self.bias else 0)  # Megatron's router: the model's biases
            experts = (e.router_topk if active else e.num_experts) * self._mlp(e.ffn_hidden_size)
            mlp = router + experts + (self._mlp(e.shared_expert_intermediate_size)
                                      if e.shared_expert_intermediate_size else 0)
        return self._attention() + mlp + 2 * self._norm(h)

    def layer_split(self, moe_layer: bool) -> tuple[int, int]:
        """One layer's parameters as Megatron-core places them: (those split over tp or kept whole on every
        rank: attention, norms, router, shared experts or the dense MLP; the routed experts, split over
        expert tp x ep). A dense layer's second part is 0."""
        return _layer_split(self, moe_layer)

    def mtp_split(self) -> tuple[int, int]:
        """One multi-token prediction module's parameters, split as `layer_split` splits a layer: its norms
        and joint projection 2h -> h beside a layer like the model's last (embedding and output layer shared)."""
        h = self.hidden_size
        rest, routed = self.layer_split(bool(self.moe and self.moe.layer_pattern(self.num_layers)[-1]))
        return rest + 3 * self._norm(h) + 2 * h * h, routed

    def _layers(self, active: bool, mtp: bool) -> int:
        return _all_layers(self, active, mtp)

    def _count_layers(self, active: bool, mtp: bool) -> int:
        pattern = self.moe.layer_pattern(self.num_layers) if self.moe else (0,) * self.num_layers
        out = sum(self._layer(bool(moe), active) for moe in pattern)
        if mtp and self.mtp_num_layers:
            # each module: norms of the embedding and of the hidden state, their joint projection 2h -> h, a
            # layer like the last one, its own final norm (embedding and output layer shared with the model)
            h = self.hidden_size
            module = 3 * self._norm(h) + 2 * h * h + self._layer(bool(pattern[-1]), active)
            out += self.mtp_num_layers * module
        return out

    def total_parameters(self, vocab_padded: int, mtp: bool = False) -> int:
        """Every parameter of the model, all experts counted; the multi-token prediction modules only with
        `mtp` (model cards count the main model: DeepSeek-V3's 671B leaves its MTP module out)."""
        return self._layers(False, mtp) + self._rest(vocab_padded, input_embedding=True)

    def active_parameters(self, vocab_padded: int, input_embedding: bool = True, mtp: bool = False) -> int:
        """The parameters one token goes through: all but the routed experts it is not sent to. Model cards
        differ on the input embedding (a lookup, no arithmetic): Mixtral's and Qwen3's count it, DeepSeek-V3's
        and gpt-oss's do not (`input_embedding` False)."""
        if self.moe is None:
            return self.total_parameters(vocab_padded, mtp) - (0 if input_embedding else self._input_embedding(vocab_padded))
        return self._layers(True, mtp) + self._rest(vocab_padded, input_embedding)

    def _input_embedding(self, vocab_padded: int) -> int:
        """What leaving the input embedding out of a count removes: the table where it is not the output
        layer's too, and the learned positions."""
        h = self.hidden_size
        positions = self.max_position_embeddings * h if self.position_embedding_type == "learned_absolute" else 0
        return (vocab_padded * h if self.untie_embeddings else 0) + positions

    def _rest(self, vocab_padded: int, input_embedding: bool) -> int:
        """The final norm, the output layer, and (`input_embedding`) the input embedding and positions."""
        h = self.hidden_size
        return self._norm(h) + vocab_padded * h + (self._input_embedding(vocab_padded) if input_embedding else 0)

    def size_billions(self, vocab_padded: int) -> float:
        if self.nominal_billions is not None:
            return self.nominal_billions
        return round(self.parameters(vocab_padded) / 1e9, 3)

    def to_dict(self) -> dict:
        return asdict(self)

    def flops_shape(self, global_batch: int, vocab_padded: int, recompute: bool = False) -> flops.Shape:
        """What the FLOPs conventions need of this model for one step of `global_batch` sequences."""
        e, m = self.moe, self.mla
        pattern = e.layer_pattern(self.num_layers) if e else (0,)
        return flops.Shape(global_batch, self.seq_length, self.num_layers, self.hidden_size, vocab_padded,
                           self.ffn_hidden_size, self.swiglu, recompute, self.num_attention_heads,
                           self.query_groups, kv_channels=self.kv_channels or 0,
                           moe_layers=sum(pattern) if e else 0, topk=e.router_topk if e else 0,
                           moe_ffn_hidden=e.ffn_hidden_size if e else 0,
                           shared_ffn_hidden=e.shared_expert_intermediate_size if e else 0,
                           mla=(m.q_lora_rank or 0, m.kv_lora_rank, m.qk_head_dim, m.qk_pos_emb_head_dim,
                                m.v_head_dim) if m else None,
                           mtp_layers=self.mtp_num_layers, mtp_moe=bool(pattern[-1]))

    def megatron_flags(self) -> dict[str, Any]:
        """The architecture as Megatron-LM's flags (the sizes are the jobscript's own variables); a flag at
        Megatron's default is left out, so GPT points render as they always did."""
        out: dict[str, Any] = {}
        if self.num_query_groups is not None:
            out.update({"group-query-attention": True, "num-query-groups": self.num_query_groups})
        if self.swiglu:
            out["swiglu"] = True
        if self.normalization != "LayerNorm":
            out["normalization"] = self.normalization
        if self.position_embedding_type != "learned_absolute":
            out["position-embedding-type"] = self.position_embedding_type
        if self.rotary_base != ROTARY_BASE:
            out["rotary-base"] = self.rotary_base
        if not self.bias:
            out["disable-bias-linear"] = True
        if self.untie_embeddings:
            out["untie-embeddings-and-output-weights"] = True
        if self.kv_channels is not None:
            out["kv-channels"] = self.kv_channels
        if self.qk_layernorm:
            out["qk-layernorm"] = True
        if self.attention_sinks:
            out["softmax-type"] = "learnable"
        if self.window_size is not None:
            out["window-size"] = f"{self.window_size},0"
        if self.window_attn_skip_freq is not None:
            out["window-attn-skip-freq"] = self.window_attn_skip_freq
        if (m := self.mla) is not None:
            out.update({"multi-latent-attention": True, "kv-lora-rank": m.kv_lora_rank, "qk-head-dim": m.qk_head_dim,
                        "qk-pos-emb-head-dim": m.qk_pos_emb_head_dim, "v-head-dim": m.v_head_dim})
            if m.q_lora_rank is not None:
                out["q-lora-rank"] = m.q_lora_rank
        if self.mtp_num_layers:
            out["mtp-num-layers"] = self.mtp_num_layers
        if self.moe is not None:
            out.update(_moe_flags(self.moe, self.num_layers))
        return out

    def description(self) -> str:
        attention = (f"{self.num_attention_heads} heads" if self.num_query_groups is None
                     else f"{self.num_attention_heads} heads in {self.num_query_groups} query groups")
        rope = f"rope base {self.rotary_base}" if self.position_embedding_type == "rope" else "learned positions"
        out = (f"{self.num_layers} layers, hidden {self.hidden_size}, {attention}, ffn {self.ffn_hidden_size} "
               f"({'SwiGLU' if self.swiglu else 'GeLU'}), {self.normalization}, {rope}, "
               f"{'untied' if self.untie_embeddings else 'tied'} embeddings, {'biases' if self.bias else 'no biases'}")
        if (m := self.mla) is not None:
            out += (f", latent attention (q rank {m.q_lora_rank}, kv rank {m.kv_lora_rank}, head {m.qk_head_dim}+"
                    f"{m.qk_pos_emb_head_dim} rope, v {m.v_head_dim})")
        if (e := self.moe) is not None:
            shared = f" + shared {e.shared_expert_intermediate_size}" if e.shared_expert_intermediate_size else ""
            dense = f", first {e.first_k_dense} layers dense" if e.first_k_dense else ""
            out += (f", {e.num_experts} experts of ffn {e.ffn_hidden_size} top-{e.router_topk}{shared} "
                    f"({e.router_score}{dense})")
        if self.mtp_num_layers:
            out += f", {self.mtp_num_layers} MTP module(s)"
        return out


# The planner asks a model for its parameter counts once per layout it ranks: each is counted once per model.
@functools.cache
def _layer_pattern(first_k_dense: int, layer_freq: int, num_layers: int) -> tuple[int, ...]:
    return tuple(int(i >= first_k_dense and i % layer_freq == 0) for i in range(num_layers))


@functools.cache
def _all_layers(model: ModelSpec, active: bool, mtp: bool) -> int:
    return model._count_layers(active, mtp)


@functools.cache
def _layer_split(model: ModelSpec, moe_layer: bool) -> tuple[int, int]:
    whole = model._layer(moe_layer, active=False)
    routed = model.moe.num_experts * model._mlp(model.moe.ffn_hidden_size) if moe_layer and model.moe else 0
    return whole - routed, routed


@functools.cache
def _active_linear_weights(model: ModelSpec) -> int:
    pattern = model.moe.layer_pattern(model.num_layers) if model.moe else (0,) * model.num_layers
    norms = 2 * model._norm(model.hidden_size)
    return round(sum(model._layer(bool(moe), active=True) - norms for moe in pattern) / model.num_layers)


def _moe_flags(e: MoESpec, num_layers: int) -> dict[str, Any]:
    """The experts as Megatron-LM's flags; --moe-layer-freq as an integer, or where layers come first dense,
    as the list expression Megatron evaluates."""
    out: dict[str, Any] = {"num-experts": e.num_experts, "moe-router-topk": e.router_topk,
                           "moe-ffn-hidden-size": e.ffn_hidden_size}
    if e.shared_expert_intermediate_size:
        out["moe-shared-expert-intermediate-size"] = e.shared_expert_intermediate_size
    if e.first_k_dense and e.layer_freq == 1:
        out["moe-layer-freq"] = f"([0]*{e.first_k_dense}+[1]*{num_layers - e.first_k_dense})"
    elif e.first_k_dense:
        out["moe-layer-freq"] = str(list(e.layer_pattern(num_layers))).replace(" ", "")
    elif e.layer_freq != 1:
        out["moe-layer-freq"] = e.layer_freq
    if e.router_score != "softmax":
        out["moe-router-score-function"] = e.router_score
    if e.load_balancing != "aux_loss":
        out["moe-router-load-balancing-type"] = e.load_balancing
    if e.aux_loss_coeff:
        out["moe-aux-loss-coeff"] = e.aux_loss_coeff
    if e.expert_bias:
        out["moe-router-enable-expert-bias"] = True
    if e.capacity_factor is not None:
        out["moe-expert-capacity-factor"] = e.capacity_factor
    optional = {"moe-router-topk-scaling-factor": e.topk_scaling_factor, "moe-router-num-groups": e.num_groups,
                "moe-router-group-topk": e.group_topk}
    return {**out, **{flag: value for flag, value in optional.items() if value is not None}}


def _moe_from_flags(get: Any, num_layers: int, ffn_hidden_size: int) -> MoESpec | None:
    """The experts Megatron flags describe (None: no --num-experts); an expert as wide as the dense MLP unless
    --moe-ffn-hidden-size says otherwise, as in Megatron."""
    if not get("num-experts"):
        return None
    first_k, freq = _layer_freq(get("moe-layer-freq") or 1, num_layers)
    capacity, scaling = get("moe-expert-capacity-factor"), get("moe-router-topk-scaling-factor")
    groups, group_topk = get("moe-router-num-groups"), get("moe-router-group-topk")
    return MoESpec(int(get("num-experts")), int(get("moe-router-topk") or 2),
                   int(get("moe-ffn-hidden-size") or ffn_hidden_size),
                   int(get("moe-shared-expert-intermediate-size") or 0), first_k, freq,
                   get("moe-router-score-function") or "softmax", float(get("moe-aux-loss-coeff") or 0.0),
                   bool(get("moe-router-enable-expert-bias")), get("moe-router-load-balancing-type") or "aux_loss",
                   None if capacity is None else float(capacity), None if scaling is None else float(scaling),
                   None if groups is None else int(groups), None if group_topk is None else int(group_topk))


def _layer_freq(value: Any, num_layers: int) -> tuple[int, int]:
    """--moe-layer-freq as (first dense layers, frequency): an integer, "([0]*k+[1]*m)", or a list of 0/1."""
    import ast
    import re

    text = str(value).replace(" ", "")
    if text.isdigit():
        return 0, int(text)
    if found := re.fullmatch(r"\(\[0\]\*(\d+)\+\[1\]\*(\d+)\)", text):
        pattern = (0,) * int(found[1]) + (1,) * int(found[2])
    else:
        try:
            pattern = tuple(ast.literal_eval(text))
        except (ValueError, SyntaxError, TypeError):
            raise SpecError(f"--moe-layer-freq {value}: not an integer, ([0]*k+[1]*m) or a list of 0 and 1") from None
    for first_k in range(num_layers):
        for freq in range(1, num_layers + 1):
            if MoESpec(1, 1, 1, first_k_dense=first_k, layer_freq=freq).layer_pattern(num_layers) == pattern:
                return first_k, freq
    raise SpecError(f"--moe-layer-freq {value}: not first-k dense then every n-th layer over {num_layers} layers")


#: The shape fields, in order: the one list the sweep's model parameters and the trainer's GPTConfig
#: take their names from.
SHAPE = tuple(f.name for f in fields(ModelSpec) if f.metadata.get("shape"))
#: The architecture fields, each written as one Megatron flag by ModelSpec.megatron_flags.
ARCHITECTURE = tuple(f.name for f in fields(ModelSpec) if f.metadata.get("arch"))
#: Every Megatron flag an architecture field may write: a tag's `train` block may not set them.
ARCHITECTURE_FLAGS = frozenset({"group-query-attention", "num-query-groups", "swiglu", "normalization",
                                "position-embedding-type", "rotary-base", "disable-bias-linear",
                                "untie-embeddings-and-output-weights", "kv-channels", "qk-layernorm",
                                "softmax-type", "window-size", "window-attn-skip-freq", "multi-latent-attention",
                                "q-lora-rank", "kv-lora-rank", "qk-head-dim", "qk-pos-emb-head-dim", "v-head-dim",
                                "mtp-num-layers", "num-experts", "moe-router-topk", "moe-ffn-hidden-size",
                                "moe-shared-expert-intermediate-size", "moe-layer-freq", "moe-router-score-function",
                                "moe-router-load-balancing-type", "moe-aux-loss-coeff",
                                "moe-router-enable-expert-bias", "moe-expert-capacity-factor",
                                "moe-router-topk-scaling-factor", "moe-router-num-groups", "moe-router-group-topk"})


def from_flags(name: str, flags: Mapping[str, Any], vocab_size: int) -> ModelSpec:
    """The model a set of Megatron flags (names without dashes) trains: the trainer's own view, and that of
    a point kept before models carried their architecture."""
    get = flags.get
    heads = int(get("num-attention-heads"))
    hidden = int(get("hidden-size"))
    return ModelSpec(
        name, int(get("num-layers")), hidden, heads, int(get("ffn-hidden-size") or 4 * hidden),
        int(get("seq-length")), int(get("max-position-embeddings") or get("seq-length")), vocab_size,
        num_query_groups=int(get("num-query-groups")) if get("group-query-attention") else None,
        mlp="swiglu" if get("swiglu") else "gelu", normalization=get("normalization") or "LayerNorm",
        position_embedding_type=get("position-embedding-type") or "learned_absolute",
        rotary_base=int(get("rotary-base") or ROTARY_BASE),
        untie_embeddings=bool(get("untie-embeddings-and-output-weights")),
        bias=not get("disable-bias-linear"),
        kv_channels=int(get("kv-channels")) if get("kv-channels") else None,
        qk_layernorm=bool(get("qk-layernorm")), attention_sinks=get("softmax-type") == "learnable",
        window_size=int(str(get("window-size")).strip("()").split(",")[0]) if get("window-size") else None,
        window_attn_skip_freq=int(get("window-attn-skip-freq")) if get("window-attn-skip-freq") else None,
        moe=_moe_from_flags(get, int(get("num-layers")), int(get("ffn-hidden-size") or 4 * hidden)),
        mla=MLASpec(int(get("q-lora-rank")) if get("q-lora-rank") else None, int(get("kv-lora-rank") or 32),
                    int(get("qk-head-dim") or 128), int(get("qk-pos-emb-head-dim") or 64),
                    int(get("v-head-dim") or 128)) if get("multi-latent-attention") else None,
        mtp_num_layers=int(get("mtp-num-layers") or 0))


def from_record(model: Mapping[str, Any], train: Mapping[str, Any]) -> ModelSpec:
    """The model of a kept point.json: its model block, and where that predates the architecture fields
    (no `mlp` key), the architecture its flags chose."""
    known = {f.name for f in fields(ModelSpec)}
    nested = {"moe": MoESpec, "mla": MLASpec}
    kept = ModelSpec(**{k: nested[k](**v) if k in nested and v is not None else v
                        for k, v in model.items() if k in known})
    if "mlp" in model:
        return kept
    flags = {**train, **{name.replace("_", "-"): getattr(kept, name) for name in SHAPE}}
    return replace(from_flags(kept.name, flags, kept.vocab_size), nominal_billions=kept.nominal_billions)


def pad_vocab(vocab_size: int, tensor_parallel: int, divisible_by: int = 128) -> int:
    """Megatron pads the vocabulary to a multiple of divisible_by x TP so every TP shard is equal."""
    multiple = divisible_by * tensor_parallel
    return -(-vocab_size // multiple) * multiple


_GPT3 = "GPT-3 family shape (Brown et al. 2020, Table 2.1); the JUPITER benchmark's models"
_LLAMA3 = dict(vocab_size=LLAMA3_VOCAB, mlp="swiglu", normalization="RMSNorm", position_embedding_type="rope",
               rotary_base=500000, untie_embeddings=True, bias=False)
_LLAMA3_SOURCE = ("The Llama 3 Herd of Models (arXiv:2407.21783), Table 3; vocabulary and rope base from "
                  "meta-llama/{} config.json")

_MIXTRAL = ("Mixtral of Experts (arXiv:2401.04088); https://huggingface.co/mistralai/Mixtral-8x7B-v0.1 "
            "(config.json; 46.7B total, 12.9B active)")
_QWEN3 = ("Qwen3 Technical Report (arXiv:2505.09388); https://huggingface.co/Qwen/Qwen3-30B-A3B (config.json, "
          "model card: 30.5B total, 3.3B activated)")
_GPT_OSS = ("gpt-oss-120b & gpt-oss-20b Model Card (arXiv:2508.10925); https://huggingface.co/openai/gpt-oss-20b "
            "config.json: 21B total, 3.6B active (input embedding not counted); its SwiGLU is clamped and YaRN "
            "scales its rope, neither of which changes the parameters or FLOPs")
_DEEPSEEK_V3 = ("DeepSeek-V3 Technical Report (arXiv:2412.19437); https://huggingface.co/deepseek-ai/DeepSeek-V3 "
                "config.json: 671B total and 37B activated without the MTP module (input embedding not counted); "
                "sequence-wise balance loss 0.0001 (the paper's)")

PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("gpt-tiny", 2, 128, 4, 512, 128, 128, nominal_billions=None,
                  source="a GPT-shaped model small enough for CPU tests"),
        ModelSpec("gpt-125m", 12, 768, 12, 3072, 2048, 2048, nominal_billions=0.125, source=_GPT3),
        ModelSpec("gpt-1.3b", 24, 2048, 16, 8192, 2048, 2048, nominal_billions=1.3, source=_GPT3),
        ModelSpec("gpt-13b", 40, 5120, 32, 20480, 2048, 2048, nominal_billions=13, source=_GPT3),
        ModelSpec("gpt-175b", 96, 12288, 96, 4 * 12288, 2048, 2048, nominal_billions=175, source=_GPT3),
        ModelSpec("llama-tiny", 2, 128, 4, 352, 128, 128, **{**_LLAMA3, "vocab_size": 32000}, num_query_groups=2,
                  source="a Llama-shaped model (GQA with fewer groups than heads) small enough for CPU tests"),
        ModelSpec("llama3-8b", 32, 4096, 32, 14336, 8192, 8192, **_LLAMA3, num_query_groups=8, nominal_billions=8,
                  source=_LLAMA3_SOURCE.format("Meta-Llama-3-8B")),
        ModelSpec("llama3-70b", 80, 8192, 64, 28672, 8192, 8192, **_LLAMA3, num_query_groups=8,
                  nominal_billions=70, source=_LLAMA3_SOURCE.format("Meta-Llama-3-70B")),
        ModelSpec("llama3.1-405b", 126, 16384, 128, 53248, 8192, 131072, **_LLAMA3, num_query_groups=8,
                  nominal_billions=405, source=_LLAMA3_SOURCE.format("Llama-3.1-405B")),
        ModelSpec("moe-tiny", 4, 64, 4, 128, 128, 128, **{**_LLAMA3, "vocab_size": 32000}, num_query_groups=2,
                  moe=MoESpec(4, 2, 128, aux_loss_coeff=0.01),
                  source="a Mixtral-shaped model (4 experts, top-2, every layer) small enough for CPU tests"),
        ModelSpec("mixtral-8x7b", 32, 4096, 32, 14336, 4096, 32768, **{**_LLAMA3, "vocab_size": 32000, "rotary_base": 1000000},
                  num_query_groups=8, moe=MoESpec(8, 2, 14336, aux_loss_coeff=0.02),
                  nominal_billions=46.7, source=_MIXTRAL),
        ModelSpec("qwen3-30b-a3b", 48, 2048, 32, 6144, 4096, 40960, **{**_LLAMA3, "vocab_size": 151936, "rotary_base": 1000000},
                  num_query_groups=4, kv_channels=128, qk_layernorm=True,
                  moe=MoESpec(128, 8, 768, aux_loss_coeff=0.001), nominal_billions=30.5,
                  source=_QWEN3),
        ModelSpec("gpt-oss-20b", 24, 2880, 64, 2880, 4096, 131072, **{**_LLAMA3, "vocab_size": 201088, "bias": True,
                                                                      "rotary_base": 150000},
                  num_query_groups=8, kv_channels=64, attention_sinks=True, window_size=128, window_attn_skip_freq=2,
                  moe=MoESpec(32, 4, 2880, aux_loss_coeff=0.9), nominal_billions=21,
                  source=_GPT_OSS),
        ModelSpec("deepseek-v3", 61, 7168, 128, 18432, 4096, 163840, **{**_LLAMA3, "vocab_size": 129280, "rotary_base": ROTARY_BASE},
                  mla=MLASpec(1536, 512, 128, 64, 128),
                  moe=MoESpec(256, 8, 2048, shared_expert_intermediate_size=2048, first_k_dense=3,
                              router_score="sigmoid", aux_loss_coeff=0.0001, expert_bias=True,
                              load_balancing="seq_aux_loss", topk_scaling_factor=2.5, num_groups=8, group_topk=4),
                  mtp_num_layers=1, nominal_billions=671, source=_DEEPSEEK_V3),
    )
}

_INTEGERS = {*SHAPE, "vocab_size", "num_query_groups", "rotary_base"}
_CHOICES = {"mlp": MLPS, "normalization": NORMS, "position_embedding_type": POSITIONS}
_TRUE_OR_FALSE = {"untie_embeddings", "bias"}
FIELDS = _INTEGERS | set(_CHOICES) | _TRUE_OR_FALSE


def check_field(key: str, value: Any) -> str | None:
    """Why `value` cannot be model field `key`, or None."""
    if key not in FIELDS:
        return f"unknown model field {key}; known: {', '.join(sorted(FIELDS))}"
    if key in _CHOICES:
        return None if value in _CHOICES[key] else f"model field {key} must be one of {', '.join(_CHOICES[key])}, got {value!r}"
    if key in _TRUE_OR_FALSE:
        return None if isinstance(value, bool) else f"model field {key} must be true or false, got {value!r}"
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        return f"model field {key} must be a positive integer, got {value!r}"
    return None


def get_model(name: str, **overrides: Any) -> ModelSpec:
    """A preset by name, with optional overrides of its shape or architecture (e.g. seq_length, mlp)."""
    if name not in PRESETS:
        raise SpecError(unknown("model preset", name, PRESETS))
    for key, value in overrides.items():
        if why := check_field(key, value):
            raise SpecError(why)
    model = replace(PRESETS[name], **overrides) if overrides else PRESETS[name]
    groups = model.query_groups
    if model.num_attention_heads % groups:
        raise SpecError(f"model {name}: {model.num_attention_heads} attention heads do not split into "
                        f"{groups} query groups")
    return model
