"""What a point's Megatron flags switch on, decoded in one place.

Megatron spells one setting several ways (`--recompute-activations` is selective recompute, as is
`--recompute-granularity selective`; no precision flag is fp32; `--no-bias-gelu-fusion` turns a fused op
off). The sweep, the planner, the trainer, the analysis and the rules check all read a point's flags
through `decode`, so none of them can come to another answer for the same flags.

Flags are given as a mapping of Megatron's names without the leading dashes (a benchmark's `train:`
block, a parsed argv, the trainer's own flags); a switch is on when its value is true.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nlp_bench.errors import SpecError

PRECISIONS = ("fp32", "bf16", "fp16")
#: the precisions a flag names (fp32 is the absence of both)
PRECISION_FLAGS = ("bf16", "fp16")
RECOMPUTE = ("none", "selective", "full")
RECOMPUTE_METHODS = ("uniform", "block")
#: Megatron's switches that turn a fused op off, by the op (nlp_bench.kernels' names)
UNFUSING_FLAGS = {"bias_gelu": "no-bias-gelu-fusion", "swiglu": "no-bias-swiglu-fusion",
                  "cross_entropy": "no-cross-entropy-loss-fusion"}


@dataclass(frozen=True)
class Switches:
    """The settings a point's flags choose, beyond the model's shape and the parallel sizes."""

    precision: str = "fp32"
    #: activation recompute: none, selective (attention's core) or full (whole layers)
    recompute: str = "none"
    #: with full recompute: uniform or block, and how many layers per group (Megatron's defaults filled in)
    recompute_method: str | None = None
    recompute_num_layers: int | None = None
    sequence_parallel: bool = False
    distributed_optimizer: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    flash_attention: bool = False
    masked_softmax_fusion: bool = True
    persist_layer_norm: bool = True
    #: the weight-gradient GEMMs add into the main gradients (off: --no-gradient-accumulation-fusion)
    gradient_accumulation_fusion: bool = True
    #: the column-parallel backward all-reduce behind the weight-gradient GEMM (off:
    #: --no-async-tensor-model-parallel-allreduce)
    async_tp_allreduce: bool = True
    #: with interleaving, pipeline sends behind the chunk computed meanwhile: the reference's
    #: --overlap-p2p-communication (an opt-in there; Megatron-LM's default from 0.4.0, where
    #: --no-overlap-p2p-communication turns it off: benchmark/megatron-lm/translations.yaml)
    overlap_p2p_comm: bool = False
    #: gradients accumulated and reduced in bf16 (--grad-reduce-in-bf16)
    grad_reduce_in_bf16: bool = False
    #: Transformer Engine's FP8 GEMMs (--fp8-format e4m3 or hybrid), beside the 16-bit precision
    fp8_format: str | None = None
    #: FP8 weights all-gathered in FP8 (--fp8-param-gather)
    fp8_param_gather: bool = False
    #: fused ops turned off, each with the flag that did it
    unfused: dict[str, str] = field(default_factory=dict)
    #: Megatron's --num-layers-per-virtual-pipeline-stage (None: plain 1F1B)
    layers_per_virtual_stage: int | None = None

    def model_chunks(self, num_layers: int, pp: int) -> int:
        """Model chunks per pipeline rank: 1 for plain 1F1B, more when interleaved."""
        per = self.layers_per_virtual_stage
        return num_layers // (pp * per) if per else 1

    @property
    def recomputes(self) -> bool:
        return self.recompute != "none"


#: torch-xla's old precision switches: they store every fp32 tensor (master weights, Adam moments) as bf16 behind
#: a float32 dtype. Neuron ended their support after release 2.24 and says not to mix them with bf16 models;
#: profiles and the trainer refuse them (`--bf16` trains in bf16 with fp32 master weights).
DOWNCAST_VARIABLES = ("XLA_USE_BF16", "XLA_DOWNCAST_BF16")


def precision_of(flags: Mapping[str, Any]) -> str:
    """fp32 unless --bf16 or --fp16 is on; both at once is refused (a SpecError naming them)."""
    on = [p for p in PRECISION_FLAGS if flags.get(p)]
    if len(on) > 1:
        raise SpecError("--bf16 and --fp16 exclude each other")
    return on[0] if on else "fp32"


def precision_flags(precision: str) -> dict[str, bool]:
    """The flags that choose `precision` (the inverse of precision_of)."""
    if precision not in PRECISIONS:
        raise SpecError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return {flag: precision == flag for flag in PRECISION_FLAGS}


def _recompute(get) -> tuple[str, str | None, int | None]:
    granularity = get("recompute-granularity") or ("selective" if get("recompute-activations") else "none")
    if granularity not in RECOMPUTE:
        raise SpecError(f"--recompute-granularity must be selective or full, got {granularity!r}")
    method, layers = get("recompute-method"), get("recompute-num-layers")
    if granularity != "full":
        if method or layers:
            raise SpecError("--recompute-method and --recompute-num-layers go with --recompute-granularity full")
        return granularity, None, None
    if (method or "uniform") not in RECOMPUTE_METHODS:
        raise SpecError(f"--recompute-method must be uniform or block, got {method!r}")
    return granularity, method or "uniform", int(layers or 1)


def decode(flags: Mapping[str, Any]) -> Switches:
    """The settings `flags` choose. A contradiction (both precisions, recompute details without full
    recompute) is a SpecError."""
    get = flags.get
    precision = precision_of(flags)
    recompute, method, layers = _recompute(get)
    per_stage = get("num-layers-per-virtual-pipeline-stage")
    return Switches(
        precision=precision, recompute=recompute, recompute_method=method, recompute_num_layers=layers,
        sequence_parallel=bool(get("sequence-parallel")), distributed_optimizer=bool(get("use-distributed-optimizer")),
        overlap_grad_reduce=bool(get("overlap-grad-reduce")), overlap_param_gather=bool(get("overlap-param-gather")),
        flash_attention=bool(get("use-flash-attn")),
        masked_softmax_fusion=not get("no-masked-softmax-fusion"), persist_layer_norm=not get("no-persist-layer-norm"),
        gradient_accumulation_fusion=not get("no-gradient-accumulation-fusion"),
        async_tp_allreduce=not get("no-async-tensor-model-parallel-allreduce"),
        overlap_p2p_comm=bool(get("overlap-p2p-communication")) and not get("no-overlap-p2p-communication"),
        grad_reduce_in_bf16=bool(get("grad-reduce-in-bf16")), fp8_format=get("fp8-format") or None,
        fp8_param_gather=bool(get("fp8-param-gather")),
        unfused={op: f"--{flag}" for op, flag in UNFUSING_FLAGS.items() if get(flag)},
        layers_per_virtual_stage=None if per_stage is None else int(per_stage),
    )
