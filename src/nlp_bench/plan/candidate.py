"""One layout the planner evaluates: Megatron's parallel sizes plus the memory-saving switches."""

from __future__ import annotations

from dataclasses import dataclass, replace

from nlp_bench.spec.layout import Layout
from nlp_bench.spec.layout import problems as layout_problems
from nlp_bench.spec.models import ModelSpec

#: Megatron-LM's --fp8-param-gather keeps FP8 weights: it needs FP8 and the distributed optimizer that gathers them
FP8_PARAM_GATHER_NEEDS = "fp8_param_gather needs precision fp8 and the distributed optimizer"
#: Megatron's unfused attention asserts one context-parallel rank (megatron/core/transformer/dot_product_attention.py)
CP_NEEDS_FLASH = "context parallelism (cp > 1) needs flash attention: Megatron's unfused attention runs on cp 1 only"


@dataclass(frozen=True)
class Candidate(Layout):
    """A Layout (nodes, devices per node, tp, pp, mbs, gas; dp and the global batch follow) with the
    switches that change memory and speed."""

    vp: int = 1  # model chunks per pipeline rank (interleaved 1F1B when > 1)
    recompute: str = "selective"
    distributed_optimizer: bool = True
    sequence_parallel: bool = True
    flash_attention: bool = True
    precision: str = "bf16"  # bf16 | fp16 | fp32 | fp8 (bf16 training with Transformer Engine's FP8 GEMMs)
    overlap_grad_reduce: bool = False  # Megatron's --overlap-grad-reduce
    overlap_param_gather: bool = False  # Megatron's --overlap-param-gather
    cp: int = 1  # context parallelism: each rank of a cp group holds 1/cp of every sequence
    first_stage_layers: int | None = None  # Megatron's --decoder-first-pipeline-num-layers
    last_stage_layers: int | None = None  # --decoder-last-pipeline-num-layers
    tp_comm_overlap: bool = False  # --tp-comm-overlap: tensor-parallel collectives behind the GEMMs
    #: the weight-gradient GEMMs add into the main gradients themselves (Megatron's default since 2022;
    #: off with --no-gradient-accumulation-fusion, and in Megatron before it, or DeepSpeed)
    gradient_accumulation_fusion: bool = True
    #: the column-parallel layers' backward all-reduce runs behind the weight-gradient GEMM (Megatron's
    #: default since 2022; off with --no-async-tensor-model-parallel-allreduce, and in Megatron before it)
    async_tp_allreduce: bool = True
    #: with interleaving, pipeline sends behind the chunk computed meanwhile (Megatron's default since commit
    #: 4eeff55 of 2023-10-12, off with --no-overlap-p2p-communication; before, --overlap-p2p-communication)
    overlap_p2p_comm: bool = True
    #: gradients accumulated and reduced in bf16 (--grad-reduce-in-bf16; NeMo's grad_sync_dtype: bf16),
    #: where Megatron keeps them in fp32 with bf16 training
    grad_reduce_in_bf16: bool = False
    #: with FP8, the linear layers' weights kept and all-gathered in FP8 (--fp8-param-gather; NeMo's
    #: fp8_params), the distributed optimizer casting its shard
    fp8_param_gather: bool = False

    @property
    def dp(self) -> int:
        """Data-parallel replicas: what tp x cp x pp leaves of the world."""
        return self.world // (self.tp * self.pp * self.cp)

    @property
    def weight_replicas(self) -> int:
        """The ranks that hold the same weights, over which gradients are reduced and the distributed
        optimizer shards its states (Megatron's data-parallel group with context parallelism)."""
        return self.dp * self.cp

    def stage_layers(self, num_layers: int) -> tuple[float, float, float]:
        """The transformer layers of the first, each middle and the last pipeline stage: the first and last
        as given, the rest split evenly over the stages between (Megatron's uneven pipeline); without them
        L/pp each (a published layout whose pp does not divide L, as Megatron-DeepSpeed ran BLOOM, counts
        the average stage). With one stage, all three are that stage."""
        if self.first_stage_layers is None and self.last_stage_layers is None or self.pp == 1:
            even = num_layers / self.pp
            return even, even, even
        given = [n for n in (self.first_stage_layers, self.last_stage_layers) if n is not None]
        others = self.pp - len(given)
        middle = (num_layers - sum(given)) / others if others else 0.0
        first = self.first_stage_layers if self.first_stage_layers is not None else middle
        last = self.last_stage_layers if self.last_stage_layers is not None else middle
        return first, middle, last

    def switch_problems(self) -> list[str]:
        """Switches Megatron-LM refuses together."""
        out = []
        if self.fp8_param_gather and not (self.precision == "fp8" and self.distributed_optimizer):
            out.append(FP8_PARAM_GATHER_NEEDS)
        if self.cp > 1 and not self.flash_attention:
            out.append(CP_NEEDS_FLASH)
        return out

    def problems(self, model: ModelSpec) -> list[str]:
        """Why this layout cannot run the model (the switches, the spec's rules, interleaving's, context
        parallelism's and the uneven pipeline's); empty when it can."""
        out = self.switch_problems()
        if self.cp == 1 and self.first_stage_layers is None and self.last_stage_layers is None:
            return out + layout_problems(model, self, chunks=self.vp)
        if self.world % (self.tp * self.pp * self.cp):
            out.append(f"tp {self.tp} x cp {self.cp} x pp {self.pp} does not divide the {self.world} devices")
            return out
        if model.seq_length % (2 * self.cp):
            out.append(f"sequence {model.seq_length} does not split into 2 x cp {self.cp} chunks (Megatron's "
                       "load-balanced context parallelism)")
        even = replace(self, cp=1, nodes=1, devices_per_node=self.tp * self.pp, first_stage_layers=None,
                       last_stage_layers=None)
        uneven = self.first_stage_layers is not None or self.last_stage_layers is not None
        for found in layout_problems(model, even, chunks=self.vp):
            if uneven and "layers" in found:  # the even split's rule; the uneven one is checked below
                continue
            out.append(found)
        if uneven:
            out += self._uneven_problems(model.num_layers)
        return out

    def _uneven_problems(self, num_layers: int) -> list[str]:
        given = [n for n in (self.first_stage_layers, self.last_stage_layers) if n is not None]
        others = self.pp - len(given)
        rest = num_layers - sum(given)
        if self.pp < 2 or (self.pp == 2 and len(given) == 2 and rest) or others < 0:
            return [f"uneven stages need pp >= 2 and the given stages' layers to add up to {num_layers}"]
        if rest < (1 if others else 0) or (others and rest % others):
            return [f"the {rest} layers left by the first/last stages do not split evenly over the other "
                    f"{others} stages"]
        if self.vp > 1:
            return ["uneven stages with interleaving (vp > 1) are not modelled"]
        return []
