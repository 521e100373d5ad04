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
from dataclasses import dataclass, field, fields, replace
from typing import Any

from nlp_bench.errors import SpecError
from nlp_bench.spec.layout import virtual_stages

PRECISIONS = ("fp32", "bf16", "fp16")
#: the precisions a flag names (fp32 is the absence of both)
PRECISION_FLAGS = ("bf16", "fp16")
RECOMPUTE = ("none", "selective", "full")
RECOMPUTE_METHODS = ("uniform", "block")
#: Megatron-LM core_v0.20.0's --recompute-modules (with --recompute-granularity selective) the planner models:
#: the attention core, the routed experts' activation function, the two norms, latent attention's
#: up-projections and RoPE, a dense layer's MLP, a whole MoE layer, the shared experts. Its other choices
#: (gdn_norm_out, gdp_in_proj, gdp_qkv, mhc) belong to layers nlp-bench's models do not have.
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
#: Megatron's default --recompute-modules
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)
#: Megatron's switches that turn a fused op off, by the op (nlp_bench.kernels' names)
UNFUSING_FLAGS = {"bias_gelu": "no-bias-gelu-fusion", "swiglu": "no-bias-swiglu-fusion",
                  "cross_entropy": "no-cross-entropy-loss-fusion"}


def _flag(flag: str, help: str, default: bool = False, *, stated: bool = True) -> Any:
    """A setting Megatron turns on with `--flag` (or, with default True, off with `--no-...`): the flag, its
    meaning and its default live with the field, so decoding, the rows files' keys and their help all come
    from here."""
    return field(default=default, metadata={"flag": flag, "help": help, "stated": stated})


def _given(help: str, default: Any = None, *, stated: bool = True) -> Any:
    """A setting decoded by a rule of its own (precision, recompute, ...); `stated` False keeps it out of the
    keys a planner's rows file may give (the planner does not model it)."""
    return field(default=default, metadata={"help": help, "stated": stated})


