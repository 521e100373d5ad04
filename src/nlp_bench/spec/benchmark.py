"""Benchmark definitions (benchmark/<name>.yaml): tags that fix a model, a system, a layout and the
training flags, resolved into concrete points."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from nlp_bench.errors import LayoutError, SpecError, unknown
from nlp_bench.paths import benchmark_dir
from nlp_bench.spec.batch import DEFAULT_BATCH_RULE, BatchChoice, check_rule, choose
from nlp_bench.spec.layout import Layout, data_parallel_size, tiles, valid_layout, virtual_stages
from nlp_bench.spec.models import ARCHITECTURE_FLAGS, ModelSpec, check_field, get_model, pad_vocab
from nlp_bench.spec.switches import PRECISION_FLAGS, RECOMPUTE, Switches, decode, precision_of, with_settings
from nlp_bench.spec.systems import System, check_sbatch_option, load_system
from nlp_bench.spec.trainers import BUILTIN, MEGATRON_LM, check_trainer
from nlp_bench.spec.yamlio import check_keys, load_yaml

_TOP_KEYS = {"name", "description", "default_tag", "train", "tags"}
_TAG_KEYS = {"description", "model", "model_overrides", "system", "nodes", "tp", "pp", "mbs", "gas", "ep", "etp",
             "train", "sbatch", "fixed", "systems", "trainer", "rules"}
#: what a tag may set differently on one system (`systems: {name: {...}}`): its layout
_PER_SYSTEM_KEYS = {"nodes", "tp", "pp", "mbs", "gas", "ep", "etp"}
#: the layout sizes a caller may override (Benchmark.point), the expert ones (ep, expert tp) among them
FREE_SIZES = ("nodes", "tp", "pp", "mbs", "gas", "ep", "etp")

#: The expert layout's flags: the jobscript passes them where the layout has expert parallelism (ep > 1) or its
#: own expert tp, and leaves them out otherwise, so that a dense point runs on a Megatron-LM without experts.
EXPERT_FLAGS = {"ep": "expert-model-parallel-size", "etp": "expert-tensor-parallel-size"}
#: Flags the jobscript derives from the model and layout; a tag's `train` block may not set them.
DERIVED_FLAGS = {
    "num-layers", "hidden-size", "num-attention-heads", "ffn-hidden-size", "seq-length", "max-position-embeddings",
    "tensor-model-parallel-size", "pipeline-model-parallel-size", "micro-batch-size", "global-batch-size",
    "distributed-backend", *EXPERT_FLAGS.values(),
}
#: Flags the point's train mapping takes from its model (ModelSpec.megatron_flags, and the vocabulary where
#: no tokenizer file gives it); a tag's `train` block may not set them either.
MODEL_FLAGS = ARCHITECTURE_FLAGS | {"vocab-size"}
#: the flags that name a tokenizer's files, which give the vocabulary instead of --vocab-size
_TOKENIZER_FILES = ("vocab-file", "tokenizer-model")


def expert_flags(layout: Layout) -> dict[str, int]:
    """The expert layout as Megatron-LM's flags, as the jobscript passes them: ep where it is above 1, expert tp
    where the layout gives its own (None: Megatron takes tp)."""
    out = {EXPERT_FLAGS["ep"]: layout.ep} if layout.ep > 1 else {}
    if layout.etp is not None:
        out[EXPERT_FLAGS["etp"]] = layout.etp
    return out


def rendered_derived_flags(layout: Layout) -> set[str]:
    """The derived flags a jobscript of this layout passes: all of DERIVED_FLAGS but the expert ones it leaves
    out (a Megatron-LM checkout must have every one it passes)."""
    return (DERIVED_FLAGS - set(EXPERT_FLAGS.values())) | set(expert_flags(layout))


#: What a Megatron-LM point of an MoE model runs its experts with, as NVIDIA's own recipes do (Megatron-LM's
#: examples/mixtral, Megatron-Bridge's performance recipes): one grouped GEMM over a rank's experts instead of a
#: loop of small ones, and the all-to-all token dispatcher that expert parallelism across ranks is built on
#: (Megatron's default, allgather, gathers every token on every rank). A tag's train block may set others.
MOE_MEGATRON_FLAGS: dict[str, Any] = {"moe-grouped-gemm": True, "moe-token-dispatcher-type": "alltoall"}


def model_flags(model: ModelSpec, flags: dict[str, Any]) -> dict[str, Any]:
    """The flags `model` sets: its architecture, and its vocabulary size for a run without tokenizer files
    (mock data, Megatron's NullTokenizer)."""
    out = model.megatron_flags()
    if not any(flags.get(name) for name in _TOKENIZER_FILES):
        out["vocab-size"] = model.vocab_size
    return out


@dataclass(frozen=True)
class Point:
    """One fully resolved benchmark configuration: what a jobscript runs."""

    benchmark: str
    tag: str
    model: ModelSpec
    system: System
    layout: Layout
    #: every training flag the trainer gets beyond the model and layout (with Megatron-LM, the system's
    #: megatron_lm_train too): the same dict in memory and in point.json
    train: dict[str, Any]
    sbatch: dict[str, Any] = field(default_factory=dict)
    #: what a sweep changed beyond the layout (model fields, flags); part of the id when present
    variant: str = ""
    #: the settings the planner ranks (recompute, the distributed optimizer) where they are not the tag's, in
    #: the words of the id (`_rc-none`, `_dist-opt-off`); "" where they are the tag's
    settings: str = ""
    #: the program the jobscript starts (spec.trainers); a point run by Megatron-LM says so in its id
    trainer: str = BUILTIN
    #: the submission rules the point is checked against (benchmark/rules/<name>.yaml), if its tag has any
    rules: str | None = None
    #: how the global batch came about (spec.batch); None for a point read back without it
    batch: BatchChoice | None = None
    #: with Megatron-LM, the checkout the flags were made for (spec.megatron.target): version, commit, flag
    #: table, translations; None until then
    megatron_lm: dict[str, Any] | None = None
    #: why the point's trainer cannot run it here, where its tag asks for it anyway (a layout of another
    #: framework's, kept for planning and rendering); None for a point that runs
    unrunnable: str | None = None
    #: the precision the tag asked for where the system's profile replaced it (System.precision); None where
    #: the point trains in the tag's own precision
    replaced_precision: str | None = None

    @property
    def id(self) -> str:
        lay = self.layout
        by = "" if self.trainer == BUILTIN else f"_{self.trainer}"
        vp = f"_vp{lay.vp}" if lay.vp > 1 else ""
        experts = (f"_ep{lay.ep}" if lay.ep > 1 else "") + (f"_etp{lay.etp}" if lay.etp is not None else "")
        return (f"{self.model.name}_n{lay.nodes}_tp{lay.tp}_pp{lay.pp}{vp}{experts}_mbs{lay.mbs}_gas{lay.gas}"
                f"{self.settings}{self.variant}{by}")

    @property
    def env(self) -> dict[str, Any]:
        """The environment the jobscript exports: the system's, and Megatron-LM's where it is the trainer."""
        if self.trainer == MEGATRON_LM:
            return {**self.system.env, **self.system.megatron_lm_env}
        return self.system.env

    @property
    def precision_note(self) -> str | None:
        """One sentence saying that the system's profile, not the tag, chose the precision; None where the tag did."""
        if self.replaced_precision is None:
            return None
        return (f"{self.system.precision}, the precision system {self.system.name} trains in (its profile's "
                f"`precision`), in place of the tag's {self.replaced_precision}")

    @property
    def vocab_padded(self) -> int:
        return pad_vocab(self.model.vocab_size, self.layout.tp)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "benchmark": self.benchmark,
            "tag": self.tag,
            "model": {**self.model.to_dict(), "vocab_padded": self.vocab_padded,
                      "size_billions": self.model.size_billions(self.vocab_padded)},
            "system": self.system.name,
            "system_info": {"device": self.system.device, "device_name": self.system.device_name,
                            "devices_per_node": self.system.devices_per_node, "peak_tflops": self.system.peak_tflops,
                            "peak_precision": self.system.peak_precision, "peak_source": self.system.peak_source,
                            "peaks": self.system.sourced_peaks,
                            "partition": self.system.partition, "executor": self.system.executor},
            "layout": self.layout.to_dict(),
            "trainer": self.trainer,
            "rules": self.rules,
            "batch": None if self.batch is None else {"rule": self.batch.how,
                                                      "tag_global_batch_size": self.batch.tag_global_batch_size},
            "train": self.train,
            "sbatch": self.sbatch,
            **({"megatron_lm": self.megatron_lm} if self.megatron_lm is not None else {}),
            **({"unrunnable": self.unrunnable} if self.unrunnable else {}),
            **({"precision_note": self.precision_note} if self.replaced_precision else {}),
        }


