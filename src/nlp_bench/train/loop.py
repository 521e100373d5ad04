"""The training loop: check the layout, set up the process groups, this rank's model chunks and the optimizer, run
iterations with the schedule, print Megatron's log line."""

from __future__ import annotations

import math
import os
import signal
import socket
import sys
import time
from argparse import Namespace

import torch
import torch.distributed as dist

from nlp_bench import flops, kernels
from nlp_bench.errors import BenchError
from nlp_bench.spec.layout import parallel_violations
from nlp_bench.spec.models import SHAPE, ModelSpec, pad_vocab
from nlp_bench.train import checkpoint, collectives, pipeline
from nlp_bench.train.args import UsageError, parse_args
from nlp_bench.train.batches import IndexedData, MockData
from nlp_bench.train.layers import TensorParallel
from nlp_bench.train.logline import IntervalLog
from nlp_bench.train.lr_schedule import from_args
from nlp_bench.train.model import GPTConfig, GPTStage, ModelChunks
from nlp_bench.train.optimizer import FlatAdam, LossScaler
from nlp_bench.train.process_groups import ProcessGroups, build_process_groups
from nlp_bench.train.profiling import StepProfiler
from nlp_bench.train.rng import ParallelRNG
from nlp_bench.train.xla import STAND_IN, XlaRuntime

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_layout(args: Namespace, world: int) -> int:
    """Gradient-accumulation steps, or a UsageError naming the rule the layout breaks. Runs before any
    process group exists, so a bad layout costs no rendezvous."""
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    dp = world // (tp * pp) if world % (tp * pp) == 0 else 1
    if args.global_batch_size is None:
        args.global_batch_size = args.micro_batch_size * dp
    broken = parallel_violations(
        world=world, tp=tp, pp=pp, num_layers=args.num_layers, num_attention_heads=args.num_attention_heads,
        ffn_hidden_size=args.ffn_hidden_size, hidden_size=args.hidden_size, seq_length=args.seq_length,
        sequence_parallel=args.sequence_parallel, layers_per_chunk=args.num_layers_per_virtual_pipeline_stage,
        micro_batch_size=args.micro_batch_size, global_batch_size=args.global_batch_size, devices="ranks")
    if broken:
        raise UsageError(broken[0].message)
    gas = args.global_batch_size // (args.micro_batch_size * dp)
    return gas


def init_distributed(backend: str, xla: XlaRuntime | None = None) -> torch.device:
    """Join the process group torchrun describes (or a group of one when run by hand)."""
    if backend == "nccl" and not torch.cuda.is_available():
        raise UsageError("--distributed-backend nccl needs CUDA GPUs; use --distributed-backend gloo on CPU")
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
    if xla is not None:
        return xla.start()
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        # GPU tensors go over NCCL, the few CPU scalars (interval loss sums, inf checks, validation loss) over
        # gloo: a group made for "nccl" alone refuses a CPU tensor ("No backend type associated with device
        # type cpu") the first time dp, tp or pp is above 1
        backend = "cpu:gloo,cuda:nccl"
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend=backend)
    return device


class SignalFlag:
    """Notes a termination signal instead of dying on it, so the loop can finish the iteration and save."""

    def __init__(self, signums: list[int]) -> None:
        self.received: int | None = None
        for signum in signums:
            signal.signal(signum, self._note)

    def _note(self, signum, _frame) -> None:
        self.received = signum


def exit_reason(args: Namespace, iteration: int, t_start: float, signals: SignalFlag | None) -> str | None:
    """Why training stops after this iteration, agreed by all ranks (any rank's reason stops all)."""
    reasons = []
    if args.exit_interval and iteration % args.exit_interval == 0:
        reasons.append(f"--exit-interval {args.exit_interval}")
    if args.exit_duration_in_mins is not None:
        elapsed = (time.perf_counter() - t_start) / 60.0
        if collectives.any_true(elapsed > args.exit_duration_in_mins):
            reasons.append(f"--exit-duration-in-mins {args.exit_duration_in_mins:g}")
    if signals is not None and collectives.any_true(signals.received is not None):
        reasons.append("termination signal" if signals.received is None
                       else f"signal {signal.Signals(signals.received).name}")
    return ", ".join(reasons) or None


