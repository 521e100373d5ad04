"""Layouts a user states outright (`bench plan predict ROWS.yaml`), and models given by Megatron-LM's flags
(`bench plan --model`): how someone checks a published figure without writing a benchmark tag.

A rows file is a mapping with `rows:`, each row a mapping:

    id: a name for the row (required)
    model: a preset name, or a mapping of Megatron-LM flag names without `--` (num-layers, hidden-size,
           num-attention-heads, num-query-groups, ffn-hidden-size, seq-length, vocab-size, swiglu, ...)
    system: a system profile name, or the path of a profile file
    gpus | nodes: the allocation (gpus a multiple of the profile's devices per node)
    tp, pp, cp, vp, mbs (default 1), global_batch_size (required)
    recompute: none | selective | full (default none, as Megatron-LM), sequence_parallel,
    distributed_optimizer (default false, as Megatron-LM), precision: bf16 | fp16 | fp8 (default bf16),
    decoder_first_pipeline_num_layers, decoder_last_pipeline_num_layers, tp_comm_overlap,
    gradient_accumulation_fusion (default true, as Megatron-LM; false for --no-gradient-accumulation-fusion),
    async_tp_allreduce (default true; false for --no-async-tensor-model-parallel-allreduce),
    overlap_p2p_comm (default true, as Megatron-LM since October 2023; false for
    --no-overlap-p2p-communication), grad_reduce_in_bf16 (default false; true for --grad-reduce-in-bf16),
    fp8_param_gather (default false; true for --fp8-param-gather: precision fp8 and the distributed optimizer)

A row whose layout cannot be laid out (tp x cp x pp not dividing the devices, a global batch that dp x mbs
does not divide) is answered with no prediction and the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nlp_bench.errors import PlanError, SpecError
from nlp_bench.plan.candidate import Candidate
from nlp_bench.plan.points import Planned
from nlp_bench.spec.models import PRESETS, ModelSpec, from_flags, get_model
from nlp_bench.spec.switches import RECOMPUTE
from nlp_bench.spec.systems import System, load_system, load_system_file
from nlp_bench.spec.yamlio import load_yaml

#: the Megatron-LM flags (without `--`) a model mapping may give, and what each must be
_INT_FLAGS = ("num-layers", "hidden-size", "num-attention-heads", "num-query-groups", "ffn-hidden-size",
              "seq-length", "max-position-embeddings", "vocab-size", "rotary-base")
_SWITCH_FLAGS = ("group-query-attention", "swiglu", "untie-embeddings-and-output-weights", "disable-bias-linear")
_CHOICE_FLAGS = {"normalization": ("LayerNorm", "RMSNorm"), "position-embedding-type": ("learned_absolute", "rope")}
MAPPING_FLAGS = (*_INT_FLAGS, *_SWITCH_FLAGS, *_CHOICE_FLAGS, "name")
_REQUIRED_MODEL = ("num-layers", "hidden-size", "num-attention-heads", "seq-length", "vocab-size")

_ROW_INTS = ("gpus", "nodes", "tp", "pp", "cp", "vp", "mbs", "global_batch_size",
             "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers")
#: switches whose Candidate default is Megatron-LM's own, so a row that leaves one out keeps it
_MEGATRON_DEFAULTS = ("gradient_accumulation_fusion", "async_tp_allreduce", "overlap_p2p_comm", "grad_reduce_in_bf16",
                      "fp8_param_gather")
_ROW_SWITCHES = ("sequence_parallel", "distributed_optimizer", "tp_comm_overlap", "flash_attention",
                 "overlap_grad_reduce", "overlap_param_gather", *_MEGATRON_DEFAULTS)
ROW_PRECISIONS = ("bf16", "fp16", "fp8")
ROW_KEYS = ("id", "model", "system", "recompute", "precision", *_ROW_INTS, *_ROW_SWITCHES)


@dataclass(frozen=True)
class Row:
    """One stated layout: what the planner predicts, or why it cannot (`refused`)."""

    id: str
    planned: Planned | None
    refused: str = ""
    #: the layout as stated, for the answer when nothing can be planned
    stated: Mapping[str, Any] | None = None


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _check_types(mapping: Mapping[str, Any], ints: tuple[str, ...], switches: tuple[str, ...], what: str) -> None:
    for key in ints:
        if key in mapping and not _positive_int(mapping[key]):
            raise SpecError(f"{what} {key} must be a positive integer, got {mapping[key]!r}")
    for key in switches:
        if key in mapping and not isinstance(mapping[key], bool):
            raise SpecError(f"{what} {key} must be true or false, got {mapping[key]!r}")


def model_from_flags(mapping: Mapping[str, Any], where: str) -> ModelSpec:
    """A model from Megatron-LM's flag names (a planner row's `model`, or `bench plan --model FILE`)."""
    unknown = sorted(set(mapping) - set(MAPPING_FLAGS))
    if unknown:
        raise SpecError(f"{where}: unknown model flag(s) {', '.join(unknown)}; known: {', '.join(MAPPING_FLAGS)}")
    missing = [k for k in _REQUIRED_MODEL if k not in mapping]
    if missing:
        raise SpecError(f"{where}: the model needs {', '.join(missing)}")
    _check_types(mapping, _INT_FLAGS, _SWITCH_FLAGS, f"{where}: model flag")
    for key, choices in _CHOICE_FLAGS.items():
        if key in mapping and mapping[key] not in choices:
            raise SpecError(f"{where}: model flag {key} must be one of {', '.join(choices)}, got {mapping[key]!r}")
    flags = dict(mapping)
    if "num-query-groups" in flags:
        flags["group-query-attention"] = True
    elif flags.get("group-query-attention"):
        raise SpecError(f"{where}: group-query-attention needs num-query-groups")
    model = from_flags(str(flags.get("name", "")), flags, int(flags["vocab-size"]))
    if model.num_attention_heads % model.query_groups:
        raise SpecError(f"{where}: {model.num_attention_heads} attention heads do not split into "
                        f"{model.query_groups} query groups")
    if model.hidden_size % model.num_attention_heads:
        raise SpecError(f"{where}: hidden-size {model.hidden_size} is not a multiple of the "
                        f"{model.num_attention_heads} attention heads")
    if not model.name:
        model = replace(model, name=f"custom-{model.parameters(model.vocab_size) / 1e9:.1f}b")
    return model


def load_model(value: str) -> ModelSpec:
    """`bench plan --model`: a preset name, or a YAML file holding a model mapping (Megatron-LM's flag names)."""
    if value in PRESETS:
        return PRESETS[value]
    path = Path(value)
    if not path.is_file():
        raise SpecError(f"--model {value}: neither a model preset ({', '.join(PRESETS)}) nor a file")
    data = load_yaml(path, "model")
    return model_from_flags(data, str(path))


def _system(value: Any, where: str, folder: Path) -> System:
    """A profile by name, or a profile file (a relative path is the rows file's folder's)."""
    if not isinstance(value, str) or not value:
        raise SpecError(f"{where}: system must be a profile name or the path of a profile file")
    if value.endswith((".yaml", ".yml")) or "/" in value:
        path = Path(value)
        return load_system_file(path if path.is_absolute() else folder / path)
    return load_system(value)


def _row_model(value: Any, where: str) -> ModelSpec:
    if isinstance(value, str):
        return get_model(value)
    if isinstance(value, Mapping):
        return model_from_flags(value, where)
    raise SpecError(f"{where}: model must be a preset name or a mapping of Megatron-LM flag names")


def read_row(row: Any, index: int, source: str) -> Row:
    """One row, checked: a fault a user can fix is one line naming the file and the row."""
    if not isinstance(row, Mapping):
        raise SpecError(f"{source} row {index}: expected a mapping, got {type(row).__name__}")
    ident = row.get("id")
    where = f"{source} row {ident if ident is not None else index}"
    if not isinstance(ident, (str, int)) or isinstance(ident, bool) or str(ident) == "":
        raise SpecError(f"{where}: every row needs an id")
    unknown = sorted(set(row) - set(ROW_KEYS))
    if unknown:
        raise SpecError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(ROW_KEYS)}")
    _check_types(row, _ROW_INTS, _ROW_SWITCHES, f"{where}:")
    for key in ("model", "system", "global_batch_size"):
        if key not in row:
            raise SpecError(f"{where}: {key} is required")
    if ("gpus" in row) == ("nodes" in row):
        raise SpecError(f"{where}: give exactly one of gpus and nodes")
    recompute = row.get("recompute", "none")
    if recompute not in RECOMPUTE:
        raise SpecError(f"{where}: recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    precision = row.get("precision", "bf16")
    if precision not in ROW_PRECISIONS:
        raise SpecError(f"{where}: precision must be one of {', '.join(ROW_PRECISIONS)}, got {precision!r}")
    try:
        model = _row_model(row["model"], where)
        system = _system(row["system"], where, Path(source).parent)
    except SpecError as exc:  # a preset or profile that cannot be read: say which row named it
        message = str(exc)
        raise SpecError(message if message.startswith(where) else f"{where}: {message}") from None
    per_node = system.devices_per_node
    if "gpus" in row and row["gpus"] % per_node:
        raise SpecError(f"{where}: gpus {row['gpus']} is not a whole number of {system.name}'s "
                        f"{per_node}-device nodes")
    nodes = row["nodes"] if "nodes" in row else row["gpus"] // per_node
    tp, pp, mbs = row.get("tp", 1), row.get("pp", 1), row.get("mbs", 1)
    stated = {"model": model.name, "system": system.name, "nodes": nodes, "tp": tp, "pp": pp,
              "cp": row.get("cp", 1), "vp": row.get("vp", 1), "mbs": mbs,
              "global_batch_size": row["global_batch_size"], "recompute": recompute,
              "distributed_optimizer": row.get("distributed_optimizer", False),
              "sequence_parallel": row.get("sequence_parallel", False)}
    if row.get("tp_comm_overlap") and not row.get("sequence_parallel"):
        raise SpecError(f"{where}: tp_comm_overlap needs sequence_parallel (Megatron-LM refuses it without)")
    cp = row.get("cp", 1)
    world = nodes * per_node
    if world % (tp * pp * cp):
        return Row(str(ident), None, f"tp {tp} x cp {cp} x pp {pp} does not divide the {world} devices", stated)
    dp = world // (tp * pp * cp)
    if row["global_batch_size"] % (dp * mbs):
        return Row(str(ident), None, f"the global batch {row['global_batch_size']} is not a multiple of "
                                     f"dp {dp} x mbs {mbs}", stated)
    c = Candidate(nodes=nodes, devices_per_node=per_node, tp=tp, pp=pp, mbs=mbs,
                  gas=row["global_batch_size"] // (dp * mbs), vp=row.get("vp", 1), recompute=recompute,
                  distributed_optimizer=row.get("distributed_optimizer", False),
                  sequence_parallel=row.get("sequence_parallel", False),
                  flash_attention=row.get("flash_attention", True), precision=precision,
                  overlap_grad_reduce=row.get("overlap_grad_reduce", False),
                  overlap_param_gather=row.get("overlap_param_gather", False), cp=cp,
                  first_stage_layers=row.get("decoder_first_pipeline_num_layers"),
                  last_stage_layers=row.get("decoder_last_pipeline_num_layers"),
                  tp_comm_overlap=row.get("tp_comm_overlap", False),
                  **{k: row[k] for k in _MEGATRON_DEFAULTS if k in row})
    for problem in c.switch_problems():
        raise SpecError(f"{where}: {problem}")
    return Row(str(ident), Planned(model, system, c), stated=stated)


def load_rows(path: Path) -> list[Row]:
    """Every row of a rows file; ids must be unique."""
    data = load_yaml(path, "rows file")
    rows = data.get("rows")
    if not isinstance(rows, list) or not rows:
        raise PlanError(f"{path}: expected `rows:`, a list of layouts (see `bench plan predict --help`)")
    out = [read_row(row, i, str(path)) for i, row in enumerate(rows, 1)]
    seen: set[str] = set()
    for row in out:
        if row.id in seen:
            raise SpecError(f"{path}: row id {row.id!r} is used twice")
        seen.add(row.id)
    return out
