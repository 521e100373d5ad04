"""The iteration log line, in the shape of Megatron-LM with the JUPITER benchmark's TFLOPs patch.

Writing the exact shape the reference logs have means one parser reads our runs and theirs, and a
reader can put our job.out beside a Megatron one.
"""

from __future__ import annotations

import math


def iteration_line(*, iteration: int, total: int, consumed: int, seconds: float, lr: float, global_batch: int,
                   seq_length: int, loss: float, loss_scale: float, grad_norm: float, skipped: int, nan: int,
                   tflops: float, energy_j: float | None = None, balance: float | None = None) -> str:
    """Megatron's fields in Megatron's order, plus tokens per second (Megatron never prints it) and, where
    the GPUs' energy is measured, the joules the job's GPUs used over the interval. `balance`: the MoE
    load-balancing loss without its coefficient, where Megatron-core's MoE metrics put it."""
    energy = "" if energy_j is None else f" energy (J): {energy_j:.1f} |"
    moe = "" if balance is None else f" load_balancing_loss: {balance:.6E} |"
    return (
        f" iteration {iteration:8d}/{total:8d} | consumed samples: {consumed:12d} |"
        f" elapsed time per iteration (s): {seconds:.4f} | learning rate: {lr:.3E} |"
        f" global batch size: {global_batch:5d} | lm loss: {loss:.6E} |{moe} loss scale: {loss_scale:.1f} |"
        f" grad norm: {grad_norm:.3f} | number of skipped iterations: {skipped:3d} |"
        f" number of nan iterations: {nan:3d} | samples per second: {global_batch / seconds:.3f} |"
        f" tokens per second: {global_batch * seq_length / seconds:.1f} | TFLOPs: {tflops:.2f} |{energy}"
    )


