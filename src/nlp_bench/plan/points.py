"""Candidates from what the rest of the project knows: a resolved benchmark point (a tag, or a
point.json written by a sweep) carries the model, the system and the Megatron flags that decide
memory and speed."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from nlp_bench.plan.candidate import Candidate
from nlp_bench.spec.models import ModelSpec
from nlp_bench.spec.systems import System, load_system


@dataclass(frozen=True)
class Planned:
    """A model on a system with one layout: what the planner evaluates or calibrates on."""

    model: ModelSpec
    system: System
    candidate: Candidate
    swiglu: bool = False


def candidate(layout: dict[str, Any], train: dict[str, Any], model: ModelSpec) -> Candidate:
    """The layout's sizes with the switches the training flags set (Megatron's names)."""
    per_chunk = train.get("num-layers-per-virtual-pipeline-stage")
    pp = int(layout["pp"])
    recompute = train.get("recompute-granularity") or ("selective" if train.get("recompute-activations") else "none")
    return Candidate(
        nodes=int(layout["nodes"]), devices_per_node=int(layout["devices_per_node"]), tp=int(layout["tp"]), pp=pp,
        mbs=int(layout["mbs"]), gas=int(layout["gas"]),
        vp=model.num_layers // (pp * int(per_chunk)) if per_chunk else 1,
        recompute=str(recompute), distributed_optimizer=bool(train.get("use-distributed-optimizer")),
        sequence_parallel=bool(train.get("sequence-parallel")), flash_attention=bool(train.get("use-flash-attn")),
        precision="bf16" if train.get("bf16") else "fp16" if train.get("fp16") else "fp32",
        overlap_grad_reduce=bool(train.get("overlap-grad-reduce")),
        overlap_param_gather=bool(train.get("overlap-param-gather")),
    )


def from_point(point) -> Planned:
    """From a resolved spec.benchmark.Point."""
    layout = {**point.layout.to_dict()}
    return Planned(point.model, point.system, candidate(layout, point.train, point.model),
                   bool(point.train.get("swiglu")))


def from_point_json(data: dict[str, Any]) -> Planned:
    """From a point.json (what a run folder keeps)."""
    names = {f.name for f in fields(ModelSpec)}
    model = ModelSpec(**{k: v for k, v in data["model"].items() if k in names})
    train = data.get("train") or {}
    return Planned(model, load_system(data["system"]), candidate(data["layout"], train, model),
                   bool(train.get("swiglu")))
