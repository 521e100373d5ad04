"""GPT model presets and Megatron's vocabulary padding."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

from nlp_bench import flops
from nlp_bench.errors import SpecError, unknown

#: GPT-2 BPE vocabulary size (gpt2-vocab.json holds this many entries).
GPT2_VOCAB = 50257


#: marks the fields that make the transformer's shape (Megatron's flags of the same names)
_SHAPE = {"shape": True}


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only GPT shape, in Megatron's terms."""

    name: str
    num_layers: int = field(metadata=_SHAPE)
    hidden_size: int = field(metadata=_SHAPE)
    num_attention_heads: int = field(metadata=_SHAPE)
    ffn_hidden_size: int = field(metadata=_SHAPE)
    seq_length: int = field(metadata=_SHAPE)
    max_position_embeddings: int = field(metadata=_SHAPE)
    vocab_size: int = GPT2_VOCAB
    #: The size the benchmark names the model by, in billions of parameters (the table's Model_Size).
    nominal_billions: float | None = None

    def parameters(self, vocab_padded: int) -> int:
        """Parameter count with tied embeddings and learned-free (rope) positions, biases included."""
        h, f, n = self.hidden_size, self.ffn_hidden_size, self.num_layers
        per_layer = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h  # attention, MLP, two LayerNorms
        return n * per_layer + vocab_padded * h + 2 * h

    def size_billions(self, vocab_padded: int) -> float:
        if self.nominal_billions is not None:
            return self.nominal_billions
        return round(self.parameters(vocab_padded) / 1e9, 3)

    def to_dict(self) -> dict:
        return asdict(self)

    def flops_shape(self, global_batch: int, vocab_padded: int, swiglu: bool = False,
                    recompute: bool = False) -> flops.Shape:
        """What the FLOPs conventions need of this model for one step of `global_batch` sequences."""
        return flops.Shape(global_batch, self.seq_length, self.num_layers, self.hidden_size, vocab_padded,
                           self.ffn_hidden_size, swiglu, recompute)


#: The shape fields, in order: the one list the sweep's model parameters and the trainer's GPTConfig
#: take their names from.
SHAPE = tuple(f.name for f in fields(ModelSpec) if f.metadata.get("shape"))


def pad_vocab(vocab_size: int, tensor_parallel: int, divisible_by: int = 128) -> int:
    """Megatron pads the vocabulary to a multiple of divisible_by x TP so every TP shard is equal."""
    multiple = divisible_by * tensor_parallel
    return -(-vocab_size // multiple) * multiple


PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("gpt-tiny", 2, 128, 4, 512, 128, 128, nominal_billions=None),
        ModelSpec("gpt-125m", 12, 768, 12, 3072, 2048, 2048, nominal_billions=0.125),
        ModelSpec("gpt-1.3b", 24, 2048, 16, 8192, 2048, 2048, nominal_billions=1.3),
        ModelSpec("gpt-13b", 40, 5120, 32, 20480, 2048, 2048, nominal_billions=13),
        ModelSpec("gpt-175b", 96, 12288, 96, 4 * 12288, 2048, 2048, nominal_billions=175),
    )
}

_FIELDS = {*SHAPE, "vocab_size"}


def get_model(name: str, **overrides: int) -> ModelSpec:
    """A preset by name, with optional shape overrides (e.g. seq_length)."""
    if name not in PRESETS:
        raise SpecError(unknown("model preset", name, PRESETS))
    bad = set(overrides) - _FIELDS
    if bad:
        raise SpecError(f"unknown model field(s) {', '.join(sorted(bad))}; known: {', '.join(sorted(_FIELDS))}")
    for key, value in overrides.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SpecError(f"model field {key} must be a positive integer, got {value!r}")
    return replace(PRESETS[name], **overrides) if overrides else PRESETS[name]