@dataclass(frozen=True)
class Benchmark:
    name: str
    description: str
    default_tag: str
    train: dict[str, Any]
    tags: dict[str, dict[str, Any]]
    path: Path

    def point(self, tag: str | None = None, system: str | None = None, *, model: dict[str, int] | None = None,
              train: dict[str, Any] | None = None, trainer: str | None = None, batch: str = DEFAULT_BATCH_RULE,
              global_batch_size: int | None = None, vp: int | None = None, recompute: str | None = None,
              distributed_optimizer: bool | None = None, **layout: int | None) -> Point:
        """Resolve a tag (default: the benchmark's default tag) on its own or another system.

        `layout` may override nodes, tp, pp, mbs, gas, ep and etp (None keeps the tag's value): they are the
        parameters the benchmark's rules leave free. Where gas is not given, `batch` (spec.batch) says
        whether the tag's global batch or its gas is kept; `global_batch_size` asks for another batch. The
        trainer is `trainer`, else the tag's, else the system's. `vp` (model chunks per pipeline rank),
        `recompute` and `distributed_optimizer` choose what `bench plan` ranks beside the sizes (None: the
        tag's); where they are not the tag's, the point's id names them.
        """
        bad = set(layout) - set(FREE_SIZES)
        if bad:
            raise SpecError(f"cannot override {', '.join(sorted(bad))}; free parameters: {', '.join(FREE_SIZES)}")
        tag = self.default_tag if tag is None else str(tag)
        if tag not in self.tags:
            raise SpecError(unknown(f"tag for benchmark {self.name!r}:", tag, self.tags))
        spec = self.tags[tag]
        where = f"{self.path}: tag {tag!r}"
        sys_ = load_system(system or spec["system"])
        # the tag, then what it changes on this system, then what the caller overrides
        on_system = (spec.get("systems") or {}).get(sys_.name, {})
        own = {**spec, **on_system}
        spec = {**own, **{k: v for k, v in layout.items() if v is not None and k != "gas"}}
        model_spec = get_model(spec["model"], **{**(spec.get("model_overrides") or {}), **(model or {})})
        sizes = [spec["nodes"], sys_.devices_per_node, spec.get("tp", 1), spec.get("pp", 1), spec.get("mbs", 1)]
        tag_layout = Layout(own["nodes"], sys_.devices_per_node, own.get("tp", 1), own.get("pp", 1),
                            own.get("mbs", 1), own.get("gas", 1))
        chosen = None
        if all(isinstance(v, int) and v >= 1 for v in sizes) and tiles(sizes[0] * sizes[1], sizes[2], sizes[3]):
            if tag_layout.global_batch_size < 1 and layout.get("gas") is None and global_batch_size is None:
                raise LayoutError(f"{where}: its layout (tp {tag_layout.tp} x pp {tag_layout.pp} on {tag_layout.nodes} "
                                  f"node(s) of {sys_.devices_per_node} devices) does not fit system {sys_.name!r}, so "
                                  "its global batch is not defined there: give --gas or --global-batch-size, or a "
                                  f"layout for {sys_.name!r} in the tag's `systems` block")
            chosen = choose(check_rule(batch), tag_layout.global_batch_size, tag_layout.gas,
                            data_parallel_size(sizes[0] * sizes[1], sizes[2], sizes[3]), sizes[4],
                            gas=layout.get("gas"), global_batch_size=global_batch_size)
        gas = chosen.gas if chosen else layout.get("gas") or own.get("gas", 1)
        layout = valid_layout(model_spec, _sized(sizes, gas, spec, self.train, spec.get("train"), train))
        unrunnable = None
        if sys_.backend == "xla" and layout.pp > 1:
            why = (f"pipeline parallelism (pp {layout.pp}) is not available with the xla backend of system "
                   f"{sys_.name!r} in the built-in trainer")
            # only a layout the tag's block for this very system gives (NxD Training's) is kept
            if layout.pp != on_system.get("pp"):
                raise LayoutError(f"{where}: {why}, as in the Neuron reference; use pp 1")
            unrunnable = f"{why}: the tag's layout is NxD Training's, rendered and planned but not run here"
        if sys_.max_nodes is not None and layout.nodes > sys_.max_nodes:
            raise SpecError(f"{where} asks for {layout.nodes} nodes but system {sys_.name!r} has {sys_.max_nodes}")
        flags = _given_data({**self.train, **(spec.get("train") or {}), **(train or {})}, train or {})
        clash = DERIVED_FLAGS & set(flags)
        if clash:
            raise SpecError(f"{where}: train may not set {', '.join(sorted(clash))} (they follow from model and layout)")
        clash = MODEL_FLAGS & set(flags)
        if clash:
            raise SpecError(f"{where}: train may not set {', '.join(sorted(clash))}: the model says them (set the "
                            f"model's fields in model_overrides, e.g. position_embedding_type: rope)")
        flags = {**model_flags(model_spec, flags), **flags}
        flags, replaced = _system_precision(sys_, flags, train or {}, where)
        trainer = check_trainer(trainer or spec.get("trainer") or sys_.trainer, where)
        unrunnable = unrunnable or _builtin_lacks(model_spec, trainer)
        if trainer == MEGATRON_LM:
            flags = {**(MOE_MEGATRON_FLAGS if model_spec.moe else {}), **flags, **sys_.megatron_lm_train}
        tag_on = decode({**self.train, **(spec.get("train") or {}),
                         **(sys_.megatron_lm_train if trainer == MEGATRON_LM else {})})
        flags = with_settings(_interleaved(flags, model_spec, layout, vp, where), recompute=_choice(recompute),
                              distributed_optimizer=distributed_optimizer)
        # a Megatron-LM point's flags are checked once the checkout it will run is known (spec.megatron.target)
        on = decode(flags)
        chunks = on.model_chunks(model_spec.num_layers, layout.pp)
        if chunks > 1:  # interleaved: the layout says so (flags that do not divide the layers are the trainer's to refuse)
            layout = replace(layout, vp=chunks)
            if vp is not None:  # asked for outright: every rule of interleaving is checked now
                layout = valid_layout(model_spec, layout)
        return Point(self.name, tag, model_spec, sys_, layout, flags, dict(spec.get("sbatch") or {}), trainer=trainer,
                     rules=spec.get("rules"), batch=chosen, unrunnable=unrunnable, replaced_precision=replaced,
                     settings=settings_words(tag_on, on))