@dataclass(frozen=True)
class Switches:
    """The settings a point's flags choose, beyond the model's shape and the parallel sizes (spec.layout's).

    Each field is one Megatron setting; its flag and help are the field's metadata. A new boolean setting is
    one field here: `decode` reads its flag, the planner's rows files and corpus accept its key, and the
    help lists it."""

    precision: str = _given("training precision: fp32, bf16 or fp16 (--bf16, --fp16; fp8 in rows files is bf16 "
                            "with --fp8-format hybrid)", "fp32")
    recompute: str = _given("activation recompute: none, selective (attention's core) or full (whole layers)",
                            "none")
    recompute_modules: tuple[str, ...] = _given(
        "with selective recompute, the modules recomputed, a list of " + ", ".join(RECOMPUTE_MODULES)
        + " (--recompute-modules)", DEFAULT_RECOMPUTE_MODULES)
    recompute_method: str | None = _given("with full recompute: uniform or block (--recompute-method)", stated=False)
    recompute_num_layers: int | None = _given("with full recompute: layers per group (--recompute-num-layers)",
                                              stated=False)
    sequence_parallel: bool = _flag("sequence-parallel", "activations outside the GEMMs split over tp")
    distributed_optimizer: bool = _flag("use-distributed-optimizer", "optimizer states sharded over the "
                                        "replicas of the weights (dp x cp)")
    overlap_grad_reduce: bool = _flag("overlap-grad-reduce", "the gradient reduce behind the backward")
    overlap_param_gather: bool = _flag("overlap-param-gather", "the distributed optimizer's gather behind "
                                       "the forward")
    overlap_param_gather_with_optimizer_step: bool = _flag(
        "overlap-param-gather-with-optimizer-step", "with interleaving, the first model chunk's gather started "
        "once its optimizer step is done, behind the other chunks' steps (needs the distributed optimizer and "
        "overlap_param_gather)")
    flash_attention: bool = _flag("use-flash-attn", "fused (flash) attention")
    masked_softmax_fusion: bool = _flag("no-masked-softmax-fusion", "the fused masked softmax", True, stated=False)
    persist_layer_norm: bool = _flag("no-persist-layer-norm", "the persistent layer norm kernel", True, stated=False)
    gradient_accumulation_fusion: bool = _flag("no-gradient-accumulation-fusion", "the weight-gradient GEMMs "
                                               "add into the main gradients", True)
    async_tp_allreduce: bool = _flag("no-async-tensor-model-parallel-allreduce", "the column-parallel "
                                     "backward all-reduce behind the weight-gradient GEMM", True)
    #: the reference's --overlap-p2p-communication (an opt-in there; Megatron-LM's default from 0.4.0, where
    #: --no-overlap-p2p-communication turns it off: benchmark/megatron-lm/translations.yaml)
    overlap_p2p_comm: bool = _given("with interleaving, pipeline sends behind the chunk computed meanwhile "
                                    "(--overlap-p2p-communication; off: --no-overlap-p2p-communication)", False)
    tp_comm_overlap: bool = _flag("tp-comm-overlap", "tensor-parallel collectives behind the GEMMs (needs "
                                  "sequence parallelism)")
    overlap_moe_comm: bool = _flag("overlap-moe-expert-parallel-comm", "with experts over ep > 1 ranks, one "
                                   "micro-batch's all-to-alls behind another's computation (EP A2A overlap)")
    activation_func_fp8_input_store: bool = _flag("activation-func-fp8-input-store", "SwiGLU's input kept in "
                                                  "FP8 for the backward (dense MLPs and experts)")
    grad_reduce_in_bf16: bool = _flag("grad-reduce-in-bf16", "gradients accumulated and reduced in bf16")
    fp8_format: str | None = _given("Transformer Engine's FP8 GEMMs beside the 16-bit precision: e4m3 or "
                                    "hybrid (--fp8-format)")
    fp8_recipe: str | None = _given("with fp8, Transformer Engine's scaling: delayed or tensorwise (one scale per "
                                    "tensor), blockwise (1x128 and 128x128 blocks), mxfp8 (32-element MX blocks, "
                                    "Blackwell) (--fp8-recipe; Megatron's default delayed)")
    fp4_format: str | None = _given("Transformer Engine's FP4 GEMMs (--fp4-format e2m1; NVFP4 with --fp4-recipe "
                                    "nvfp4)", stated=False)
    fp8_param_gather: bool = _flag("fp8-param-gather", "FP8 weights all-gathered in FP8 (needs fp8 and the "
                                   "distributed optimizer)")
    #: fused ops turned off, each with the flag that did it
    unfused: dict[str, str] = field(default_factory=dict, hash=False)
    #: Megatron's --num-layers-per-virtual-pipeline-stage (None: plain 1F1B); spec.layout's vp counts chunks
    layers_per_virtual_stage: int | None = None

    def model_chunks(self, num_layers: int, pp: int) -> int:
        """Model chunks per pipeline rank: 1 for plain 1F1B, more when interleaved."""
        per = self.layers_per_virtual_stage
        return num_layers // virtual_stages(pp, per) if per else 1

    @property
    def recomputes(self) -> bool:
        return self.recompute != "none"

    def recomputed(self, module: str, recompute: str | None = None) -> bool:
        """Whether selective recompute (this point's, or `recompute` in its place) recomputes `module`."""
        return (recompute or self.recompute) == "selective" and module in self.recompute_modules

    @property
    def fp8(self) -> bool:
        """Transformer Engine's FP8 GEMMs with bf16 training (what the planner times as fp8; --fp8-format with
        fp16 or fp32 training is not modelled and counts as that precision)."""
        return self.fp8_format is not None and self.precision == "bf16"

    @property
    def compute_precision(self) -> str:
        """The GEMMs' precision: nvfp4 with Transformer Engine's FP4, mxfp8 with its MXFP8 recipe, fp8 with its
        other FP8 recipes (per-tensor or block scales, the FP8 rate), else the training precision."""
        if self.fp4_format is not None and self.precision == "bf16":
            return "nvfp4"
        if self.fp8:
            return "mxfp8" if self.fp8_recipe == "mxfp8" else "fp8"
        return self.precision

    def problems(self) -> list[str]:
        """Settings Megatron-LM refuses together."""
        out = []
        if self.fp8_param_gather and not (self.fp8 and self.distributed_optimizer):
            out.append(FP8_PARAM_GATHER_NEEDS)
        if self.tp_comm_overlap and not self.sequence_parallel:
            out.append(TP_COMM_OVERLAP_NEEDS)
        if self.overlap_param_gather_with_optimizer_step and not (self.overlap_param_gather
                                                                  and self.distributed_optimizer):
            out.append(GATHER_WITH_STEP_NEEDS)
        return out


