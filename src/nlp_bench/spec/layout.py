"""Parallel layout: derive the data-parallel size and global batch, and say in words why a layout fails."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from nlp_bench.errors import LayoutError
from nlp_bench.spec.models import ModelSpec


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
        return self.world // (self.tp * self.pp)

    @property
    def global_batch_size(self) -> int:
        return self.dp * self.mbs * self.gas

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(world=self.world, dp=self.dp, global_batch_size=self.global_batch_size)
        return d


def problems(model: ModelSpec, layout: Layout) -> list[str]:
    """Every reason the layout cannot run this model; empty when it can."""
    out: list[str] = []
    for name in ("nodes", "devices_per_node", "tp", "pp", "mbs", "gas"):
        value = getattr(layout, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            out.append(f"{name} must be a positive integer, got {value!r}")
    if out:
        return out
    if model.num_attention_heads % layout.tp:
        out.append(f"tp {layout.tp} must divide the number of attention heads {model.num_attention_heads}")
    if model.ffn_hidden_size % layout.tp:
        out.append(f"tp {layout.tp} must divide the MLP width {model.ffn_hidden_size}")
    if model.num_layers % layout.pp:
        out.append(f"pp {layout.pp} must divide the number of layers {model.num_layers}")
    if layout.world % (layout.tp * layout.pp):
        out.append(
            f"tp x pp = {layout.tp * layout.pp} must divide the {layout.world} devices "
            f"({layout.nodes} nodes x {layout.devices_per_node})"
        )
    return out


def validate(model: ModelSpec, layout: Layout) -> Layout:
    """The layout, or a LayoutError that lists every problem."""
    found = problems(model, layout)
    if found:
        raise LayoutError(f"impossible layout for {model.name}: " + "; ".join(found))
    return layout