#: Megatron's uneven pipeline: the layers of the first and the last stage, as a tag's train block gives them
#: (a published layout of a model whose layers pp does not divide, DeepSeek-V3's 61 over 16 stages)
UNEVEN_FLAGS = {"first_stage_layers": "decoder-first-pipeline-num-layers",
                "last_stage_layers": "decoder-last-pipeline-num-layers"}


def _sized(sizes: list[int], gas: int, spec: dict[str, Any], *trains: dict[str, Any] | None) -> Layout:
    """The point's layout: `sizes` (nodes, devices per node, tp, pp, mbs) and gas, the expert sizes `spec` gives,
    and the uneven stages the train blocks set (`trains`: the benchmark's, the tag's, the caller's, in order)."""
    flags = {flag: value for train in trains for flag, value in (train or {}).items()}
    stages = {name: flags[flag] for name, flag in UNEVEN_FLAGS.items() if flags.get(flag) is not None}
    return Layout(*sizes, gas, ep=spec.get("ep", 1), etp=spec.get("etp"), **stages)


def _builtin_lacks(model: ModelSpec, trainer: str) -> str | None:
    """Why the built-in trainer cannot run `model`: the parts it does not build (None: it builds them all)."""
    if trainer != BUILTIN or not model.builtin_lacks:
        return None
    return (f"the built-in trainer has no {', '.join(model.builtin_lacks)} (model {model.name}): rendered and "
            "planned but not run here; use --trainer megatron-lm")


