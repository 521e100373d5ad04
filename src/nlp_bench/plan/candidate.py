"""One layout the planner evaluates: Megatron's parallel sizes plus the memory-saving switches."""

from __future__ import annotations

from dataclasses import dataclass

from nlp_bench.spec.layout import Layout
from nlp_bench.spec.layout import problems as layout_problems
from nlp_bench.spec.models import ModelSpec


@dataclass(frozen=True)
class Candidate(Layout):
    """A Layout (nodes, devices per node, tp, pp, mbs, gas; dp and the global batch follow) with the
    switches that change memory and speed."""

    vp: int = 1  # model chunks per pipeline rank (interleaved 1F1B when > 1)
    recompute: str = "selective"
    distributed_optimizer: bool = True
    sequence_parallel: bool = True
    flash_attention: bool = True
    precision: str = "bf16"  # bf16 | fp16 | fp32
    overlap_grad_reduce: bool = False  # Megatron's --overlap-grad-reduce
    overlap_param_gather: bool = False  # Megatron's --overlap-param-gather

    def problems(self, model: ModelSpec) -> list[str]:
        """Why this layout cannot run the model (the spec's rules, and interleaving's); empty when it can."""
        return layout_problems(model, self, chunks=self.vp)
