"""Parallel layout: every parallel size of a point, the sizes that follow from them (dp, expert dp), and
in words why a layout fails.

The one home of parallel arithmetic: a product or quotient of parallel sizes (tp x pp, world / (tp x cp x
pp), pp x vp) is written here and nowhere else (tests/test_boundaries.py checks it). Megatron-LM's grid,
from the innermost axis out: tp, cp, dp, pp for the dense layers; for the experts of an MoE layer etp, ep,
expert dp, pp over the same devices."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import NamedTuple

from nlp_bench.errors import LayoutError
from nlp_bench.spec.models import ModelSpec


def replica_devices(tp: int, pp: int, cp: int = 1) -> int:
    """The devices one model replica spans: tp x cp x pp."""
    return tp * cp * pp


def data_parallel_size(world: int, tp: int, pp: int, cp: int = 1) -> int:
    """The data-parallel replicas of a tp x cp x pp model on `world` devices: the one place dp is worked out
    (meaningful where the replica divides the world, which parallel_violations checks)."""
    return world // replica_devices(tp, pp, cp)


def expert_data_parallel_size(world: int, etp: int, ep: int, pp: int) -> int:
    """The replicas of each expert: what expert tp x ep x pp leaves of the world (Megatron-core's expert
    data-parallel group); the other home of a quotient of sizes."""
    return world // (etp * ep * pp)


def expert_grid(world: int, pp: int, etp: int, ep: int) -> dict[str, list[list[int]]]:
    """Megatron-core's expert grid as lists of global ranks: the ranks of each pipeline stage (tp x cp x dp of
    them, in their dense order) laid out anew with expert tp fastest, then ep, then expert dp. `etp`: the
    ranks that split each expert's matrices; `ep`: the ranks the experts are spread over; `tp_ep`: both (one
    whole copy of every expert); `edp`: the ranks that hold the same expert shard (their gradients are summed)."""
    stage = world // pp
    edp = stage // (etp * ep)
    grid: dict[str, list[list[int]]] = {"etp": [], "ep": [], "tp_ep": [], "edp": []}
    for p in range(pp):
        def rank(t: int, e: int, d: int, base: int = p * stage) -> int:
            return base + t + etp * (e + ep * d)
        grid["etp"] += [[rank(t, e, d) for t in range(etp)] for d in range(edp) for e in range(ep)]
        grid["ep"] += [[rank(t, e, d) for e in range(ep)] for d in range(edp) for t in range(etp)]
        grid["tp_ep"] += [[rank(t, e, d) for e in range(ep) for t in range(etp)] for d in range(edp)]
        grid["edp"] += [[rank(t, e, d) for d in range(edp)] for e in range(ep) for t in range(etp)]
    return grid


def virtual_stages(pp: int, vp: int) -> int:
    """Model chunks over the whole pipeline: pp ranks holding vp chunks each."""
    return pp * vp


def grid_rank(tp_rank: int, dp_rank: int, pp_rank: int, tp: int, dp: int) -> int:
    """The global rank at these coordinates of the tp x dp x pp grid, tp innermost, then dp, then pp (Megatron's
    order)."""
    return tp_rank + tp * (dp_rank + dp * pp_rank)


def tiles(world: int, tp: int, pp: int, cp: int = 1) -> bool:
    """Whether whole tp x cp x pp replicas fill the world."""
    return world % replica_devices(tp, pp, cp) == 0


def samples_per_step(dp: int, mbs: int) -> int:
    """The samples one accumulation step takes over all replicas: dp x mbs."""
    return dp * mbs


@dataclass(frozen=True)
class Layout:
    """How a model is spread over an allocation: Megatron's tp x cp x pp x dp grid, interleaving (vp), an
    uneven pipeline, and the expert axes of an MoE model (ep, expert tp; expert dp follows)."""

    nodes: int
    devices_per_node: int
    tp: int
    pp: int
    mbs: int
    gas: int
    #: context parallelism: each rank of a cp group holds 1/cp of every sequence
    cp: int = 1
    #: model chunks per pipeline rank (interleaved 1F1B when > 1)
    vp: int = 1
    #: expert parallelism: the experts of an MoE layer spread over ep ranks
    ep: int = 1
    #: the experts' own tensor parallelism (Megatron's --expert-tensor-parallel-size; None: tp, its default)
    etp: int | None = None
    #: Megatron's --decoder-first-pipeline-num-layers and --decoder-last-pipeline-num-layers (uneven stages)
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None

    @property
    def world(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def dp(self) -> int:
        return data_parallel_size(self.world, self.tp, self.pp, self.cp)

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def edp(self) -> int:
        """Expert data parallelism: the ranks that hold the same expert weights."""
        return expert_data_parallel_size(self.world, self.expert_tp, self.ep, self.pp)

    @property
    def expert_shards(self) -> int:
        """The ranks one whole copy of every expert spans: expert tp x ep (Megatron-core's tp_ep group)."""
        return self.expert_tp * self.ep

    @property
    def routed_share(self) -> float:
        """The share of one micro-batch's routed token copies that each rank's experts compute: a tp x cp
        group holds the micro-batch, its copies spread over ep ranks and each is multiplied whole on every
        rank of its expert tp group, so expert tp / (tp x cp) of them (balanced routing)."""
        return self.expert_tp / self.tp_cp

    @property
    def ep_in_node(self) -> int:
        """The ranks of an ep group that share a node: expert tp is innermost, so a node holds
        devices_per_node / expert tp of them (all of them where expert tp x ep fits in it)."""
        return max(1, min(self.ep, self.devices_per_node // self.expert_tp))

    @property
    def ep_shares(self) -> tuple[float, float]:
        """(to ep peers in the node, to ep peers in other nodes): the shares of a rank's routed copies an
        all-to-all sends, with balanced routing ((ep - 1)/ep of them leave the rank)."""
        inside = self.ep_in_node
        return (inside - 1) / self.ep, (self.ep - inside) / self.ep

    @property
    def weight_replicas(self) -> int:
        """The ranks that hold the same (dense) weights, over which gradients are reduced and the distributed
        optimizer shards its states (Megatron's data-parallel group with context parallelism): dp x cp."""
        return self.dp * self.cp

    @property
    def tp_cp(self) -> int:
        """The ranks one layer's work of a micro-batch is split over: tp x cp."""
        return self.tp * self.cp

    @property
    def stage_devices(self) -> int:
        """The devices of one pipeline stage over all replicas: tp x cp x dp (world / pp)."""
        return self.tp_cp * self.dp

    @property
    def replica(self) -> int:
        """The devices one model replica spans: tp x cp x pp."""
        return replica_devices(self.tp, self.pp, self.cp)

    @property
    def virtual_stages(self) -> int:
        return virtual_stages(self.pp, self.vp)

    @property
    def bubble_slots(self) -> float:
        """The pipeline bubble in micro-batch slots: (pp - 1) / vp."""
        return (self.pp - 1) / self.vp

    @property
    def interleaving_extra(self) -> float:
        """The share of micro-batches beyond pp that an interleaved first stage holds in flight (Megatron's
        interleaving penalty, (pp - 1) / (pp x vp)); 0 without interleaving."""
        return (self.pp - 1) / self.virtual_stages if self.vp > 1 else 0.0

    @property
    def global_batch_size(self) -> int:
        return samples_per_step(self.dp, self.mbs) * self.gas

    def steps_for(self, global_batch_size: int) -> int | None:
        """The gradient-accumulation steps that make `global_batch_size` on this layout (its own gas aside);
        None where the replicas do not tile the world or dp x mbs does not divide the batch."""
        if not tiles(self.world, self.tp, self.pp, self.cp):
            return None
        step = samples_per_step(self.dp, self.mbs)
        return global_batch_size // step if global_batch_size % step == 0 else None

    def stage_layers(self, num_layers: int) -> tuple[float, float, float]:
        """The transformer layers of the first, each middle and the last pipeline stage: the first and last
        as given, the rest split evenly over the stages between (Megatron's uneven pipeline); without them
        L/pp each (a published layout whose pp does not divide L, as Megatron-DeepSpeed ran BLOOM, counts
        the average stage). With one stage, all three are that stage."""
        if self.first_stage_layers is None and self.last_stage_layers is None or self.pp == 1:
            even = num_layers / self.pp
            return even, even, even
        given = [n for n in (self.first_stage_layers, self.last_stage_layers) if n is not None]
        others = self.pp - len(given)
        middle = (num_layers - sum(given)) / others if others else 0.0
        first = self.first_stage_layers if self.first_stage_layers is not None else middle
        last = self.last_stage_layers if self.last_stage_layers is not None else middle
        return first, middle, last

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(world=self.world, dp=self.dp, global_batch_size=self.global_batch_size)
        if self.ep > 1 or self.etp is not None:
            d.update(expert_tp=self.expert_tp, edp=self.edp)
        return d


#: the parallel sizes a Layout is given (the rest follow from them)
LAYOUT_FIELDS = tuple(f.name for f in fields(Layout))


def replica_problem(nodes: int, devices_per_node: int, tp: int, pp: int, cp: int = 1) -> tuple[str, str] | None:
    """Why tp x pp replicas cannot tile the allocation, as (a rule, the reason in the user's words); None
    when they can. The sweep checks it before any derived value is computed from dp (a division by zero
    otherwise), the planner to say why a space holds no layout."""
    world, replica = nodes * devices_per_node, replica_devices(tp, pp, cp)
    sizes = f"tp {tp} x pp {pp}" if cp == 1 else f"tp {tp} x cp {cp} x pp {pp}"
    if replica > world:
        return "replica larger than the allocation", (f"{sizes} = {replica} devices per replica, more "
                                                      f"than the {world} that {nodes} node(s) have")
    if not tiles(world, tp, pp, cp):
        return "tp x pp does not divide the devices", (f"{sizes} = {replica} does not divide the {world} "
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
    "cp-seq": "the sequence does not split into 2 x cp chunks",
    "uneven-layers": "the uneven stages' layers do not add up", "uneven-vp": "uneven stages with interleaving",
    "ep-world": "expert tp x ep x pp does not divide the devices", "ep-experts": "ep does not divide the experts",
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
                        num_query_groups: int | None = None, cp: int = 1, first_stage_layers: int | None = None,
                        last_stage_layers: int | None = None, ep: int = 1, etp: int | None = None,
                        num_experts: int | None = None) -> list[Violation]:
    """Every rule of Megatron's tp x cp x pp x dp layout (and, for MoE, etp x ep x pp) that these sizes break;
    empty when they can run.

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

    replica = replica_devices(tp, pp, cp)
    if cp == 1:
        need(tiles(world, tp, pp), "tp-pp-world", lambda: f"tp x pp = {replica} must divide the {world} {devices}")
    else:
        need(tiles(world, tp, pp, cp), "tp-pp-world", lambda:
             f"tp {tp} x cp {cp} x pp {pp} does not divide the {world} devices")
        if seq_length is not None:
            need(seq_length % (2 * cp) == 0, "cp-seq", lambda: f"sequence {seq_length} does not split into 2 x cp {cp} "
                                                                "chunks (Megatron's load-balanced context parallelism)")
    need(num_attention_heads % tp == 0, "tp-heads", lambda:
         f"tp {tp} must divide the number of attention heads {num_attention_heads} "
         "(--tensor-model-parallel-size, --num-attention-heads)")
    if num_query_groups is not None:
        need(num_query_groups % tp == 0 or tp % num_query_groups == 0, "tp-groups", lambda:
             f"tp {tp} must divide the {num_query_groups} query groups or be a multiple of them "
             "(--tensor-model-parallel-size, --num-query-groups)")
    need(ffn_hidden_size % tp == 0, "tp-ffn", lambda: f"tp {tp} must divide the MLP width {ffn_hidden_size} (--ffn-hidden-size)")
    uneven = first_stage_layers is not None or last_stage_layers is not None
    if uneven:
        out.extend(_uneven_violations(num_layers, pp, chunks, first_stage_layers, last_stage_layers))
    else:
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
    if ep > 1 or etp is not None:
        out.extend(expert_violations(world, tp if etp is None else etp, ep, pp, num_experts))
    interleaved = _interleaving(need, num_layers, pp, chunks, layers_per_chunk, uneven)
    dp = data_parallel_size(world, tp, pp, cp) if tiles(world, tp, pp, cp) else None
    if dp is not None and global_batch_size is not None and micro_batch_size is not None:
        step = samples_per_step(dp, micro_batch_size)
        need(global_batch_size % step == 0, "gbs-mbs-dp", lambda:
             f"the global batch {global_batch_size} must be a multiple of mbs x dp = {micro_batch_size} x {dp} "
             "(--global-batch-size, --micro-batch-size)")
        if global_batch_size % step == 0:
            micro_batches = global_batch_size // step
    if interleaved and pp > 1 and micro_batches is not None:
        need(micro_batches % pp == 0, "vp-microbatches", lambda:
             f"the interleaved schedule needs the micro-batches per iteration ({micro_batches}) to be a multiple "
             f"of pp {pp}")
    return out


def _interleaving(need, num_layers: int, pp: int, chunks: int, layers_per_chunk: int | None, uneven: bool) -> bool:
    """Interleaving's rules; whether the schedule interleaves."""
    if layers_per_chunk is not None:
        need(layers_per_chunk >= 1, "vp-size", lambda: "--num-layers-per-virtual-pipeline-stage must be at least 1")
        if layers_per_chunk >= 1:
            stages = virtual_stages(pp, layers_per_chunk)
            need(num_layers % stages == 0, "vp-layers", lambda:
                 f"the number of layers {num_layers} must be a multiple of pp x layers per virtual stage = "
                 f"{stages} (--num-layers-per-virtual-pipeline-stage)")
            chunks = num_layers // stages if num_layers % stages == 0 else 0
            need(chunks != 1, "vp-chunks", lambda: "the interleaved schedule needs at least 2 model chunks per rank "
                                           "(layers / (pp x --num-layers-per-virtual-pipeline-stage) > 1)")
    interleaved = layers_per_chunk is not None or chunks > 1
    if interleaved:
        need(pp > 1, "vp-pp", lambda: "interleaving (--num-layers-per-virtual-pipeline-stage) needs pp > 1")
        if layers_per_chunk is None and not uneven:
            need(num_layers % virtual_stages(pp, chunks) == 0, "vp-layers", lambda:
                 f"interleaving (vp {chunks}) needs pp x vp = {virtual_stages(pp, chunks)} to divide the "
                 f"{num_layers} layers")
    return interleaved


def _uneven_violations(num_layers: int, pp: int, chunks: int, first: int | None, last: int | None) -> list[Violation]:
    """An uneven pipeline's rules (Megatron's --decoder-first/last-pipeline-num-layers): the stages between
    split what the first and last leave evenly."""
    given = [n for n in (first, last) if n is not None]
    others, rest = pp - len(given), num_layers - sum(given)
    if pp < 2 or (pp == 2 and len(given) == 2 and rest) or others < 0:
        return [Violation("uneven-layers", f"uneven stages need pp >= 2 and the given stages' layers to add up to "
                                           f"{num_layers}")]
    if rest < (1 if others else 0) or (others and rest % others):
        return [Violation("uneven-layers", f"the {rest} layers left by the first/last stages do not split evenly "
                                           f"over the other {others} stages")]
    if chunks > 1:
        return [Violation("uneven-vp", "uneven stages with interleaving (vp > 1) are not modelled")]
    return []


def expert_violations(world: int, etp: int, ep: int, pp: int, num_experts: int | None) -> list[Violation]:
    """The expert grid's rules: etp x ep x pp must tile the world (Megatron-core's expert grid; with whole
    stages, etp x ep must divide the tp x cp x dp ranks of each), and ep must divide the experts."""
    out = []
    if world % (etp * ep * pp):
        stage = f" ({world // pp} per pipeline stage, tp x cp x dp)" if pp > 1 and world % pp == 0 else ""
        out.append(Violation("ep-world", f"expert tp {etp} x ep {ep} x pp {pp} does not divide the {world} devices"
                                         f"{stage} (--expert-tensor-parallel-size, --expert-model-parallel-size)"))
    if num_experts is not None and num_experts % ep:
        out.append(Violation("ep-experts", f"ep {ep} must divide the {num_experts} experts (--num-experts, "
                                           "--expert-model-parallel-size)"))
    elif num_experts is None and ep > 1:
        out.append(Violation("ep-experts", f"expert parallelism (ep {ep}) needs a model with experts"))
    return out


def problems(model: ModelSpec, layout: Layout, sequence_parallel: bool = False) -> list[str]:
    """Every reason the layout cannot run this model; empty when it can."""
    return [v.message for v in violations(model, layout, sequence_parallel)]


def violations(model: ModelSpec, layout: Layout, sequence_parallel: bool = False) -> list[Violation]:
    """problems(), with the name of each rule."""
    out: list[Violation] = []
    for name in ("nodes", "devices_per_node", "tp", "pp", "mbs", "gas", "cp", "vp", "ep", "etp", "first_stage_layers",
                 "last_stage_layers"):
        value = getattr(layout, name)
        if value is None and name in ("etp", "first_stage_layers", "last_stage_layers"):
            continue
        least = 0 if name.endswith("stage_layers") else 1  # a last stage may hold the output layer alone
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            out.append(Violation("positive", f"{name} must be {'a positive integer' if least else 'a whole number'}, got {value!r}"))
    if out:
        return out
    return parallel_violations(
        world=layout.world, tp=layout.tp, pp=layout.pp, num_layers=model.num_layers,
        num_attention_heads=model.num_attention_heads, ffn_hidden_size=model.ffn_hidden_size,
        hidden_size=model.hidden_size, seq_length=model.seq_length, sequence_parallel=sequence_parallel,
        chunks=layout.vp, micro_batches=layout.gas, num_query_groups=model.num_query_groups,
        devices=f"devices ({layout.nodes} nodes x {layout.devices_per_node})", cp=layout.cp,
        first_stage_layers=layout.first_stage_layers, last_stage_layers=layout.last_stage_layers, ep=layout.ep,
        etp=layout.etp, num_experts=model.moe.num_experts if model.moe else None)


def valid_layout(model: ModelSpec, layout: Layout) -> Layout:
    """The layout, or a LayoutError that lists every problem."""
    found = problems(model, layout)
    if found:
        raise LayoutError(f"impossible layout for {model.name}: " + "; ".join(found))
    return layout