class IntervalLog:
    """One log interval's bookkeeping: losses (averaged over dp, as Megatron reports them), skipped and
    NaN iterations, and wall time without evaluation or checkpoint saving. `emit` prints the line, and
    writes the TensorBoard scalars, on the last rank. `board` holds Megatron's TensorBoard switches
    (config.BoardConfig): the folder, the writer's queue size and which optional scalars (timers, batch
    size, validation perplexity) to write. `energy`: whether the ranks measure the GPUs' energy (the same on every rank, as
    it adds a collective); `meter`: this rank's EnergyMeter (one per node)."""

    def __init__(self, groups, global_batch: int, seq_length: int, flops_per_iteration: float, board,
                 energy: bool = False, meter=None, moe: bool = False) -> None:
        import time

        self._clock = time.perf_counter
        self.groups, self.global_batch, self.seq_length = groups, global_batch, seq_length
        self.flops_per_iteration = flops_per_iteration
        self.timers, self.batch_size, self.validation_ppl = board.timers, board.batch_size, board.validation_ppl
        self.energy, self.meter, self.moe = energy, meter, moe
        self.board = None
        if board.folder and groups.rank == groups.world - 1:
            from torch.utils.tensorboard import SummaryWriter

            self.board = SummaryWriter(log_dir=board.folder, max_queue=board.queue_size)
        self.mlperf = None
        if board.mlperf_log and groups.rank == groups.world - 1:
            from nlp_bench.train.mlperf_log import MlperfLog

            self.mlperf = MlperfLog(board.mlperf_log)
        self._reset()

    def _reset(self) -> None:
        self.loss, self.counted, self.iterations, self.skipped, self.nan = 0.0, 0, 0, 0, 0
        self.balance, self.balanced = 0.0, 0
        self.started = self._clock()

    def add(self, losses: list[float], skipped: bool, balance: float = 0.0, balanced: int = 0) -> None:
        """One iteration's losses; `balance` the sum of this rank's `balanced` MoE load-balancing losses (one
        per MoE layer and micro-batch)."""
        self.iterations += 1
        self.balance += balance
        self.balanced += balanced
        self.skipped += int(skipped)
        if self.groups.is_last_stage and losses:
            loss = sum(losses) / len(losses)
            if math.isfinite(loss):
                self.loss += loss
                self.counted += 1
            else:
                self.nan += 1

    def exclude(self, seconds: float) -> None:
        """Leave time spent on something else (evaluation, saving) out of the iteration time."""
        self.started += seconds

    def emit(self, iteration: int, total: int, lr: float, loss_scale: float, grad_norm: float) -> None:
        import torch

        from nlp_bench import flops
        from nlp_bench.train import collectives

        seconds = (self._clock() - self.started) / max(self.iterations, 1)
        sums = torch.tensor([self.loss, float(self.counted)], dtype=torch.float64)
        collectives.all_reduce(sums, self.groups.host_dp)
        balance = None
        if self.moe:  # every stage's MoE layers, every dp rank (tp ranks hold equal copies: the mean stands)
            moe = torch.tensor([self.balance, float(self.balanced)], dtype=torch.float64)
            collectives.all_reduce(moe, self.groups.host)
            balance = moe[0].item() / moe[1].item() if moe[1].item() else None
        energy_j = self._energy() if self.energy else None
        if self.groups.rank == self.groups.world - 1:
            loss = sums[0].item() / max(sums[1].item(), 1.0)
            tflops = flops.tflops_per_device(self.flops_per_iteration, seconds, self.groups.world)
            if self.board is not None:
                scalars = [("lm loss", loss), ("learning-rate", lr), ("loss-scale", loss_scale),
                           ("grad-norm", grad_norm), ("tokens-per-second", self.global_batch * self.seq_length / seconds),
                           ("TFLOPs", tflops)] + ([] if balance is None else [("load_balancing_loss", balance)])
                if self.timers:
                    scalars.append(("iteration-time", seconds))
                if self.batch_size:
                    scalars.append(("batch-size", self.global_batch))
                for tag, value in scalars:
                    self.board.add_scalar(tag, value, iteration)
                self.board.flush()
            print(iteration_line(iteration=iteration, total=total, consumed=iteration * self.global_batch,
                                 seconds=seconds, lr=lr, global_batch=self.global_batch, seq_length=self.seq_length,
                                 loss=loss, loss_scale=loss_scale, grad_norm=grad_norm, skipped=self.skipped,
                                 nan=self.nan, tflops=tflops, energy_j=energy_j, balance=balance), flush=True)
            if self.mlperf is not None:
                self.mlperf.interval(iteration * self.global_batch, seconds, self.global_batch, loss)
        self._reset()

    def _energy(self) -> float | None:
        """The joules every node's meter read over this interval, summed; None where no node has NVML."""
        import torch
        import torch.distributed as dist

        joules = self.meter.read() if self.meter is not None else None
        if self.groups.world == 1:
            return joules
        total = torch.tensor([joules or 0.0, float(joules is not None)], dtype=torch.float64)
        dist.all_reduce(total)
        return total[0].item() if total[1].item() > 0 else None

    def validation(self, iteration: int, loss: float) -> None:
        """The validation loss (and, when asked, its perplexity) under Megatron's TensorBoard tags, and as
        MLPerf's evaluation events."""
        if self.mlperf is not None:
            self.mlperf.evaluation(iteration * self.global_batch, loss)
        if self.board is None:
            return
        self.board.add_scalar("lm loss validation", loss, iteration)
        if self.validation_ppl:
            self.board.add_scalar("lm loss validation ppl", math.exp(min(20.0, loss)), iteration)
        self.board.flush()

    def close(self, iteration: int, finished: bool) -> None:
        """The run ended after `iteration`, at its last iteration (`finished`) or stopped before it."""
        if self.mlperf is not None:
            self.mlperf.stopped(iteration * self.global_batch, finished)
        if self.board is not None:
            self.board.close()
        if self.meter is not None:
            self.meter.close()
