"""The planner's validation corpus (results/reference/planner-corpus.yaml): published measurements, each
with its source and exact layout, as planned points with a measured tokens/s.

The file states every measurement as published (seconds per iteration, tokens/s, or TFLOP/s per GPU in
a named FLOPs convention); the conversion to tokens/s happens here, once, with the project's own FLOPs
functions."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from nlp_bench import flops
from nlp_bench.errors import PlanError, SpecError
from nlp_bench.paths import reference_dir
from nlp_bench.plan.candidate import STATED_START, Candidate
from nlp_bench.plan.points import Planned
from nlp_bench.spec.layout import LAYOUT_FIELDS, Layout
from nlp_bench.spec.models import ModelSpec, get_model, pad_vocab
from nlp_bench.spec.switches import read_settings
from nlp_bench.spec.systems import System, load_system
from nlp_bench.spec.yamlio import load_yaml

CORPUS_FILE = "planner-corpus.yaml"
_MEASURES = ("iteration_s", "tokens_per_s", "samples_per_s", "tflops_per_gpu")
#: narayanan: 96·B·s·L·h²(1 + s/6h + V/16Lh), flops.jupiter_flops with recompute; megatron-0.9: Megatron-LM
#: 0.9's num_floating_point_operations, which counts the whole attention score matrix (12·B·s²·L·h where
#: later versions count the causal half) and the padded vocabulary
_CONVENTIONS = {"narayanan", "megatron-0.9"}


@dataclass(frozen=True)
class CorpusRow:
    """One published measurement: where it comes from, what ran, and its tokens/s."""

    id: str
    source: str
    planned: Planned
    tokens_per_s: float
    assumed: str = ""
    #: the publication (or measuring party) the row comes from: validation holds out whole publications
    publication: str = ""

    @property
    def candidate(self) -> Candidate:
        return self.planned.candidate

    @property
    def fitted(self) -> bool:
        """Whether the time model's constants are fitted on this row: only where the source states every
        input; a row with an `assumed` input is predicted and checked, never fitted on."""
        return not self.assumed


def corpus_path() -> Path:
    return reference_dir() / CORPUS_FILE


def _model(spec: dict[str, Any], defaults: dict[str, Any], where: str) -> ModelSpec:
    spec = dict(spec)
    if "preset" in spec:
        return get_model(spec.pop("preset"), **spec)
    h = spec.get("hidden_size")
    if not isinstance(h, int):
        raise PlanError(f"{where}: model needs a preset or hidden_size, num_layers, num_attention_heads")
    seq = spec.pop("seq_length", defaults["seq_length"])
    known = {f.name for f in fields(ModelSpec)}
    if set(spec) - known:
        raise PlanError(f"{where}: unknown model field(s) {', '.join(sorted(set(spec) - known))}")
    model = ModelSpec(name="", ffn_hidden_size=spec.pop("ffn_hidden_size", 4 * h), seq_length=seq,
                      max_position_embeddings=seq, vocab_size=spec.pop("vocab_size", defaults["vocab_size"]), **spec)
    return replace(model, name=f"gpt-{model.parameters(model.vocab_size) / 1e9:.1f}b")


def _tokens_per_s(row: dict[str, Any], model: ModelSpec, c: Candidate, where: str) -> float:
    given = [k for k in _MEASURES if k in row]
    if len(given) != 1:
        raise PlanError(f"{where}: give exactly one of {', '.join(_MEASURES)}")
    value = float(row[given[0]])
    tokens = c.layout.global_batch_size * model.seq_length
    if given[0] == "tokens_per_s":
        return value
    if given[0] == "samples_per_s":
        return value * model.seq_length
    if given[0] == "iteration_s":
        return tokens / value
    if row.get("flops") not in _CONVENTIONS:
        raise PlanError(f"{where}: tflops_per_gpu needs flops: one of {', '.join(sorted(_CONVENTIONS))}")
    if row["flops"] == "narayanan":
        count = flops.jupiter_flops(model.flops_shape(c.layout.global_batch_size, model.vocab_size, recompute=True))
    else:
        b, s = c.layout.global_batch_size, model.seq_length
        count = (flops.megatron_model_flops(model.flops_shape(b, pad_vocab(model.vocab_size, c.layout.tp)))
                 + 6.0 * b * s * s * model.hidden_size * model.num_layers)
    seconds = count / (c.layout.world * value * 1e12)
    return tokens / seconds


def load_corpus(path: Path | None = None) -> list[CorpusRow]:
    """Every row of the corpus, checked: a row the planner cannot read is an error naming it."""
    path = path or corpus_path()
    data = load_yaml(path, "planner corpus")
    defaults = data.get("defaults") or {}
    out = []
    for i, row in enumerate(data.get("rows") or []):
        where = f"{path.name} row {row.get('id', i + 1)}"
        system = load_system(row["system"])
        model = _model(row["model"], defaults, where)
        # a setting neither the row nor the defaults give keeps Megatron-LM's current default
        try:
            switches = read_settings({**defaults, **row}, STATED_START, where)
        except SpecError as exc:
            raise PlanError(str(exc)) from None
        sizes = {k: v for k, v in row["layout"].items() if k != "nodes"}
        unknown = sorted(set(sizes) - set(LAYOUT_FIELDS))
        if unknown:
            raise PlanError(f"{where}: unknown layout key(s) {', '.join(unknown)}; known: {', '.join(LAYOUT_FIELDS)}")
        vp = row.get("vp", defaults.get("vp", 1))
        c = Candidate(Layout(row["layout"]["nodes"], system.devices_per_node, **{"vp": vp, **sizes}), switches)
        for problem in c.setting_problems():
            raise PlanError(f"{where}: {problem}")
        publication = row.get("publication")
        if not isinstance(publication, str) or not publication.strip():
            raise PlanError(f"{where}: publication is required (validation holds out whole publications)")
        out.append(CorpusRow(str(row.get("id", i + 1)), str(row["source"]).strip(),
                             Planned(model, system, c), _tokens_per_s(row, model, c, where),
                             str(row.get("assumed", "")), publication.strip()))
    if not out:
        raise PlanError(f"{path}: the corpus has no rows")
    return out


@dataclass(frozen=True)
class Ranges:
    """What the corpus covers: a prediction outside these is an extrapolation."""

    devices: tuple[int, int]  # the scale: devices of the whole run (nodes differ in size between systems)
    billions: tuple[float, float]
    tp: tuple[int, int]
    pp: tuple[int, int]
    seq_length: tuple[int, int]
    vocab: tuple[int, int]
    device_names: frozenset[str]
    precisions: frozenset[str]
    #: whether any corpus model has fewer key/value heads than query heads
    grouped_query: bool
    #: the largest context-parallel size, and whether any row has uneven stages or tensor-parallel overlap
    cp: int = 1
    uneven_stages: bool = False
    tp_overlap: bool = False
    #: whether any corpus model has experts (the MoE terms are otherwise unchecked)
    experts: bool = False

    def outside(self, model: ModelSpec, system: System, c: Candidate, vocab_padded: int) -> list[str]:
        """What of a layout lies outside the corpus, in words: its scale and shape, and the device,
        precision and attention the corpus fitted on; empty when it is inside."""
        billions = model.parameters(vocab_padded) / 1e9
        out = []
        for name, value, (lo, hi) in (("devices", c.layout.world, self.devices), ("model size (B)", billions, self.billions),
                                      ("tp", c.layout.tp, self.tp), ("pp", c.layout.pp, self.pp),
                                      ("sequence", model.seq_length, self.seq_length),
                                      ("vocabulary", model.vocab_size, self.vocab)):
            if not lo <= value <= hi:
                out.append(f"{name} {value:g} outside {lo:g}..{hi:g}")
        for name, value, seen in (("device", system.device_name, self.device_names),
                                  ("precision", c.switches.compute_precision, self.precisions)):
            if value not in seen:
                out.append(f"{name} {value} not in the corpus ({', '.join(sorted(seen))})")
        if model.query_groups < model.num_attention_heads and not self.grouped_query:
            out.append(f"grouped-query attention ({model.query_groups} groups for {model.num_attention_heads} heads) "
                       "not in the corpus")
        if c.layout.cp > self.cp:
            out.append(f"context parallelism (cp {c.layout.cp}) beyond the corpus's {self.cp}")
        if (c.layout.first_stage_layers is not None or c.layout.last_stage_layers is not None) and not self.uneven_stages:
            out.append("uneven pipeline stages not in the corpus")
        if c.switches.tp_comm_overlap and not self.tp_overlap:
            out.append("tensor-parallel communication overlap not in the corpus")
        if model.moe is not None and not self.experts:
            out.append("mixture of experts not in the corpus")
        return out


def ranges(rows: list[CorpusRow]) -> Ranges:
    def span(values):
        values = list(values)
        return min(values), max(values)

    models = [r.planned.model for r in rows]
    return Ranges(span(r.candidate.layout.world for r in rows),
                  span(round(m.parameters(m.vocab_size) / 1e9, 1) for m in models),
                  span(r.candidate.layout.tp for r in rows), span(r.candidate.layout.pp for r in rows),
                  span(m.seq_length for m in models), span(m.vocab_size for m in models),
                  frozenset(r.planned.system.device_name for r in rows),
                  frozenset(r.candidate.switches.compute_precision for r in rows),
                  any(m.query_groups < m.num_attention_heads for m in models),
                  max(r.candidate.layout.cp for r in rows),
                  any(r.candidate.layout.first_stage_layers is not None or r.candidate.layout.last_stage_layers is not None
                      for r in rows),
                  any(r.candidate.switches.tp_comm_overlap for r in rows), any(m.moe is not None for m in models))
