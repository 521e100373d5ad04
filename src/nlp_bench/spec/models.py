"""Model presets: one definition of a decoder-only transformer that the trainer's flags, the FLOPs, the
planner's memory and the rules read, and Megatron's vocabulary padding.

A ModelSpec says everything that changes the parameters or the arithmetic: the sizes, the query groups of
grouped-query attention, the MLP (GeLU or SwiGLU), the norm, the positions (learned or rotary with its base),
tied or untied output weights, biases, the vocabulary. `megatron_flags` writes it as Megatron-LM's flags and
`from_flags` reads it back from them, so a point's flags and its model cannot disagree.
"""

from __future__ import annotations

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
        return self.hidden_size // self.num_attention_heads

    def linear_weights(self) -> int:
        """One transformer layer's weight matrices: query, key/value and output projections, the MLP (what FP8
        recipes run and may keep in FP8)."""
        h, f = self.hidden_size, self.ffn_hidden_size
        return h * h + h * 2 * self.query_groups * self.head_dim + h * h + (3 if self.swiglu else 2) * h * f

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
        """All parameters: the layers, the final norm, the word embedding (twice when untied), learned
        positions where there are any."""
        h = self.hidden_size
        final_norm = h if self.normalization == "RMSNorm" else 2 * h
        embeddings = vocab_padded * h * (2 if self.untie_embeddings else 1)
        positions = self.max_position_embeddings * h if self.position_embedding_type == "learned_absolute" else 0
        return self.num_layers * self.layer_parameters() + final_norm + embeddings + positions

    def size_billions(self, vocab_padded: int) -> float:
        if self.nominal_billions is not None:
            return self.nominal_billions
        return round(self.parameters(vocab_padded) / 1e9, 3)

    def to_dict(self) -> dict:
        return asdict(self)

    def flops_shape(self, global_batch: int, vocab_padded: int, recompute: bool = False) -> flops.Shape:
        """What the FLOPs conventions need of this model for one step of `global_batch` sequences."""
        return flops.Shape(global_batch, self.seq_length, self.num_layers, self.hidden_size, vocab_padded,
                           self.ffn_hidden_size, self.swiglu, recompute, self.num_attention_heads,
                           self.query_groups)

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
        return out

    def description(self) -> str:
        attention = (f"{self.num_attention_heads} heads" if self.num_query_groups is None
                     else f"{self.num_attention_heads} heads in {self.num_query_groups} query groups")
        rope = f"rope base {self.rotary_base}" if self.position_embedding_type == "rope" else "learned positions"
        return (f"{self.num_layers} layers, hidden {self.hidden_size}, {attention}, ffn {self.ffn_hidden_size} "
                f"({'SwiGLU' if self.swiglu else 'GeLU'}), {self.normalization}, {rope}, "
                f"{'untied' if self.untie_embeddings else 'tied'} embeddings, {'biases' if self.bias else 'no biases'}")


#: The shape fields, in order: the one list the sweep's model parameters and the trainer's GPTConfig
#: take their names from.
SHAPE = tuple(f.name for f in fields(ModelSpec) if f.metadata.get("shape"))
#: The architecture fields, each written as one Megatron flag by ModelSpec.megatron_flags.
ARCHITECTURE = tuple(f.name for f in fields(ModelSpec) if f.metadata.get("arch"))
#: Every Megatron flag an architecture field may write: a tag's `train` block may not set them.
ARCHITECTURE_FLAGS = frozenset({"group-query-attention", "num-query-groups", "swiglu", "normalization",
                                "position-embedding-type", "rotary-base", "disable-bias-linear",
                                "untie-embeddings-and-output-weights"})


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
        bias=not get("disable-bias-linear"))


def from_record(model: Mapping[str, Any], train: Mapping[str, Any]) -> ModelSpec:
    """The model of a kept point.json: its model block, and where that predates the architecture fields
    (no `mlp` key), the architecture its flags chose."""
    known = {f.name for f in fields(ModelSpec)}
    kept = ModelSpec(**{k: v for k, v in model.items() if k in known})
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
