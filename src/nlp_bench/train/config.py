"""The trainer's settings as one typed tree, built once from the parsed flags and the world size.

Nothing past `build_config` reads the argparse namespace: the model, the layout, the optimizer, the data,
the run control and the logging each get their own part of the tree. What the flags mean (precision,
recompute, fusion switches, interleaving) comes from spec.switches, as it does for the sweep, the planner
and the rules check; the layout's rules and dp come from spec.layout.
"""

from __future__ import annotations

from argparse import Namespace
from dataclasses import dataclass
from typing import Any

from nlp_bench.errors import SpecError
from nlp_bench.spec.layout import data_parallel_size, parallel_violations, tiles, virtual_stages
from nlp_bench.spec.models import SHAPE, ModelSpec, from_flags, pad_vocab
from nlp_bench.spec.switches import Switches, decode
from nlp_bench.train.args import UsageError, flag_values, moe_layers
from nlp_bench.train.lr_schedule import LRSchedule, from_args
from nlp_bench.train.mlperf_log import check_path

#: flags that must agree between the run that saved a checkpoint and the run that loads it
CHECKPOINT_SHAPE = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
                    "seq_length", "vocab_size", "tensor_model_parallel_size", "pipeline_model_parallel_size", "swiglu",
                    "normalization", "add_bias_linear", "untie_embeddings_and_output_weights",
                    "position_embedding_type", "rotary_base", "num_layers_per_virtual_pipeline_stage", "num_experts",
                    "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "expert_model_parallel_size",
                    "expert_tensor_parallel_size")


@dataclass(frozen=True)
class MoEConfig:
    """Mixture of experts as Megatron-core lays it out on one expert-parallel rank (train/moe.py)."""

    num_experts: int
    topk: int
    ffn_hidden_size: int
    #: which layers have experts in place of the dense MLP
    layers: tuple[bool, ...]
    score_function: str = "softmax"
    aux_loss_coeff: float = 0.0
    #: None: dropless
    capacity_factor: float | None = None
    drop_policy: str = "probs"
    #: FFN size of the shared experts, None without them
    shared_ffn_hidden_size: int | None = None


