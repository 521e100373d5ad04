"""Published layouts that ran and layouts that did not fit (results/reference/planner-memory.yaml): what the
memory model is checked on, beside the time corpus's rows (every one of which ran).

A source that sweeps layouts until they stop fitting says more about the memory model than any row that
ran: it shows the boundary. Each table in the file shares a model, a device and the switches; its cells
are [tp, cp, pp, micro-batch, GPUs, figure], the figure null where the source records none (taken as did
not fit, with the table's `no_figure` saying why that is an inference where it is one)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from nlp_bench.errors import PlanError, SpecError
from nlp_bench.paths import reference_dir
from nlp_bench.plan import memory
from nlp_bench.plan.candidate import STATED_START, Candidate
from nlp_bench.spec.layout import Layout, replica_devices, tiles
from nlp_bench.spec.models import ModelSpec, get_model, pad_vocab
from nlp_bench.spec.switches import Switches, read_settings
from nlp_bench.spec.yamlio import load_yaml

OUTCOMES_FILE = "planner-memory.yaml"
_SHARED = ("id", "publication", "source", "model", "device_memory_gib", "devices_per_node", "global_batch_size",
           "recompute", "sequence_parallel", "distributed_optimizer", "precision", "cells")


@dataclass(frozen=True)
class Outcome:
    """One published layout: whether it ran, and what the memory model predicts it needs."""

    id: str
    publication: str
    ran: bool
    predicted_gib: float
    device_memory_gib: float

    @property
    def predicted_to_fit(self) -> bool:
        return self.predicted_gib <= self.device_memory_gib


def outcomes_path() -> Path:
    return reference_dir() / OUTCOMES_FILE


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _cell(cell: object, where: str) -> tuple[int, int, int, int, int, bool]:
    if not (isinstance(cell, list) and len(cell) == 6
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in cell[:5])
            and (cell[5] is None or _positive(cell[5]))):
        raise PlanError(f"{where}: a cell is [tp, cp, pp, micro-batch, GPUs, figure or null], got {cell!r}")
    tp, cp, pp, mbs, gpus, figure = cell
    if not tiles(gpus, tp, pp, cp):
        raise PlanError(f"{where}: tp x cp x pp = {replica_devices(tp, pp, cp)} does not divide its {gpus} GPUs")
    return tp, cp, pp, mbs, gpus, figure is not None


def _table(table: object, where: str) -> tuple[ModelSpec, dict, Switches]:
    """The table's model and shared inputs, checked: one PlanError line naming the table for anything amiss."""
    missing = [k for k in _SHARED if not isinstance(table, dict) or k not in table]
    if missing:
        raise PlanError(f"{where}: missing {', '.join(missing)}")
    wrong = [k for k in ("device_memory_gib", "devices_per_node", "global_batch_size") if not _positive(table[k])]
    wrong += [k for k in ("devices_per_node", "global_batch_size") if k not in wrong and not isinstance(table[k], int)]
    if wrong:
        raise PlanError(f"{where}: {', '.join(wrong)} must be positive (whole numbers but for the memory)")
    try:
        switches = read_settings(table, STATED_START, where)
    except SpecError as exc:
        raise PlanError(str(exc)) from None
    if not isinstance(table["cells"], list) or not table["cells"]:
        raise PlanError(f"{where}: cells must be a list of [tp, cp, pp, micro-batch, GPUs, figure or null]")
    spec = table["model"]
    if not isinstance(spec, dict) or "preset" not in spec:
        raise PlanError(f"{where}: model needs a preset (and the fields it overrides)")
    spec = dict(spec)
    seq = spec.get("seq_length")
    try:
        model = get_model(spec.pop("preset"), **spec, **({"max_position_embeddings": seq} if seq else {}))
    except SpecError as exc:
        raise PlanError(f"{where}: {exc}") from None
    return model, table, switches


def load_outcomes(path: Path | None = None) -> Iterator[Outcome]:
    """Every cell of every table, with the memory model's estimate; a table or cell the planner cannot read
    is one error naming it."""
    path = path or outcomes_path()
    data = load_yaml(path, "planner memory outcomes")
    tables = data.get("tables") if isinstance(data, dict) else None
    if not isinstance(tables, list) or not tables:
        raise PlanError(f"{path}: no tables (a list under `tables:`)")
    for i, raw in enumerate(tables):
        where = f"{path.name} table {raw.get('id', i + 1) if isinstance(raw, dict) else i + 1}"
        model, table, switches = _table(raw, where)
        memory_gib, per_node, batch = table["device_memory_gib"], table["devices_per_node"], table["global_batch_size"]
        for k, (tp, cp, pp, mbs, gpus, ran) in enumerate(_cell(c, where) for c in table["cells"]):
            if gpus > per_node and gpus % per_node:
                raise PlanError(f"{where}: cell {k + 1}: {gpus} GPUs do not fill nodes of {per_node}")
            layout = Layout(max(1, gpus // per_node), min(per_node, gpus), tp, pp, mbs, 1, cp=cp)
            gas = layout.steps_for(batch)
            if gas is None:
                raise PlanError(f"{where}: cell {k + 1}: dp {layout.dp} x micro-batch {mbs} does not divide the "
                                f"batch {batch}")
            c = Candidate(replace(layout, gas=gas), replace(switches, sequence_parallel=switches.sequence_parallel
                                                            and tp > 1))
            gib = memory.footprint(model, pad_vocab(model.vocab_size, tp), c).gib
            yield Outcome(f"{table['id']}/tp{tp}-cp{cp}-pp{pp}-mbs{mbs}-{gpus}", str(table["publication"]), ran, gib,
                          float(memory_gib))