def evaluate(args: Namespace, groups: ProcessGroups, model: ModelChunks, valid, number: int, iteration: int,
             activation_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, gas: int) -> float | None:
    """--eval-iters global batches of the validation split, forward only; Megatron's validation lines.
    The loss on the last rank (which prints it), None on the others."""
    gbs, mbs = args.global_batch_size, args.micro_batch_size
    model.eval()
    total, count = 0.0, 0
    for j in range(args.eval_iters):
        first = (number * args.eval_iters + j) * gbs + groups.dp_rank * gas * mbs
        batches = [tuple(t.to(device) for t in valid.batch(first + i * mbs, mbs)) for i in range(gas)]
        losses = pipeline.forward_only(model, groups, batches, activation_shape, dtype, device)
        total, count = total + sum(losses), count + len(losses)
    model.train()
    sums = torch.tensor([total, float(count)], dtype=torch.float64)
    collectives.all_reduce(sums, groups.dp_group)
    if groups.rank == groups.world - 1:
        loss = sums[0].item() / max(sums[1].item(), 1.0)
        line = (f" validation loss at iteration {iteration} | lm loss value: {loss:.6E} |"
                f" lm loss PPL: {math.exp(min(20.0, loss)):.6E} |")
        print("-" * len(line), line, "-" * len(line), sep="\n", flush=True)
        return loss
    return None


def unfused_ops(args: Namespace) -> dict[str, str]:
    """The fused ops Megatron's switches turn off, each with the switch (for the log)."""
    off = {"bias_gelu": not args.bias_gelu_fusion, "swiglu": not args.bias_swiglu_fusion,
           "cross_entropy": not args.cross_entropy_loss_fusion}
    flag = {"bias_gelu": "--no-bias-gelu-fusion", "swiglu": "--no-bias-swiglu-fusion",
            "cross_entropy": "--no-cross-entropy-loss-fusion"}
    return {op: flag[op] for op, is_off in off.items() if is_off}


def say(groups: ProcessGroups, text: str) -> None:
    if groups.rank == 0:
        print(f"nlp-bench trainer: {text}", flush=True)


def build_model(args: Namespace, groups: ProcessGroups, device: torch.device,
                dtype: torch.dtype) -> tuple[ModelChunks, ParallelRNG]:
    vocab_padded = pad_vocab(args.vocab_size, groups.tp, args.make_vocab_size_divisible_by)
    cfg = GPTConfig(
        **{name: getattr(args, name) for name in SHAPE}, vocab_padded=vocab_padded,
        position_embedding_type=args.position_embedding_type, init_method_std=args.init_method_std,
        hidden_dropout=args.hidden_dropout, attention_dropout=args.attention_dropout,
        layernorm_epsilon=args.layernorm_epsilon, use_flash_attn=args.use_flash_attn,
        masked_softmax_fusion=args.masked_softmax_fusion, normalization=args.normalization, swiglu=args.swiglu,
        untie_embeddings=args.untie_embeddings_and_output_weights, recompute_granularity=args.recompute_granularity,
        recompute_method=args.recompute_method or "uniform", recompute_num_layers=args.recompute_num_layers or 1,
        seed=args.seed,
    )
    tp = TensorParallel(groups.tp, groups.tp_rank, groups.tp_group, args.sequence_parallel)
    rng = ParallelRNG(args.seed, groups.tp_rank, device)
    per_chunk = args.num_layers_per_virtual_pipeline_stage or args.num_layers // groups.pp
    virtual = args.num_layers // (per_chunk * groups.pp)
    chunks = ModelChunks()
    for c in range(virtual):  # chunk c of this rank is virtual stage c * pp + pp_rank
        index = c * groups.pp + groups.pp_rank
        chunks.append(GPTStage(cfg, tp, rng, index * per_chunk, per_chunk, index == 0, index == virtual * groups.pp - 1))
    return chunks.to(device=device, dtype=dtype), rng