#: Megatron-LM's --fp8-param-gather keeps FP8 weights: it needs FP8 and the distributed optimizer that gathers them
FP8_PARAM_GATHER_NEEDS = "fp8_param_gather needs precision fp8 and the distributed optimizer"
TP_COMM_OVERLAP_NEEDS = "tp_comm_overlap needs sequence_parallel (Megatron-LM refuses it without)"
GATHER_WITH_STEP_NEEDS = ("overlap_param_gather_with_optimizer_step needs overlap_param_gather and the distributed "
                          "optimizer (Megatron-LM refuses it without)")
FP8_FORMATS = ("e4m3", "hybrid")
#: Megatron-LM core_v0.20.0's --fp8-recipe choices the planner and MFU tell apart (custom: a user's quantizer)
FP8_RECIPES = ("delayed", "tensorwise", "blockwise", "mxfp8")
#: the precisions a planner's row states (fp8: bf16 training with Transformer Engine's FP8 GEMMs); the planner
#: has no fp32 figures to stand on
STATED_PRECISIONS = ("bf16", "fp16", "fp8")
#: the choices of the settings that are words
_CHOICES = {"recompute": RECOMPUTE, "recompute_method": RECOMPUTE_METHODS, "fp8_format": FP8_FORMATS,
            "precision": STATED_PRECISIONS, "fp8_recipe": FP8_RECIPES}
#: the settings a planner's rows file, corpus or table may state, by their field names: those it models
SETTING_KEYS = tuple(f.name for f in fields(Switches) if f.metadata.get("stated"))


def setting_help(base: Switches) -> str:
    """One line per setting a rows file may state: its key, its meaning, Megatron's flag and the default
    (`base`'s)."""
    def line(f) -> str:
        flag = f"--{f.metadata['flag']}; " if "flag" in f.metadata else ""
        value = getattr(base, f.name)
        shown = "fp8" if f.name == "precision" and base.fp8 else str(value).lower() if isinstance(value, bool) else value
        shown = "[" + ", ".join(value) + "]" if isinstance(value, tuple) else shown
        return f"{f.name}: {f.metadata['help']} ({flag}default {shown})"
    return "\n".join(line(f) for f in fields(Switches) if f.metadata.get("stated"))


def read_settings(mapping: Mapping[str, Any], base: Switches, where: str) -> Switches:
    """`base` with the settings `mapping` states by their keys (a rows file's row, the corpus, a table);
    other keys are the caller's. A wrong type or choice is a SpecError naming `where` and the key;
    precision fp8 is bf16 with Transformer Engine's FP8 (fp8_format hybrid unless given)."""
    given = {k: mapping[k] for k in SETTING_KEYS if k in mapping}
    for f in fields(Switches):
        if f.name not in given:
            continue
        value = given[f.name]
        if f.name in _CHOICES:
            if value not in _CHOICES[f.name]:
                raise SpecError(f"{where}: {f.name} must be one of {', '.join(_CHOICES[f.name])}, got {value!r}")
        elif f.name == "recompute_modules":
            given[f.name] = recompute_modules_of(value, f"{where}: {f.name}")
        elif f.name == "recompute_num_layers":
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SpecError(f"{where}: {f.name} must be a positive integer, got {value!r}")
        elif not isinstance(value, bool):
            raise SpecError(f"{where}: {f.name} must be true or false, got {value!r}")
    if given.get("precision") == "fp8":
        given.update(precision="bf16", fp8_format=given.get("fp8_format") or "hybrid")
    out = replace(base, **given)
    if out.fp8_format is not None and out.precision != "bf16":
        raise SpecError(f"{where}: fp8_format goes with bf16 training (precision fp8), not {out.precision}")
    if out.fp8_recipe is not None and not out.fp8:
        raise SpecError(f"{where}: fp8_recipe goes with precision fp8")
    if "recompute_modules" in given and out.recompute != "selective":
        raise SpecError(f"{where}: recompute_modules goes with recompute selective")
    for problem in out.problems():
        raise SpecError(f"{where}: {problem}")
    return out


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