@dataclass(frozen=True)
class GPTConfig:
    """The model one pipeline stage builds its part of."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    seq_length: int
    max_position_embeddings: int
    vocab_padded: int
    #: key/value heads (equal to num_attention_heads: multi-head attention)
    num_query_groups: int
    position_embedding_type: str = "learned_absolute"
    rotary_base: int = 10000
    add_bias_linear: bool = True
    init_method_std: float = 0.02
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    layernorm_epsilon: float = 1e-5
    use_flash_attn: bool = False
    masked_softmax_fusion: bool = True  # False: attention as explicit matmul, mask and softmax
    normalization: str = "LayerNorm"  # or "RMSNorm"
    swiglu: bool = False
    untie_embeddings: bool = False
    recompute: str = "none"  # activation recompute: none | selective | full
    recompute_method: str = "uniform"
    recompute_num_layers: int = 1
    seed: int = 1234
    moe: MoEConfig | None = None


@dataclass(frozen=True)
class ParallelConfig:
    world: int
    tp: int
    pp: int
    dp: int
    #: model chunks per pipeline rank (interleaved 1F1B when above 1) and the layers in each
    chunks: int
    layers_per_chunk: int
    sequence_parallel: bool
    distributed_optimizer: bool
    backend: str
    #: elements per data-parallel gradient bucket
    bucket_size: int
    #: expert parallelism and the experts' tensor parallelism (MoE; 1 and tp for a dense model)
    ep: int = 1
    etp: int = 1


@dataclass(frozen=True)
class BatchConfig:
    micro_batch_size: int
    global_batch_size: int
    #: micro-batches per iteration on each data-parallel rank (gradient accumulation)
    micro_batches: int
    seq_length: int


@dataclass(frozen=True)
class OptimizerConfig:
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    clip_grad: float
    #: fp16's dynamic loss scale (initial scale, window, hysteresis, minimum); None in bf16 and fp32
    loss_scale: tuple[float, int, int, float] | None


@dataclass(frozen=True)
class DataConfig:
    mock: bool
    path: str | None
    split: str
    vocab_size: int
    seed: int


@dataclass(frozen=True)
class RunControl:
    """How long to train and when to evaluate, save and stop."""

    iterations: int
    #: the schedule counts samples (--train-samples) rather than iterations
    in_samples: bool
    log_interval: int
    eval_interval: int
    eval_iters: int
    save: str | None
    load: str | None
    save_interval: int | None
    exit_interval: int | None
    exit_duration_in_mins: float | None
    exit_signal_handler: bool
    inject_inf_grad_at_iteration: int | None


@dataclass(frozen=True)
class BoardConfig:
    """Where the run's figures go besides the log line: Megatron's TensorBoard switches, and an MLPerf
    logging event file."""

    folder: str | None
    queue_size: int
    timers: bool
    batch_size: bool
    validation_ppl: bool
    mlperf_log: str | None = None


@dataclass(frozen=True)
class ProfileConfig:
    enabled: bool
    ranks: tuple[int, ...]
    start: int
    end: int
    folder: str


@dataclass(frozen=True)
class TrainConfig:
    model: GPTConfig
    switches: Switches
    parallel: ParallelConfig
    batch: BatchConfig
    optimizer: OptimizerConfig
    schedule: LRSchedule
    data: DataConfig
    control: RunControl
    board: BoardConfig
    profile: ProfileConfig
    #: the values of CHECKPOINT_SHAPE, kept in and compared with a checkpoint
    checkpoint_shape: dict[str, Any]
    #: the model the flags describe, as the rest of nlp-bench names it (FLOPs, parameters)
    spec: ModelSpec


def _layout(args: Namespace, on: Switches, world: int) -> tuple[ParallelConfig, BatchConfig]:
    """The parallel sizes and the batch, or a UsageError naming the rule the layout breaks. Runs before any
    process group exists, so a bad layout costs no rendezvous."""
    tp, pp, mbs = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.micro_batch_size
    dp = data_parallel_size(world, tp, pp) if tiles(world, tp, pp) else 1
    gbs = mbs * dp if args.global_batch_size is None else args.global_batch_size
    broken = parallel_violations(
        world=world, tp=tp, pp=pp, num_layers=args.num_layers, num_attention_heads=args.num_attention_heads,
        ffn_hidden_size=args.ffn_hidden_size, hidden_size=args.hidden_size, seq_length=args.seq_length,
        sequence_parallel=on.sequence_parallel, layers_per_chunk=on.layers_per_virtual_stage,
        micro_batch_size=mbs, global_batch_size=gbs, devices="ranks", num_query_groups=args.num_query_groups,
        ep=args.expert_model_parallel_size, etp=args.expert_tensor_parallel_size, num_experts=args.num_experts)
    if broken:
        raise UsageError(broken[0].message)
    chunks = on.model_chunks(args.num_layers, pp)
    parallel = ParallelConfig(world, tp, pp, dp, chunks, args.num_layers // virtual_stages(pp, chunks), on.sequence_parallel,
                              on.distributed_optimizer, args.distributed_backend,
                              args.ddp_bucket_size or max(40_000_000, 1_000_000 * dp), args.expert_model_parallel_size,
                              args.expert_tensor_parallel_size or 1)
    return parallel, BatchConfig(mbs, gbs, gbs // (mbs * dp), args.seq_length)


def _check_expert_layout(parallel: ParallelConfig) -> None:
    """What the trainer's expert grid (train/moe.py) cannot run. Experts spread beyond the dense layout's own
    shards (ep > 1, or an expert tp other than 1 and tp) have their own gradient group, which the
    distributed optimizer's shards do not know yet."""
    tp, ep, etp = parallel.tp, parallel.ep, parallel.etp
    if tp > 1 and not parallel.sequence_parallel and (ep > 1 or etp not in (1, tp)):
        raise UsageError(f"expert parallelism (ep {ep}, expert tp {etp}) with --tensor-model-parallel-size {tp} "
                         "needs --sequence-parallel: each tp rank then routes its own tokens (as Megatron-core "
                         "trains MoE)")
    if ep > 1 or etp not in (1, tp):
        if parallel.distributed_optimizer:
            raise UsageError(f"--use-distributed-optimizer with expert parallelism (ep {ep}, expert tp {etp}) is not "
                             "built yet in this trainer: use it with ep 1 and expert tp 1 or tp")


