"""Candidates from what the rest of the project knows: a resolved benchmark point (a tag, or a
point.json written by a sweep) carries the model, the system and the Megatron flags that decide
memory and speed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nlp_bench.plan.candidate import Candidate
from nlp_bench.spec.models import ModelSpec, from_record
from nlp_bench.spec.switches import decode
from nlp_bench.spec.systems import System, load_system


@dataclass(frozen=True)
class Planned:
    """A model on a system with one layout: what the planner evaluates or calibrates on."""

    model: ModelSpec
    system: System
    candidate: Candidate


def candidate(layout: dict[str, Any], train: dict[str, Any], model: ModelSpec) -> Candidate:
    """The layout's sizes with the switches the training flags set (Megatron's names). The planner's fp8 is
    bf16 training with Transformer Engine's FP8 GEMMs: --bf16 with --fp8-format."""
    pp = int(layout["pp"])
    on = decode(train)
    return Candidate(
        nodes=int(layout["nodes"]), devices_per_node=int(layout["devices_per_node"]), tp=int(layout["tp"]), pp=pp,
        mbs=int(layout["mbs"]), gas=int(layout["gas"]), vp=on.model_chunks(model.num_layers, pp),
        recompute=on.recompute, distributed_optimizer=on.distributed_optimizer,
        sequence_parallel=on.sequence_parallel, flash_attention=on.flash_attention,
        precision="fp8" if on.fp8_format and on.precision == "bf16" else on.precision,
        overlap_grad_reduce=on.overlap_grad_reduce, overlap_param_gather=on.overlap_param_gather,
        gradient_accumulation_fusion=on.gradient_accumulation_fusion, async_tp_allreduce=on.async_tp_allreduce,
        overlap_p2p_comm=on.overlap_p2p_comm, grad_reduce_in_bf16=on.grad_reduce_in_bf16,
        fp8_param_gather=on.fp8_param_gather,
    )


def from_point(point) -> Planned:
    """From a resolved spec.benchmark.Point."""
    layout = {**point.layout.to_dict()}
    return Planned(point.model, point.system, candidate(layout, point.train, point.model))


def from_point_json(data: dict[str, Any]) -> Planned:
    """From a point.json (what a run folder keeps)."""
    train = data.get("train") or {}
    model = from_record(data["model"], train)
    return Planned(model, load_system(data["system"]), candidate(data["layout"], train, model))