#: every flag that says how activations are recomputed (decode reads them all)
RECOMPUTE_FLAGS = ("recompute-activations", "recompute-granularity", "recompute-method", "recompute-num-layers",
                   "recompute-modules")
#: the flag that shards the optimizer states (Switches.distributed_optimizer)
DISTRIBUTED_OPTIMIZER_FLAG = "use-distributed-optimizer"


def recompute_flags(recompute: str) -> dict[str, Any]:
    """The flags that choose `recompute` (the inverse of decode's recompute): full recomputes every layer one
    at a time (--recompute-method uniform --recompute-num-layers 1), Megatron-LM refusing full without a
    method."""
    if recompute not in RECOMPUTE:
        raise SpecError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    if recompute == "none":
        return {}
    if recompute == "selective":
        return {"recompute-granularity": "selective"}
    return {"recompute-granularity": "full", "recompute-method": "uniform", "recompute-num-layers": 1}


def with_settings(flags: Mapping[str, Any], *, recompute: str | None = None,
                  distributed_optimizer: bool | None = None) -> dict[str, Any]:
    """`flags` choosing these settings (None keeps the flags' own); flags that already choose one are left as
    they are, so a point asked for its tag's own setting keeps the tag's spelling of it."""
    out = dict(flags)
    if recompute is None and distributed_optimizer is None:
        return out
    on = decode(out)
    if recompute is not None and recompute != on.recompute:
        out = {k: v for k, v in out.items() if k not in RECOMPUTE_FLAGS} | recompute_flags(recompute)
    if distributed_optimizer is not None and distributed_optimizer != on.distributed_optimizer:
        out.pop(DISTRIBUTED_OPTIMIZER_FLAG, None)
        if distributed_optimizer:
            out[DISTRIBUTED_OPTIMIZER_FLAG] = True
    return out


def recompute_modules_of(value: Any, where: str) -> tuple[str, ...]:
    """--recompute-modules as a tuple: a list (a YAML block, a parsed argv's nargs) or one string of names
    separated by spaces (a command line's words); a name outside RECOMPUTE_MODULES is a SpecError naming
    `where`."""
    names = value.split() if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise SpecError(f"{where} must be a list of module names, got {value!r}")
    unknown = [n for n in names if n not in RECOMPUTE_MODULES]
    if unknown:
        raise SpecError(f"{where}: {', '.join(unknown)} not among {', '.join(RECOMPUTE_MODULES)}")
    return tuple(dict.fromkeys(names))


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
    recompute, method, layers = _recompute(get)
    per_stage = get("num-layers-per-virtual-pipeline-stage")
    by_flag = {f.name: bool(get(f.metadata["flag"])) != f.default for f in fields(Switches) if "flag" in f.metadata}
    return Switches(
        **by_flag, precision=precision_of(flags), recompute=recompute, recompute_method=method,
        recompute_num_layers=layers,
        recompute_modules=DEFAULT_RECOMPUTE_MODULES if get("recompute-modules") is None
        else recompute_modules_of(get("recompute-modules"), "--recompute-modules"),
        overlap_p2p_comm=bool(get("overlap-p2p-communication")) and not get("no-overlap-p2p-communication"),
        fp8_format=get("fp8-format") or None, fp8_recipe=get("fp8-recipe") or None, fp4_format=get("fp4-format") or None,
        unfused={op: f"--{flag}" for op, flag in UNFUSING_FLAGS.items() if get(flag)},
        layers_per_virtual_stage=None if per_stage is None else int(per_stage),
    )
