"""Parallel layout: derive the data-parallel size and global batch, and say in words why a layout fails."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple

from nlp_bench.errors import LayoutError
from nlp_bench.spec.models import ModelSpec


def data_parallel_size(world: int, tp: int, pp: int) -> int:
    """The data-parallel replicas of a tp x pp model on `world` devices: the one place dp is worked out
    (meaningful where tp x pp divides the world, which parallel_violations checks)."""
    return world // (tp * pp)


@dataclass(frozen=True)
class Layout:
    """How a model is spread over an allocation (Megatron's tp x pp x dp grid)."""

    nodes: int
    devices_per_node: int
    tp: int
    pp: int
    mbs: int
    gas: int

    @property
    def world(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def dp(self) -> int:
        return data_parallel_size(self.world, self.tp, self.pp)

    @property
    def global_batch_size(self) -> int:
        return self.dp * self.mbs * self.gas

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(world=self.world, dp=self.dp, global_batch_size=self.global_batch_size)
        return d


def replica_problem(nodes: int, devices_per_node: int, tp: int, pp: int) -> tuple[str, str] | None:
    """Why tp x pp replicas cannot tile the allocation, as (a rule, the reason in the user's words); None
    when they can. The sweep checks it before any derived value is computed from dp (a division by zero
    otherwise), the planner to say why a space holds no layout."""
    world = nodes * devices_per_node
    if tp * pp > world:
        return "replica larger than the allocation", (f"tp {tp} x pp {pp} = {tp * pp} devices per replica, more "
                                                      f"than the {world} that {nodes} node(s) have")
    if world % (tp * pp):
        return "tp x pp does not divide the devices", (f"tp {tp} x pp {pp} = {tp * pp} does not divide the {world} "
                                                       f"devices of {nodes} node(s) into whole replicas")
    return None


#: what each rule of parallel_violations says, in the words a sweep counts dropped points by
RULE_WORDS = {
    "positive": "a size below 1", "tp-pp-world": "tp x pp does not divide the devices",
    "tp-heads": "tp does not divide the attention heads",
    "tp-groups": "tp neither divides nor is a multiple of the query groups", "tp-ffn": "tp does not divide the MLP width",
    "pp-layers": "pp does not divide the layers", "heads-hidden": "the heads do not divide the hidden size",
    "sp-tp": "sequence parallelism without tp", "sp-seq": "tp does not divide the sequence",
    "vp-size": "fewer than 1 layer per virtual stage", "vp-layers": "pp x vp does not divide the layers",
    "vp-chunks": "fewer than 2 model chunks per rank", "vp-pp": "interleaving without pp",
    "gbs-mbs-dp": "mbs x dp does not divide the global batch", "vp-microbatches": "micro-batches no multiple of pp",
}


class Violation(NamedTuple):
    """One broken rule: `rule` names it (sweeps count dropped points by it), `message` says it with the
    numbers, in the words of both the layout (tp, pp) and Megatron's flags."""

    rule: str
    message: str


def parallel_violations(*, world: int, tp: int, pp: int, num_layers: int, num_attention_heads: int,
                        ffn_hidden_size: int, hidden_size: int | None = None, seq_length: int | None = None,
                        sequence_parallel: bool = False, chunks: int = 1, layers_per_chunk: int | None = None,
                        micro_batches: int | None = None, micro_batch_size: int | None = None,
                        global_batch_size: int | None = None, devices: str = "devices",
                        num_query_groups: int | None = None) -> list[Violation]:
    """Every rule of Megatron's tp x pp x dp layout that these sizes break; empty when they can run.

    The one home of these rules: the spec (a benchmark point), the sweep (a grid point), the planner (a
    candidate) and the trainer (its flags, before any process group exists) all ask this function.
    Interleaving is given as model chunks per pipeline rank (`chunks`, the planner's vp) or as layers
    per chunk (`layers_per_chunk`, Megatron's --num-layers-per-virtual-pipeline-stage)."""
    out: list[Violation] = []

    def need(ok: bool, rule: str, message) -> None:
        """`message` is a function: the words are only made for a rule that is broken (sweeps check
        millions of combinations)."""
        if not ok:
            out.append(Violation(rule, message()))

    need(world % (tp * pp) == 0, "tp-pp-world", lambda: f"tp x pp = {tp * pp} must divide the {world} {devices}")
    need(num_attention_heads % tp == 0, "tp-heads", lambda:
         f"tp {tp} must divide the number of attention heads {num_attention_heads} "
         "(--tensor-model-parallel-size, --num-attention-heads)")
    if num_query_groups is not None:
        need(num_query_groups % tp == 0 or tp % num_query_groups == 0, "tp-groups", lambda:
             f"tp {tp} must divide the {num_query_groups} query groups or be a multiple of them "
             "(--tensor-model-parallel-size, --num-query-groups)")
    need(ffn_hidden_size % tp == 0, "tp-ffn", lambda: f"tp {tp} must divide the MLP width {ffn_hidden_size} (--ffn-hidden-size)")
    need(num_layers % pp == 0, "pp-layers", lambda:
         f"pp {pp} must divide the number of layers {num_layers} (--pipeline-model-parallel-size, --num-layers)")
    if hidden_size is not None:
        need(hidden_size % num_attention_heads == 0, "heads-hidden", lambda:
             f"the number of attention heads {num_attention_heads} must divide the hidden size {hidden_size}")
    if sequence_parallel:
        need(tp > 1, "sp-tp", lambda: "sequence parallelism (--sequence-parallel) needs tp > 1")
        if seq_length is not None:
            need(seq_length % tp == 0, "sp-seq", lambda: f"sequence parallelism needs tp {tp} to divide the sequence "
                                                 f"length {seq_length}")
    if layers_per_chunk is not None:
        need(layers_per_chunk >= 1, "vp-size", lambda: "--num-layers-per-virtual-pipeline-stage must be at least 1")
        if layers_per_chunk >= 1:
            need(num_layers % (pp * layers_per_chunk) == 0, "vp-layers", lambda:
                 f"the number of layers {num_layers} must be a multiple of pp x layers per virtual stage = "
                 f"{pp * layers_per_chunk} (--num-layers-per-virtual-pipeline-stage)")
            chunks = num_layers // (pp * layers_per_chunk) if num_layers % (pp * layers_per_chunk) == 0 else 0
            need(chunks != 1, "vp-chunks", lambda: "the interleaved schedule needs at least 2 model chunks per rank "
                                           "(layers / (pp x --num-layers-per-virtual-pipeline-stage) > 1)")
    interleaved = layers_per_chunk is not None or chunks > 1
    if interleaved:
        need(pp > 1, "vp-pp", lambda: "interleaving (--num-layers-per-virtual-pipeline-stage) needs pp > 1")
        if layers_per_chunk is None:
            need(num_layers % (pp * chunks) == 0, "vp-layers", lambda:
                 f"interleaving (vp {chunks}) needs pp x vp = {pp * chunks} to divide the {num_layers} layers")
    dp = data_parallel_size(world, tp, pp) if world % (tp * pp) == 0 else None
    if dp is not None and global_batch_size is not None and micro_batch_size is not None:
        need(global_batch_size % (micro_batch_size * dp) == 0, "gbs-mbs-dp", lambda:
             f"the global batch {global_batch_size} must be a multiple of mbs x dp = {micro_batch_size} x {dp} "
             "(--global-batch-size, --micro-batch-size)")
        if global_batch_size % (micro_batch_size * dp) == 0:
            micro_batches = global_batch_size // (micro_batch_size * dp)
    if interleaved and pp > 1 and micro_batches is not None:
        need(micro_batches % pp == 0, "vp-microbatches", lambda:
             f"the interleaved schedule needs the micro-batches per iteration ({micro_batches}) to be a multiple "
             f"of pp {pp}")
    return out


def problems(model: ModelSpec, layout: Layout, chunks: int = 1, sequence_parallel: bool = False) -> list[str]:
    """Every reason the layout cannot run this model; empty when it can."""
    return [v.message for v in violations(model, layout, chunks, sequence_parallel)]


def violations(model: ModelSpec, layout: Layout, chunks: int = 1, sequence_parallel: bool = False) -> list[Violation]:
    """problems(), with the name of each rule."""
    out: list[Violation] = []
    for name in ("nodes", "devices_per_node", "tp", "pp", "mbs", "gas"):
        value = getattr(layout, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            out.append(Violation("positive", f"{name} must be a positive integer, got {value!r}"))
    if out:
        return out
    return parallel_violations(
        world=layout.world, tp=layout.tp, pp=layout.pp, num_layers=model.num_layers,
        num_attention_heads=model.num_attention_heads, ffn_hidden_size=model.ffn_hidden_size,
        hidden_size=model.hidden_size, seq_length=model.seq_length, sequence_parallel=sequence_parallel,
        chunks=chunks, micro_batches=layout.gas, num_query_groups=model.num_query_groups,
        devices=f"devices ({layout.nodes} nodes x {layout.devices_per_node})")


def validate(model: ModelSpec, layout: Layout) -> Layout:
    """The layout, or a LayoutError that lists every problem."""
    found = problems(model, layout)
    if found:
        raise LayoutError(f"impossible layout for {model.name}: " + "; ".join(found))
    return layout

