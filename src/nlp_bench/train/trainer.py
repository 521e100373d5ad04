"""The trainer: `setup` builds what a run needs from the config (data, kernels, process groups, this rank's
model chunks, the gradient buffer and the optimizer, the log); `Trainer.step` runs one iteration with the
pipeline schedule; `Trainer.fit` is the loop around it (log, evaluate, save, stop)."""

from __future__ import annotations

import math
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from nlp_bench import flops, kernels
from nlp_bench.errors import BenchError
from nlp_bench.spec.layout import virtual_stages
from nlp_bench.train import checkpoint, collectives, moe, pipeline
from nlp_bench.train.args import UsageError, parse_args
from nlp_bench.train.batches import IndexedData, MockData
from nlp_bench.train.config import RunControl, TrainConfig, build_config
from nlp_bench.train.grad_buffer import GradBuffer
from nlp_bench.train.layers import TensorParallel
from nlp_bench.train.logline import IntervalLog
from nlp_bench.train.model import GPTStage, ModelChunks
from nlp_bench.train.optimizer import FlatAdam, LossScaler
from nlp_bench.train.process_groups import ProcessGroups, build_process_groups
from nlp_bench.train.profiling import StepProfiler
from nlp_bench.train.rng import ParallelRNG
from nlp_bench.train.xla import XlaRuntime, refuse_downcasts