def _moe(args: Namespace) -> MoEConfig | None:
    if args.num_experts is None:
        return None
    return MoEConfig(args.num_experts, args.moe_router_topk, args.moe_ffn_hidden_size,
                     tuple(moe_layers(args.moe_layer_freq, args.num_layers)), args.moe_router_score_function,
                     args.moe_aux_loss_coeff, args.moe_expert_capacity_factor, args.moe_token_drop_policy,
                     args.moe_shared_expert_intermediate_size)


def _model(args: Namespace, on: Switches, tp: int) -> GPTConfig:
    return GPTConfig(
        **{name: getattr(args, name) for name in SHAPE},
        vocab_padded=pad_vocab(args.vocab_size, tp, args.make_vocab_size_divisible_by),
        num_query_groups=args.num_query_groups, position_embedding_type=args.position_embedding_type,
        rotary_base=args.rotary_base, add_bias_linear=args.add_bias_linear, init_method_std=args.init_method_std,
        hidden_dropout=args.hidden_dropout, attention_dropout=args.attention_dropout,
        layernorm_epsilon=args.layernorm_epsilon, use_flash_attn=on.flash_attention,
        masked_softmax_fusion=on.masked_softmax_fusion, normalization=args.normalization, swiglu=args.swiglu,
        untie_embeddings=args.untie_embeddings_and_output_weights, recompute=on.recompute,
        recompute_method=on.recompute_method or "uniform", recompute_num_layers=on.recompute_num_layers or 1,
        seed=args.seed, moe=_moe(args))


def build_config(args: Namespace, world: int) -> TrainConfig:
    """The whole tree, or a UsageError for a flag combination that cannot run."""
    try:
        on = decode(flag_values(args))
    except SpecError as exc:
        raise UsageError(str(exc)) from None
    if args.num_experts is not None and on.recompute == "full":
        raise UsageError("--num-experts with full activation recompute is not built yet (selective works)")
    parallel, batch = _layout(args, on, world)
    if args.num_experts is not None:
        _check_expert_layout(parallel)
    if args.mlperf_log is not None and (why := check_path(args.mlperf_log)):
        raise UsageError(why)
    schedule, iterations, in_samples = from_args(args, batch.global_batch_size)
    loss_scale = ((args.initial_loss_scale, args.loss_scale_window, args.hysteresis, args.min_loss_scale)
                  if on.precision == "fp16" else None)
    return TrainConfig(
        model=_model(args, on, parallel.tp), switches=on, parallel=parallel, batch=batch,
        optimizer=OptimizerConfig((args.adam_beta1, args.adam_beta2), args.adam_eps, args.weight_decay,
                                  args.clip_grad, loss_scale),
        schedule=schedule,
        data=DataConfig(args.mock_data, args.data_path[0] if args.data_path else None, args.split, args.vocab_size,
                        args.seed),
        control=RunControl(iterations, in_samples, args.log_interval, args.eval_interval, args.eval_iters, args.save,
                           args.load, args.save_interval, args.exit_interval, args.exit_duration_in_mins,
                           args.exit_signal_handler, args.inject_inf_grad_at_iteration),
        board=BoardConfig(args.tensorboard_dir, args.tensorboard_queue_size, args.log_timers_to_tensorboard,
                          args.log_batch_size_to_tensorboard, args.log_validation_ppl_to_tensorboard,
                          args.mlperf_log),
        profile=ProfileConfig(args.profile, tuple(args.profile_ranks or [0]), args.profile_step_start,
                              args.profile_step_end, args.tensorboard_dir or "profile"),
        checkpoint_shape={name: getattr(args, name) for name in CHECKPOINT_SHAPE},
        spec=from_flags("trainer", flag_values(args), args.vocab_size))