def train(args: Namespace) -> int:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    gas = check_layout(args, world)
    schedule, iterations, in_samples = from_args(args, args.global_batch_size)
    evaluations = iterations // args.eval_interval + 1 if args.eval_iters > 0 else 0
    try:  # a missing or corrupt dataset is found before any process group starts
        if args.mock_data:
            data = MockData(args.vocab_size, args.seq_length, args.seed)
            valid = MockData(args.vocab_size, args.seq_length, args.seed + 1) if evaluations else None
        else:
            data = IndexedData(args.data_path[0], args.split, "train", args.seq_length,
                               iterations * args.global_batch_size, args.seed)
            valid = (IndexedData(args.data_path[0], args.split, "valid", args.seq_length,
                                 evaluations * args.eval_iters * args.global_batch_size, args.seed)
                     if evaluations else None)
    except BenchError as exc:
        raise UsageError(str(exc)) from None
    try:
        kernels.configure(unfused_ops(args), persist_layer_norm=args.persist_layer_norm)
        kernels.describe()  # NLP_BENCH_KERNELS is read and checked here, before any process group
    except kernels.KernelChoiceError as exc:
        raise UsageError(str(exc)) from None
    xla = XlaRuntime() if args.distributed_backend == "xla" else None  # torch_xla missing: one line, here
    device = init_distributed(args.distributed_backend, xla)
    groups = build_process_groups(args.tensor_model_parallel_size, args.pipeline_model_parallel_size)
    gbs, mbs = args.global_batch_size, args.micro_batch_size
    # on xla, XLA_USE_BF16=1 (the Neuron examples' switch) means bf16 as --bf16 does
    xla_bf16 = xla is not None and os.environ.get("XLA_USE_BF16") == "1" and not args.fp16
    precision = "bf16" if args.bf16 or xla_bf16 else "fp16" if args.fp16 else "fp32"
    dtype = DTYPES[precision]
    torch.manual_seed(args.seed + 100 * groups.pp_rank)
    model, rng = build_model(args, groups, device, dtype)
    scaler = (LossScaler(args.initial_loss_scale, args.loss_scale_window, args.hysteresis, args.min_loss_scale)
              if args.fp16 else None)
    optimizer = FlatAdam(model, groups, lr_betas_eps=(args.adam_beta1, args.adam_beta2, args.adam_eps),
                         weight_decay=args.weight_decay, clip_grad=args.clip_grad,
                         distributed=args.use_distributed_optimizer, scaler=scaler, micro_batches=gas,
                         bucket_size=args.ddp_bucket_size or max(40_000_000, 1_000_000 * groups.dp))
    shape = ModelSpec("trainer", **{n: getattr(args, n) for n in SHAPE}).flops_shape(
        gbs, model[0].cfg.vocab_padded, swiglu=args.swiglu, recompute=args.recompute_granularity is not None)
    flops_per_iter = flops.jupiter_flops(shape)
    seq_local = args.seq_length // groups.tp if args.sequence_parallel else args.seq_length
    activation_shape = (seq_local, mbs, args.hidden_size)

    libraries = (f" (CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))})"
                 if torch.cuda.is_available() else "")
    say(groups, f"torch {torch.__version__}{libraries}, backend {args.distributed_backend}, device {device.type}, "
              f"{torch.get_num_threads()} threads per rank, {precision}")
    say(groups, f"world {groups.world} = tp {groups.tp} x pp {groups.pp} x dp {groups.dp}; micro batch {mbs}, {gas} "
              f"micro-batches per iteration, global batch {gbs}, sequence {args.seq_length}; sequence parallel "
              f"{'on' if args.sequence_parallel else 'off'}, distributed optimizer "
              f"{'on' if args.use_distributed_optimizer else 'off'}, recompute {args.recompute_granularity or 'none'}")
    say(groups, f"model {args.num_layers} layers, hidden {args.hidden_size}, {args.num_attention_heads} heads, "
              f"ffn {args.ffn_hidden_size} ({'SwiGLU' if args.swiglu else 'GeLU'}), vocab {args.vocab_size} padded "
              f"to {model[0].cfg.vocab_padded}, {sum(p.numel() for p in model.parameters()):,} parameters on rank 0, "
              f"position embedding {args.position_embedding_type}")
    say(groups, f"{kernels.describe()}; attention "
              f"{'scaled_dot_product_attention' if args.masked_softmax_fusion else 'unfused (--no-masked-softmax-fusion)'}")
    say(groups, f"TFLOPs in the log use the {flops.JUPITER} convention; training {iterations} iterations on "
              f"{'mock data' if args.mock_data else args.data_path[0]}")

    start, step = checkpoint.load(args.load, args, groups, model, optimizer, rng) if args.load else (0, 0)
    if start:
        say(groups, f"resumed from {args.load} at iteration {start}")
    meter = None
    if device.type == "cuda" and os.environ.get("LOCAL_RANK", "0") == "0":  # one meter per node
        from nlp_bench.train.energy import EnergyMeter

        meter = EnergyMeter()
        say(groups, f"energy: {meter.mode or 'not measured'}" + (f" ({meter.reason})" if meter.reason else ""))
    log = IntervalLog(groups, gbs, args.seq_length, flops_per_iter, args, energy=device.type == "cuda", meter=meter)
    norm, in_flight, iteration = 0.0, 0, start
    evaluated = start // args.eval_interval if valid is not None else 0
    signals = SignalFlag([signal.SIGTERM, signal.SIGUSR2]) if args.exit_signal_handler else None
    profiler = StepProfiler(args, groups.rank, device.type, lambda text: print(f"nlp-bench trainer: {text}", flush=True))
    t_start = time.perf_counter()
    model.train()
    for iteration in range(start + 1, iterations + 1):
        profiler.before(iteration)
        lr = schedule.at(step)
        optimizer.zero_grad()
        first = (iteration - 1) * gbs + groups.dp_rank * gas * mbs
        batches = [data.batch(first + i * mbs, mbs) for i in range(gas)]
        batches = xla.to_device(batches, device) if xla else [tuple(t.to(device) for t in b) for b in batches]
        stats = pipeline.run(model, groups, batches, optimizer.loss_scale, activation_shape, dtype, device)
        in_flight = max(in_flight, stats.max_in_flight)
        if args.inject_inf_grad_at_iteration == iteration:
            optimizer.main_grad.fill_(float("inf"))
        skipped, step_norm = optimizer.step(lr)
        if xla is not None:
            xla.sync()  # the step's graph runs here
        if not skipped:
            step += gbs if in_samples else 1
            norm = step_norm
        log.add(stats.losses, skipped)
        profiler.after(iteration)
        if iteration % args.log_interval == 0 or iteration == iterations:
            if device.type == "cuda":
                torch.cuda.synchronize()
            log.emit(iteration, iterations, schedule.at(step), optimizer.loss_scale, norm)
        if valid is not None and (iteration % args.eval_interval == 0 or iteration == iterations):
            t_eval = time.perf_counter()
            loss = evaluate(args, groups, model, valid, evaluated, iteration, activation_shape, dtype, device, gas)
            if loss is not None:
                log.validation(iteration, loss)
            evaluated += 1
            log.exclude(time.perf_counter() - t_eval)  # evaluation is not iteration time
        stop = exit_reason(args, iteration, t_start, signals)
        if args.save and (stop or iteration == iterations
                          or (args.save_interval and iteration % args.save_interval == 0)):
            t_save = time.perf_counter()
            folder = checkpoint.save(args.save, iteration, step, args, groups, model, optimizer, rng)
            say(groups, f"saved checkpoint {folder} in {time.perf_counter() - t_save:.1f} s")
            log.exclude(time.perf_counter() - t_save)  # as Megatron: saving is not iteration time
        if stop:
            say(groups, f"stopping after iteration {iteration}: {stop}")
            break
    log.close()
    if xla is not None:
        say(groups, f"xla: {xla.syncs} step graph executions{' (CPU stand-in, ' + STAND_IN + '=1)' if xla.stand_in else ''}")
    say(groups, f"finished at iteration {iteration} of {iterations} after {time.perf_counter() - t_start:.1f} s; the "
              f"first pipeline stage held at most {in_flight} forward passes' activations at once; "
              f"{optimizer.overlapped} of {len(optimizer.buckets) * (iteration - start)} data-parallel gradient "
              f"buckets were reduced during the backward pass")
    dist.barrier()
    dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        return train(parse_args(argv))
    except UsageError as exc:
        print(f"nlp_bench.train: error: {exc}", file=sys.stderr, flush=True)
        return 2