PRECISION_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def say_once(groups: ProcessGroups, text: str) -> None:
    """A line of the trainer's own, once (from rank 0)."""
    if groups.rank == 0:
        print(f"nlp-bench trainer: {text}", flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(backend: str, xla: XlaRuntime | None = None) -> torch.device:
    """Join the process group torchrun describes (or a group of one when run by hand)."""
    if backend == "nccl" and not torch.cuda.is_available():
        raise UsageError("--distributed-backend nccl needs CUDA GPUs; use --distributed-backend gloo on CPU")
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
    if xla is not None:
        return xla.start()
    if backend == "neuron":
        return _start_neuron()
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


#: What --distributed-backend neuron needs: TorchNeuron, the native PyTorch backend of Neuron 2.33 (public beta,
#: trn2 and trn3), torch-neuronx 2.13 or 2.14 beside the torch of the same version.
NEURON_NATIVE = "TorchNeuron (torch-neuronx 2.13 or later with the torch of its version, Neuron 2.33+, trn2/trn3)"


def _start_neuron() -> torch.device:
    """Trainium as a PyTorch device: importing torch_neuronx registers the `neuron` device and process-group
    backend; each process's device is its logical NeuronCore, as Neuron's torch.distributed guide runs it under
    torchrun. The torch-xla based torch-neuronx (2.9 and before) has the same import name and neither."""
    try:
        import torch_neuronx  # noqa: F401
    except ImportError:
        raise UsageError(f"--distributed-backend neuron needs {NEURON_NATIVE}; it is not installed") from None
    if not dist.is_backend_available("neuron"):
        raise UsageError(f"--distributed-backend neuron needs {NEURON_NATIVE}; this torch_neuronx registers no "
                         "neuron backend (the torch-xla based one runs --distributed-backend xla)")
    dist.init_process_group(backend="neuron")
    return torch.device("neuron")


class SignalFlag:
    """Notes a termination signal instead of dying on it, so the loop can finish the iteration and save."""

    def __init__(self, signums: list[int]) -> None:
        self.received: int | None = None
        for signum in signums:
            signal.signal(signum, self._note)

    def _note(self, signum, _frame) -> None:
        self.received = signum


def exit_reason(control: RunControl, iteration: int, t_start: float, signals: SignalFlag | None,
                groups: ProcessGroups) -> str | None:
    """Why training stops after this iteration, agreed by all ranks (any rank's reason stops all)."""
    reasons = []
    if control.exit_interval and iteration % control.exit_interval == 0:
        reasons.append(f"--exit-interval {control.exit_interval}")
    if control.exit_duration_in_mins is not None:
        elapsed = (time.perf_counter() - t_start) / 60.0
        if collectives.any_true(elapsed > control.exit_duration_in_mins, groups.host):
            reasons.append(f"--exit-duration-in-mins {control.exit_duration_in_mins:g}")
    if signals is not None and collectives.any_true(signals.received is not None, groups.host):
        reasons.append("termination signal" if signals.received is None
                       else f"signal {signal.Signals(signals.received).name}")
    return ", ".join(reasons) or None


def load_data(config: TrainConfig):
    """The training split and the validation split (None without evaluation); a missing or corrupt dataset
    is found here, before any process group starts."""
    data, control, batch = config.data, config.control, config.batch
    evaluations = control.iterations // control.eval_interval + 1 if control.eval_iters > 0 else 0
    try:
        if data.mock:
            return (MockData(data.vocab_size, batch.seq_length, data.seed),
                    MockData(data.vocab_size, batch.seq_length, data.seed + 1) if evaluations else None)
        train = IndexedData(data.path, data.split, "train", batch.seq_length,
                            control.iterations * batch.global_batch_size, data.seed)
        valid = (IndexedData(data.path, data.split, "valid", batch.seq_length,
                             evaluations * control.eval_iters * batch.global_batch_size, data.seed)
                 if evaluations else None)
        return train, valid
    except BenchError as exc:
        raise UsageError(str(exc)) from None


def build_model(config: TrainConfig, groups: ProcessGroups, device: torch.device,
                dtype: torch.dtype) -> tuple[ModelChunks, ParallelRNG]:
    """This rank's model chunks: chunk c is virtual stage c * pp + pp_rank."""
    cfg, per_chunk, chunks = config.model, config.parallel.layers_per_chunk, config.parallel.chunks
    tp = TensorParallel(groups.tp, groups.tp_rank, groups.tp_group, config.switches.sequence_parallel)
    rng = ParallelRNG(cfg.seed, groups.tp_rank, device)
    model = ModelChunks()
    for c in range(chunks):
        index = c * groups.pp + groups.pp_rank
        model.append(GPTStage(cfg, tp, rng, index * per_chunk, per_chunk, index == 0,
                              index == virtual_stages(groups.pp, chunks) - 1, groups.experts))
    return model.to(device=device, dtype=dtype), rng


@dataclass
class StepNumbers:
    """The step's numbers for the host: the mean loss of its micro-batches (off the last stage, none) and,
    where the optimizer left them on the device, the skip flag and the gradient norm. Packed into one tensor
    before the step's graph runs, so that graph computes it and reading it afterwards is one transfer and no
    further graph."""

    packed: torch.Tensor | None
    has_loss: bool
    skipped: bool | torch.Tensor
    norm: float | torch.Tensor

    @classmethod
    def pack(cls, losses: list[torch.Tensor], skipped: bool | torch.Tensor, norm: float | torch.Tensor) -> StepNumbers:
        on_device = isinstance(skipped, torch.Tensor)
        values = ([torch.stack(losses).float().mean()] if losses else []) + ([skipped, norm] if on_device else [])
        packed = torch.stack([v.float().reshape(()) for v in values]) if values else None
        return cls(packed, bool(losses), skipped, norm)

    def read(self) -> tuple[float | None, bool, float]:
        """(loss, skipped, norm; NaN for a skipped step, as Megatron logs it)."""
        read = self.packed.tolist() if self.packed is not None else []
        loss = read.pop(0) if self.has_loss else None
        skipped, norm = (read[0] > 0, read[1]) if isinstance(self.skipped, torch.Tensor) else (self.skipped, self.norm)
        return loss, bool(skipped), float("nan") if skipped else float(norm)


@dataclass
class Trainer:
    config: TrainConfig
    groups: ProcessGroups
    device: torch.device
    xla: XlaRuntime | None
    model: ModelChunks
    rng: ParallelRNG
    buffer: GradBuffer
    optimizer: FlatAdam
    data: object
    valid: object | None
    log: IntervalLog
    profiler: StepProfiler
    #: the first iteration to run is start + 1 (a loaded checkpoint's); position: the schedule's, in its unit
    start: int = 0
    position: int = 0
    norm: float = 0.0
    #: validation runs so far (each reads its own batches)
    evaluated: int = 0
    #: the most micro-batches' activations the first pipeline stage held at once
    in_flight: int = 0
    #: (token, expert) pairs this rank's MoE layers dropped past an expert's capacity
    dropped: int = 0

    @property
    def dtype(self) -> torch.dtype:
        return PRECISION_DTYPES[self.config.switches.precision]

    @property
    def activation_shape(self) -> tuple[int, ...]:
        seq = self.config.batch.seq_length
        tp = self.groups.tp if self.config.switches.sequence_parallel else 1
        return seq // tp, self.config.batch.micro_batch_size, self.config.model.hidden_size

    def say(self, text: str) -> None:
        say_once(self.groups, text)

    def batches(self, source, first: int) -> list:
        """This dp rank's micro-batches of the global batch that starts at sample `first`, on the device."""
        mbs, gas = self.config.batch.micro_batch_size, self.config.batch.micro_batches
        first += self.groups.dp_rank * gas * mbs
        batches = [source.batch(first + i * mbs, mbs) for i in range(gas)]
        if self.xla is not None:
            return self.xla.to_device(batches, self.device)
        return [tuple(t.to(self.device) for t in b) for b in batches]

    def step(self, iteration: int) -> pipeline.IterationStats:
        """One iteration: every micro-batch forward and backward, the gradients reduced, the update; on xla
        one graph, whose numbers the host reads once it ran."""
        self.profiler.before(iteration)
        if self.xla is not None:
            self.xla.begin_step(iteration)
        lr = self.config.schedule.at(self.position)
        self.buffer.zero()
        first = (iteration - 1) * self.config.batch.global_batch_size
        if self.log.mlperf is not None:
            self.log.mlperf.training(first)
        batches = self.batches(self.data, first)
        moe.set_aux_loss_scale(self.optimizer.loss_scale / len(batches))
        stats = pipeline.run(self.model, self.groups, batches, self.optimizer.loss_scale, self.activation_shape,
                             self.dtype, self.device)
        if self.config.control.inject_inf_grad_at_iteration == iteration:
            self.buffer.main_grad.fill_(float("inf"))
        numbers = StepNumbers.pack(stats.losses, *self.optimizer.step(lr))
        if self.xla is not None:
            self.xla.sync()  # the step's graph runs here
        loss, skipped, norm = numbers.read()
        if self.xla is not None:
            self.xla.end_step()
        self.optimizer.update_scale(skipped)
        if not skipped:
            self.position += self.config.batch.global_batch_size if self.config.control.in_samples else 1
            self.norm = norm
        self.in_flight = max(self.in_flight, stats.max_in_flight)
        balance, layers_run, dropped = moe.drain(self.model)
        self.dropped += dropped
        self.log.add([] if loss is None else [loss], skipped, balance, layers_run)
        self.profiler.after(iteration)
        return stats

    def evaluate(self, iteration: int) -> None:
        """--eval-iters global batches of the validation split, forward only; Megatron's validation lines on
        the last rank. Not counted as iteration time."""
        t_eval, control, gbs = time.perf_counter(), self.config.control, self.config.batch.global_batch_size
        self.model.eval()
        losses: list[torch.Tensor] = []
        for j in range(control.eval_iters):
            batches = self.batches(self.valid, (self.evaluated * control.eval_iters + j) * gbs)
            losses += pipeline.forward_only(self.model, self.groups, batches, self.activation_shape, self.dtype,
                                            self.device)
            if self.xla is not None:
                self.xla.sync()  # one graph per validation batch
        self.model.train()
        values = torch.stack(losses).float().tolist() if losses else []  # one read, after the graphs ran
        sums = torch.tensor([math.fsum(values), float(len(values))], dtype=torch.float64)
        collectives.all_reduce(sums, self.groups.host_dp)
        if self.groups.rank == self.groups.world - 1:
            loss = sums[0].item() / max(sums[1].item(), 1.0)
            line = (f" validation loss at iteration {iteration} | lm loss value: {loss:.6E} |"
                    f" lm loss PPL: {math.exp(min(20.0, loss)):.6E} |")
            print("-" * len(line), line, "-" * len(line), sep="\n", flush=True)
            self.log.validation(iteration, loss)
        self.evaluated += 1
        self.log.exclude(time.perf_counter() - t_eval)

    def save(self, iteration: int) -> None:
        t_save = time.perf_counter()
        folder = checkpoint.save_shards(self.config.control.save, iteration, self.position,
                                        self.config.checkpoint_shape, self.groups, self.model, self.optimizer, self.rng)
        self.say(f"saved checkpoint {folder} in {time.perf_counter() - t_save:.1f} s")
        self.log.exclude(time.perf_counter() - t_save)  # as Megatron: saving is not iteration time

    def fit(self) -> int:
        """Train to the last iteration or the first reason to stop; 0 when done."""
        control = self.config.control
        signals = SignalFlag([signal.SIGTERM, signal.SIGUSR2]) if control.exit_signal_handler else None
        t_start, iteration = time.perf_counter(), self.start
        self.model.train()
        for iteration in range(self.start + 1, control.iterations + 1):
            self.step(iteration)
            last = iteration == control.iterations
            if iteration % control.log_interval == 0 or last:
                if self.device.type == "cuda":  # the interval's time includes its kernels
                    torch.cuda.synchronize()
                elif self.device.type == "neuron":
                    torch.accelerator.synchronize()
                self.log.emit(iteration, control.iterations, self.config.schedule.at(self.position),
                              self.optimizer.loss_scale, self.norm)
            if self.valid is not None and (iteration % control.eval_interval == 0 or last):
                self.evaluate(iteration)
            stop = exit_reason(control, iteration, t_start, signals, self.groups)
            if control.save and (stop or last or (control.save_interval and iteration % control.save_interval == 0)):
                self.save(iteration)
            if stop:
                self.say(f"stopping after iteration {iteration}: {stop}")
                break
        self.log.close(iteration, iteration == control.iterations)
        self._finish(iteration, time.perf_counter() - t_start)
        return 0

    def _finish(self, iteration: int, seconds: float) -> None:
        if self.xla is not None:
            self.say(self.xla.summary())
        self.say(f"finished at iteration {iteration} of {self.config.control.iterations} after {seconds:.1f} s; the "
                 f"first pipeline stage held at most {self.in_flight} forward passes' activations at once; "
                 f"{self.buffer.overlapped} of {len(self.buffer.buckets) * (iteration - self.start)} data-parallel "
                 "gradient buckets were reduced during the backward pass")
        if self.config.model.moe is not None and self.config.model.moe.capacity_factor is not None:
            dropped = torch.tensor([float(self.dropped)], dtype=torch.float64)
            collectives.all_reduce(dropped, self.groups.host)
            pairs = int(dropped.item()) // self.groups.tp  # the tp ranks route the same tokens
            self.say(f"the experts' capacity dropped {pairs} routed (token, expert) pairs")
        dist.barrier(group=self.groups.host)
        dist.destroy_process_group()


def _introduce(config: TrainConfig, groups: ProcessGroups, device: torch.device, model: ModelChunks) -> None:
    """What runs, in the log's first lines: software, layout, model, kernels, FLOPs convention, data."""
    on, batch, cfg = config.switches, config.batch, config.model
    libraries = (f" (CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))})"
                 if torch.cuda.is_available() else "")
    say_once(groups, f"torch {torch.__version__}{libraries}, backend {config.parallel.backend}, device {device.type}, "
        f"{torch.get_num_threads()} threads per rank, {on.precision}")
    say_once(groups, f"world {groups.world} = tp {groups.tp} x pp {groups.pp} x dp {groups.dp}; micro batch "
        f"{batch.micro_batch_size}, {batch.micro_batches} micro-batches per iteration, global batch "
        f"{batch.global_batch_size}, sequence {batch.seq_length}; sequence parallel "
        f"{'on' if on.sequence_parallel else 'off'}, distributed optimizer "
        f"{'on' if on.distributed_optimizer else 'off'}, recompute {on.recompute}")
    say_once(groups, f"model {config.spec.description()}, vocab {config.data.vocab_size} padded to {cfg.vocab_padded}, "
        f"{sum(p.numel() for p in model.parameters()):,} parameters on rank 0")
    if cfg.moe is not None:
        m = cfg.moe
        say_once(groups, f"experts: {m.num_experts} routed, top-{m.topk} by {m.score_function}, expert ffn "
            f"{m.ffn_hidden_size}, shared ffn {m.shared_ffn_hidden_size or 'none'}, MoE layers "
            f"{[i for i, on_ in enumerate(m.layers) if on_]}, aux loss coefficient {m.aux_loss_coeff}, "
            + ("dropless" if m.capacity_factor is None else f"capacity factor {m.capacity_factor} "
               f"(drop by {m.drop_policy})") + f"; expert parallel {config.parallel.ep}, expert tp "
            f"{config.parallel.etp}")
    attention = ("scaled_dot_product_attention" if on.masked_softmax_fusion
                 else "unfused (--no-masked-softmax-fusion)")
    say_once(groups, f"{kernels.describe()}; attention {attention}")
    convention = flops.log_convention(config.spec.flops_shape(batch.global_batch_size, cfg.vocab_padded))
    say_once(groups, f"TFLOPs in the log use the {convention} convention; training {config.control.iterations} iterations on "
        f"{'mock data' if config.data.mock else config.data.path}")


def _interval_log(config: TrainConfig, groups: ProcessGroups, device: torch.device) -> IntervalLog:
    """The log line's bookkeeping, with the FLOPs per iteration and (on GPUs) one energy meter per node."""
    cfg, on, batch = config.model, config.switches, config.batch
    shape = config.spec.flops_shape(batch.global_batch_size, cfg.vocab_padded, recompute=on.recomputes)
    meter = None
    if device.type == "cuda" and os.environ.get("LOCAL_RANK", "0") == "0":
        from nlp_bench.train.energy import EnergyMeter

        meter = EnergyMeter()
        say_once(groups, f"energy: {meter.mode or 'not measured'}" + (f" ({meter.reason})" if meter.reason else ""))
    per_iteration = flops.CONVENTIONS[flops.log_convention(shape)](shape)
    return IntervalLog(groups, batch.global_batch_size, batch.seq_length, per_iteration, config.board,
                       energy=device.type == "cuda", meter=meter, moe=cfg.moe is not None)


def setup(config: TrainConfig) -> Trainer:
    """Everything a run needs, in the order that finds a user's mistake before any process group starts:
    data, kernel choice, xla; then the groups, the model, the optimizer, a checkpoint to resume from."""
    init_ms = int(time.time() * 1000)
    data, valid = load_data(config)
    try:
        kernels.configure(config.switches.unfused, persist_layer_norm=config.switches.persist_layer_norm)
        kernels.describe()  # NLP_BENCH_KERNELS is read and checked here, before any process group
    except kernels.KernelChoiceError as exc:
        raise UsageError(str(exc)) from None
    xla = None
    if config.parallel.backend == "xla":
        refuse_downcasts()
        xla = XlaRuntime()  # torch_xla missing: one line, here
    device = init_distributed(config.parallel.backend, xla)
    groups = build_process_groups(config.parallel.tp, config.parallel.pp,
                                  host_backend="gloo" if device.type in ("xla", "neuron") else None,
                                  ep=config.parallel.ep, etp=config.parallel.etp)
    torch.manual_seed(config.model.seed + 100 * groups.pp_rank)
    if xla is not None:
        xla.seed(config.model.seed + 100 * groups.pp_rank)
    model, rng = build_model(config, groups, device, PRECISION_DTYPES[config.switches.precision])
    buffer = GradBuffer(model, groups, shards=groups.dp if config.switches.distributed_optimizer else 1,
                        micro_batches=config.batch.micro_batches, bucket_size=config.parallel.bucket_size)
    opt = config.optimizer
    scaler = LossScaler(*opt.loss_scale) if opt.loss_scale else None
    optimizer = FlatAdam(buffer, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay,
                         clip_grad=opt.clip_grad, scaler=scaler, on_device=xla is not None)
    _introduce(config, groups, device, model)
    start, position = 0, 0
    if config.control.load:
        start, position = checkpoint.restore_latest(config.control.load, config.checkpoint_shape, groups, model,
                                                    optimizer, rng)
        if start:
            say_once(groups, f"resumed from {config.control.load} at iteration {start}")
    profiler = StepProfiler(config.profile, groups.rank, device.type,
                            lambda text: print(f"nlp-bench trainer: {text}", flush=True))
    log = _interval_log(config, groups, device)
    if log.mlperf is not None:
        log.mlperf.started(init_ms, _mlperf_settings(config))
    return Trainer(config, groups, device, xla, model, rng, buffer, optimizer, data, valid, log, profiler,
                   start=start, position=position,
                   evaluated=start // config.control.eval_interval if valid is not None else 0)


def _mlperf_settings(config: TrainConfig) -> dict:
    """The run's settings under MLPerf logging's keys."""
    from nlp_bench.train.mlperf_log import BENCHMARK

    batch, opt = config.batch, config.optimizer
    return {"submission_benchmark": BENCHMARK, "submission_org": "nlp-bench", "submission_division": "open",
            "submission_status": "research", "submission_platform": socket.gethostname(),
            "global_batch_size": batch.global_batch_size, "max_sequence_length": batch.seq_length,
            "gradient_accumulation_steps": batch.micro_batches, "seed": config.data.seed,
            "opt_base_learning_rate": config.schedule.max_lr,
            "opt_adam_beta_1": opt.betas[0], "opt_adam_beta_2": opt.betas[1], "opt_adam_epsilon": opt.eps,
            "opt_gradient_clip_norm": opt.clip_grad, "opt_weight_decay": opt.weight_decay,
            "train_samples": config.control.iterations * batch.global_batch_size,
            "eval_samples": config.control.eval_iters * batch.global_batch_size}


def main(argv: list[str] | None = None) -> int:
    try:
        config = build_config(parse_args(argv), int(os.environ.get("WORLD_SIZE", "1")))
        return setup(config).fit()
    except UsageError as exc:
        print(f"nlp_bench.train: error: {exc}", file=sys.stderr, flush=True)
        return 2