#: the flag that interleaves the pipeline (Switches.layers_per_virtual_stage)
INTERLEAVING_FLAG = "num-layers-per-virtual-pipeline-stage"


def _interleaved(flags: dict[str, Any], model: ModelSpec, layout: Layout, vp: int | None, where: str) -> dict[str, Any]:
    """`flags` with `vp` model chunks per pipeline rank (None: as the flags say): Megatron's
    --num-layers-per-virtual-pipeline-stage, layers / (pp x vp); 1 drops it."""
    if vp is None or vp == decode(flags).model_chunks(model.num_layers, layout.pp):
        return flags
    if not isinstance(vp, int) or isinstance(vp, bool) or vp < 1:
        raise LayoutError(f"{where}: vp must be a positive integer, got {vp!r}")
    out = {k: v for k, v in flags.items() if k != INTERLEAVING_FLAG}
    if vp == 1:
        return out
    if layout.pp == 1:
        raise LayoutError(f"{where}: vp {vp} interleaves the pipeline, which needs pp > 1")
    stages = virtual_stages(layout.pp, vp)
    if model.num_layers % stages:
        raise LayoutError(f"{where}: pp {layout.pp} x vp {vp} = {stages} does not divide the {model.num_layers} layers "
                          f"of {model.name}")
    return {**out, INTERLEAVING_FLAG: model.num_layers // stages}


def _choice(recompute: str | None) -> str | None:
    if recompute is not None and recompute not in RECOMPUTE:
        raise LayoutError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    return recompute


def settings_words(tag: Switches, point: Switches) -> str:
    """The id's words for the settings `bench plan` ranks where the point's are not its tag's: `_rc-none`,
    `_dist-opt-off`."""
    words = ""
    if point.recompute != tag.recompute:
        words += f"_rc-{point.recompute}"
    if point.distributed_optimizer != tag.distributed_optimizer:
        words += f"_dist-opt-{'on' if point.distributed_optimizer else 'off'}"
    return words


def _given_data(flags: dict[str, Any], asked: dict[str, Any]) -> dict[str, Any]:
    """The flags with the caller's dataset (--data-path, a grid's `train: {data-path: ...}`) in place of the
    tag's mock data, which the trainer would otherwise be given beside it."""
    if asked.get("data-path") and "mock-data" not in asked:
        return {k: v for k, v in flags.items() if k != "mock-data"}
    return flags


def _system_precision(system: System, flags: dict[str, Any], asked: dict[str, Any],
                      where: str) -> tuple[dict[str, Any], str | None]:
    """`flags` with the precision flags of the system's profile, where it names one (Neuron trains in bf16 with
    fp32 master weights; a tag's fp16 or fp32 would be another training there), and the precision the tag
    asked for where it was another. A caller's explicit other precision (a sweep's precision axis) is refused
    as a layout rule of the system, so that a sweep drops that point instead of renaming it."""
    want = system.precision
    if want is None:
        return flags, None
    had = precision_of(flags)
    if had == want:
        return flags, None
    if any(flag in asked for flag in PRECISION_FLAGS):
        raise LayoutError(f"{where}: system {system.name!r} trains in {want} (its profile's precision), not {had}")
    out = {k: v for k, v in flags.items() if k not in PRECISION_FLAGS}
    if want != "fp32":
        out[want] = True
    return out, had


def known_benchmarks() -> list[str]:
    return sorted(p.stem for p in benchmark_dir().glob("*.yaml"))


def load_benchmark(name_or_path: str = "nlp") -> Benchmark:
    """A benchmark by name (benchmark/<name>.yaml) or by path to a YAML file."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = benchmark_dir() / f"{name_or_path}.yaml"
        if not path.is_file():
            raise SpecError(f"benchmark file not found: {path}; known benchmarks: {', '.join(known_benchmarks())}")
    data = load_yaml(path, "benchmark")
    check_keys(data, _TOP_KEYS, str(path))
    tags = data.get("tags")
    if not isinstance(tags, dict) or not tags:
        raise SpecError(f"{path}: 'tags' must be a non-empty mapping")
    tags = {str(k): v for k, v in tags.items()}
    for tag, spec in tags.items():
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", tag):
            raise SpecError(f"{path}: tag name {tag!r} may hold only letters, digits, '_', '.' and '-'")
        if not isinstance(spec, dict):
            raise SpecError(f"{path}: tag {tag!r} must be a mapping")
        for key, value in (spec.get("sbatch") or {}).items():
            check_sbatch_option(key, value, f"{path}: tag {tag!r}")
        for key in spec.get("train") or {}:
            if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", str(key)):
                raise SpecError(f"{path}: tag {tag!r}: {key!r} is not a Megatron flag name")
        check_keys(spec, _TAG_KEYS, f"{path}: tag {tag!r}")
        if "trainer" in spec:
            check_trainer(spec["trainer"], f"{path}: tag {tag!r}")
        if spec.get("rules") is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", str(spec["rules"])):
            raise SpecError(f"{path}: tag {tag!r}: rules must name a file of benchmark/rules/")
        missing = {"model", "system", "nodes"} - set(spec)
        if missing:
            raise SpecError(f"{path}: tag {tag!r} is missing {', '.join(sorted(missing))}")
        overrides = spec.get("model_overrides") or {}
        if not isinstance(overrides, dict):
            raise SpecError(f"{path}: tag {tag!r}: model_overrides must map model fields to values")
        for key, value in overrides.items():
            if why := check_field(str(key), value):
                raise SpecError(f"{path}: tag {tag!r}: model_overrides: {why}")
        systems = spec.get("systems") or {}
        if not isinstance(systems, dict):
            raise SpecError(f"{path}: tag {tag!r}: systems must map a system name to what changes on it")
        for name, changes in systems.items():
            if not isinstance(changes, dict):
                raise SpecError(f"{path}: tag {tag!r}: systems: {name} must be a mapping")
            check_keys(changes, _PER_SYSTEM_KEYS, f"{path}: tag {tag!r}: systems: {name}")
    default_tag = str(data.get("default_tag", next(iter(tags))))
    if default_tag not in tags:
        raise SpecError(f"{path}: default_tag {default_tag!r} is not one of the tags")
    return Benchmark(str(data.get("name", path.stem)), str(data.get("description", "")), default_tag,
                     dict(data.get("train") or {}), tags, path)
