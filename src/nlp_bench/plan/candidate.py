"""One layout the planner evaluates: a spec.Layout (every parallel size) with the spec.Switches (every
other Megatron setting), each in its own vocabulary and never copied."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from nlp_bench.spec.layout import LAYOUT_FIELDS, Layout
from nlp_bench.spec.layout import problems as layout_problems
from nlp_bench.spec.models import ModelSpec
from nlp_bench.spec.switches import Switches

#: Megatron's unfused attention asserts one context-parallel rank (megatron/core/transformer/dot_product_attention.py)
CP_NEEDS_FLASH = "context parallelism (cp > 1) needs flash attention: Megatron's unfused attention runs on cp 1 only"
#: Megatron-LM asserts interleaving with --overlap-param-gather-with-optimizer-step (megatron/training/arguments.py)
GATHER_WITH_STEP_NEEDS_VP = "overlap_param_gather_with_optimizer_step needs interleaving (vp > 1)"

#: where the planner's search starts when nothing states a setting: bf16 with Megatron-LM's current defaults
#: and the memory savers a large model is trained with (selective recompute, the distributed optimizer,
#: sequence parallelism, flash attention)
SEARCH_START = Switches(precision="bf16", recompute="selective", distributed_optimizer=True, sequence_parallel=True,
                        flash_attention=True, overlap_p2p_comm=True)
#: what a layout stated outright (a rows file, a published table) leaves unsaid: Megatron-LM's current defaults,
#: with bf16 and flash attention (recompute none, no distributed optimizer, no sequence parallelism)
STATED_START = Switches(precision="bf16", flash_attention=True, overlap_p2p_comm=True)

_SETTING_FIELDS = frozenset(f.name for f in fields(Switches))


@dataclass(frozen=True)
class Candidate:
    """A Layout and the Switches: what the planner predicts memory and speed of."""

    layout: Layout
    switches: Switches = SEARCH_START

    @classmethod
    def of(cls, nodes: int, devices_per_node: int, tp: int, pp: int, mbs: int, gas: int, *,
           switches: Switches = SEARCH_START, **given: Any) -> Candidate:
        """A candidate from sizes and settings by name, over `switches`: how tests and scripts state one in a
        line."""
        return cls(Layout(nodes, devices_per_node, tp, pp, mbs, gas), switches).changed(**given)

    def changed(self, **given: Any) -> Candidate:
        """This candidate with layout fields and settings replaced by name, each given to its owner (a
        layout's field to the Layout, a setting to the Switches); precision fp8 is bf16 with FP8 GEMMs."""
        unknown = set(given) - set(LAYOUT_FIELDS) - _SETTING_FIELDS
        if unknown:
            raise TypeError(f"neither a layout field nor a setting: {', '.join(sorted(unknown))}")
        chosen = {k: v for k, v in given.items() if k in _SETTING_FIELDS}
        if chosen.get("precision") == "fp8":
            chosen.update(precision="bf16", fp8_format=chosen.get("fp8_format") or "hybrid")
        elif "precision" in chosen:
            chosen.setdefault("fp8_format", None)
        return Candidate(replace(self.layout, **{k: v for k, v in given.items() if k in LAYOUT_FIELDS}),
                         replace(self.switches, **chosen))

    def setting_problems(self) -> list[str]:
        """Settings Megatron-LM refuses together, or with this layout (a row stating them is an error)."""
        out = self.switches.problems()
        if self.layout.cp > 1 and not self.switches.flash_attention:
            out.append(CP_NEEDS_FLASH)
        if self.switches.overlap_param_gather_with_optimizer_step and self.layout.vp == 1:
            out.append(GATHER_WITH_STEP_NEEDS_VP)
        return out

    def problems(self, model: ModelSpec) -> list[str]:
        """Why this layout cannot run the model (the settings, the layout's rules); empty when it can."""
        return self.setting_problems() + layout_problems(model, self.layout)
