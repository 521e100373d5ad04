"""Layouts a user states outright (`bench plan predict ROWS.yaml`), and models given by Megatron-LM's flags
(`bench plan --model`): how someone checks a published figure without writing a benchmark tag.

A rows file is a mapping with `rows:`, each row a mapping: `id` (required), `model` (a preset name, or a
mapping of Megatron-LM flag names without `--`), `system` (a profile name or the path of a profile file),
`gpus` or `nodes`, the parallel sizes (`ROW_SIZES`: tp, pp, cp, vp, mbs, and the uneven pipeline's
decoder_first/last_pipeline_num_layers), `global_batch_size` (required), and any setting of spec.Switches by
its field name (`row_help()` lists them with their defaults, Megatron-LM's current ones with bf16 and flash
attention).

A row whose layout cannot be laid out (tp x cp x pp not dividing the devices, a global batch that dp x mbs
does not divide) is answered with no prediction and the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nlp_bench.errors import PlanError, SpecError
from nlp_bench.plan.candidate import STATED_START, Candidate
from nlp_bench.plan.points import Planned
from nlp_bench.spec.layout import Layout, tiles
from nlp_bench.spec.models import PRESETS, ModelSpec, from_flags, get_model
from nlp_bench.spec.switches import SETTING_KEYS, read_settings, setting_help
from nlp_bench.spec.systems import System, load_system, load_system_file
from nlp_bench.spec.yamlio import load_yaml

#: the Megatron-LM flags (without `--`) a model mapping may give, and what each must be
_INT_FLAGS = ("num-layers", "hidden-size", "num-attention-heads", "num-query-groups", "ffn-hidden-size",
              "seq-length", "max-position-embeddings", "vocab-size", "rotary-base", "kv-channels",
              # experts, latent attention and multi-token prediction (Megatron-core's flags)
              "num-experts", "moe-router-topk", "moe-ffn-hidden-size", "moe-shared-expert-intermediate-size",
              "moe-router-num-groups", "moe-router-group-topk", "mtp-num-layers", "q-lora-rank", "kv-lora-rank",
              "qk-head-dim", "qk-pos-emb-head-dim", "v-head-dim")
_TRUE_OR_FALSE_FLAGS = ("group-query-attention", "swiglu", "untie-embeddings-and-output-weights", "disable-bias-linear",
                        "qk-layernorm", "multi-latent-attention", "moe-router-enable-expert-bias")
_CHOICE_FLAGS = {"normalization": ("LayerNorm", "RMSNorm"), "position-embedding-type": ("learned_absolute", "rope"),
                 "moe-router-score-function": ("softmax", "sigmoid"),
                 "moe-router-load-balancing-type": ("aux_loss", "seq_aux_loss", "none")}
#: positive numbers, and --moe-layer-freq (an integer, "([0]*k+[1]*m)" or a list, as Megatron takes it)
_NUMBER_FLAGS = ("moe-expert-capacity-factor", "moe-aux-loss-coeff", "moe-router-topk-scaling-factor")
MAPPING_FLAGS = (*_INT_FLAGS, *_TRUE_OR_FALSE_FLAGS, *_CHOICE_FLAGS, *_NUMBER_FLAGS, "moe-layer-freq", "name")
_REQUIRED_MODEL = ("num-layers", "hidden-size", "num-attention-heads", "seq-length", "vocab-size")

#: a row's parallel sizes by its key, and the Layout field each becomes
ROW_SIZES = {"tp": "tp", "pp": "pp", "cp": "cp", "vp": "vp", "mbs": "mbs", "ep": "ep", "etp": "etp",
             "decoder_first_pipeline_num_layers": "first_stage_layers",
             "decoder_last_pipeline_num_layers": "last_stage_layers"}
_ROW_INTS = ("gpus", "nodes", "global_batch_size", *ROW_SIZES)
ROW_KEYS = ("id", "model", "system", *_ROW_INTS, *SETTING_KEYS)


def row_help() -> str:
    """The keys a row may give, for `bench plan predict --help` and its errors."""
    return (f"id, model, system, gpus | nodes, global_batch_size, {', '.join(ROW_SIZES)}; and the settings:\n"
            + setting_help(STATED_START))


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
    _check_types(mapping, _INT_FLAGS, _TRUE_OR_FALSE_FLAGS, f"{where}: model flag")
    for key in _NUMBER_FLAGS:
        if key in mapping and (isinstance(mapping[key], bool) or not isinstance(mapping[key], (int, float))
                               or mapping[key] < 0):
            raise SpecError(f"{where}: model flag {key} must be a number of at least 0, got {mapping[key]!r}")
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
    _check_types(row, _ROW_INTS, (), f"{where}:")
    for key in ("model", "system", "global_batch_size"):
        if key not in row:
            raise SpecError(f"{where}: {key} is required")
    if ("gpus" in row) == ("nodes" in row):
        raise SpecError(f"{where}: give exactly one of gpus and nodes")
    try:
        model = _row_model(row["model"], where)
        system = _system(row["system"], where, Path(source).parent)
        switches = read_settings(row, STATED_START, where)
    except SpecError as exc:  # a preset or profile that cannot be read: say which row named it
        message = str(exc)
        raise SpecError(message if message.startswith(where) else f"{where}: {message}") from None
    per_node = system.devices_per_node
    if "gpus" in row and row["gpus"] % per_node:
        raise SpecError(f"{where}: gpus {row['gpus']} is not a whole number of {system.name}'s "
                        f"{per_node}-device nodes")
    nodes = row["nodes"] if "nodes" in row else row["gpus"] // per_node
    layout = Layout(nodes, per_node, gas=1, **{"tp": 1, "pp": 1, "mbs": 1,
                                               **{field: row[key] for key, field in ROW_SIZES.items() if key in row}})
    stated = {"model": model.name, "system": system.name, "nodes": nodes, "tp": layout.tp, "pp": layout.pp,
              "cp": layout.cp, "vp": layout.vp, "mbs": layout.mbs, "global_batch_size": row["global_batch_size"],
              "recompute": switches.recompute, "distributed_optimizer": switches.distributed_optimizer,
              "sequence_parallel": switches.sequence_parallel,
              **({"ep": layout.ep, "etp": layout.expert_tp, "edp": None} if layout.ep > 1 or layout.etp is not None else {})}
    if not tiles(layout.world, layout.tp, layout.pp, layout.cp):
        return Row(str(ident), None, f"tp {layout.tp} x cp {layout.cp} x pp {layout.pp} does not divide the "
                                     f"{layout.world} devices", stated)
    gas = layout.steps_for(row["global_batch_size"])
    if gas is None:
        return Row(str(ident), None, f"the global batch {row['global_batch_size']} is not a multiple of "
                                     f"dp {layout.dp} x mbs {layout.mbs}", stated)
    c = Candidate(replace(layout, gas=gas), switches)
    for problem in c.setting_problems():
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
