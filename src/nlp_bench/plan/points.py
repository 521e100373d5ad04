"""Candidates from what the rest of the project knows: a resolved benchmark point (a tag, or a
point.json written by a sweep) carries the model, the system and the Megatron flags that decide
memory and speed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nlp_bench.plan.candidate import Candidate
from nlp_bench.spec.layout import LAYOUT_FIELDS, Layout
from nlp_bench.spec.models import ModelSpec, from_record
from nlp_bench.spec.switches import decode
from nlp_bench.spec.systems import System, load_system


@dataclass(frozen=True)
class Planned:
    """A model on a system with one layout: what the planner evaluates or calibrates on."""

    model: ModelSpec
    system: System
    candidate: Candidate


def candidate(layout: Mapping[str, Any], train: Mapping[str, Any], model: ModelSpec) -> Candidate:
    """The layout's sizes (a point's `layout`) with the settings the training flags choose (Megatron's
    names); interleaving's chunks follow from --num-layers-per-virtual-pipeline-stage where the layout does
    not give vp."""
    on = decode(train)
    sizes = {k: layout[k] for k in LAYOUT_FIELDS if layout.get(k) is not None}
    if sizes.get("vp", 1) == 1:  # a point.json written before Layout knew vp, or a point without interleaving
        sizes["vp"] = on.model_chunks(model.num_layers, int(sizes["pp"]))
    return Candidate(Layout(**sizes), on)


def from_point(point) -> Planned:
    """From a resolved spec.benchmark.Point."""
    return Planned(point.model, point.system, candidate(point.layout.to_dict(), point.train, point.model))


def from_point_json(data: dict[str, Any]) -> Planned:
    """From a point.json (what a run folder keeps)."""
    train = data.get("train") or {}
    model = from_record(data["model"], train)
    return Planned(model, load_system(data["system"]), candidate(data["layout"], train, model))
