"""The xla backend: torch-xla's device and process group, one graph execution at the end of every step, its
parallel loader for input, its device RNG, and what the step cost as torch-xla's own metrics count it
(graph executions, compiles, transfers to the host).

With NLP_BENCH_XLA_CPU=1 a CPU stand-in keeps the call sites (collectives over gloo, like
neuronx-distributed's CPU mode) so that multi-rank layouts run where torch-xla cannot: its PJRT CPU client
gives every process a world of its own. What the stand-in hides: graphs, compiles, the xla process group's
refusal of CPU tensors and the device RNG; the tests marked `xla` check those on the real torch-xla.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from nlp_bench.spec.switches import DOWNCAST_VARIABLES
from nlp_bench.train.args import UsageError

STAND_IN = "NLP_BENCH_XLA_CPU"


@dataclass(frozen=True)
class Counts:
    """torch-xla's metrics at one moment: graphs run, graphs compiled (and the seconds it took), tensors read
    back by the host."""

    executions: int = 0
    compiles: int = 0
    compile_s: float = 0.0
    transfers: int = 0

    def __sub__(self, other: Counts) -> Counts:
        return Counts(self.executions - other.executions, self.compiles - other.compiles,
                      self.compile_s - other.compile_s, self.transfers - other.transfers)


def refuse_downcasts(environ: dict[str, str] | os._Environ = os.environ) -> None:
    """One line naming the variable, before any step: these switches change what --bf16 and fp32 mean."""
    found = [name for name in DOWNCAST_VARIABLES if environ.get(name, "0") not in ("", "0")]
    if found:
        raise UsageError(f"{found[0]}={environ[found[0]]} is set: it stores fp32 master weights and Adam moments as "
                         "bf16 (Neuron ended its support in release 2.24); unset it and pass --bf16")


class XlaRuntime:
    def __init__(self) -> None:
        self.stand_in = os.environ.get(STAND_IN) == "1"
        self.syncs = 0
        #: per step: what the step cost, from `begin_step` to `end_step`
        self.steps: list[Counts] = []
        self._at_step_start = Counts()
        self._seed = 0
        if not self.stand_in:
            try:
                import torch_xla  # noqa: F401
            except ImportError:
                raise UsageError("--distributed-backend xla needs torch_xla (torch-xla, or torch-neuronx on "
                                 f"Trainium); {STAND_IN}=1 runs the CPU stand-in") from None

    def start(self) -> torch.device:
        """Join the process group and return this rank's device; a world that differs from the launcher's is
        refused before any step (torch-xla's PJRT CPU client makes every process rank 0 of a world of one,
        pytorch/xla#8063: each would train alone on its share of every batch)."""
        if self.stand_in:
            dist.init_process_group(backend="gloo")
            return torch.device("cpu")
        import torch_xla
        import torch_xla.distributed.xla_backend  # noqa: F401  (registers the "xla" process-group backend)

        dist.init_process_group(backend="xla", init_method="xla://")
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if dist.get_world_size() != launched:
            found = dist.get_world_size()
            dist.destroy_process_group()
            raise UsageError(f"torch-xla's process group has {found} rank(s) but the launcher started {launched} "
                             f"(WORLD_SIZE={launched}): each would train alone on its share of every batch; on "
                             f"PJRT_DEVICE={os.environ.get('PJRT_DEVICE', '(unset)')} torch-xla gives every process a "
                             "world of its own (pytorch/xla#8063), so run one process there")
        if hasattr(torch_xla, "device"):
            return torch_xla.device()
        import torch_xla.core.xla_model as xm

        return xm.xla_device()  # before torch-xla 2.6

    def seed(self, seed: int) -> None:
        """Seed the device's generator: torch.manual_seed does not reach it."""
        self._seed = seed
        self._set_seed(seed)

    def _set_seed(self, seed: int) -> None:
        if not self.stand_in:
            import torch_xla.core.xla_model as xm

            xm.set_rng_state(seed)

    def sync(self) -> None:
        """Cut and run the pending graph (torch_xla.sync; xm.mark_step before torch-xla 2.6)."""
        self.syncs += 1
        if self.stand_in:
            return
        import torch_xla

        if hasattr(torch_xla, "sync"):
            torch_xla.sync()
        else:
            import torch_xla.core.xla_model as xm

            xm.mark_step()

    def counts(self) -> Counts:
        """torch-xla's own counters now (zeros on the stand-in, which runs no graphs)."""
        if self.stand_in:
            return Counts()
        import torch_xla.debug.metrics as met

        # counters that the call launching a graph or compiling it bumps: the ExecuteTime metric is recorded
        # when a graph finishes, which on a busy machine can fall after the host's read of its results, into
        # the next step
        compile_time = met.metric_data("CompileTime")
        transfers = met.metric_data("TransferFromDeviceTime")
        return Counts(met.counter_value("ExecuteComputation") or 0, met.counter_value("UncachedCompile") or 0,
                      compile_time[1] / 1e9 if compile_time else 0.0, transfers[0] if transfers else 0)

    def begin_step(self, iteration: int) -> None:
        """Each step's random stream starts from the seed and the iteration alone. torch-xla carries the
        generator across a graph's end differently where a seed was set last in it (as activation recompute
        does to draw its masks again), so a stream that ran on would make a run with recompute draw other masks
        than one without; and a resumed run starts where the saved one would have been."""
        self._at_step_start = self.counts()
        self._set_seed((self._seed % 2**31) * 2**32 + iteration)

    def end_step(self) -> None:
        self.steps.append(self.counts() - self._at_step_start)

    def summary(self) -> str:
        """The run's counts for the log: totals, and the steady state (the steps that compiled nothing)."""
        if self.stand_in:
            return (f"xla: CPU stand-in ({STAND_IN}=1), no graphs: {self.syncs} step ends over gloo; the graph "
                    "counts need torch-xla")
        total = self.counts()
        text = (f"xla: {total.executions} graph executions, {total.compiles} compiles ({total.compile_s:.1f} s), "
                f"{total.transfers} transfers to the host in all")
        steady = [s for s in self.steps if s.compiles == 0]
        if steady:
            text += (f"; per step that compiled nothing ({len(steady)} of {len(self.steps)} steps): at most "
                     f"{max(s.executions for s in steady)} graph executions and {max(s.transfers for s in steady)} "
                     "transfers")
        else:
            text += f"; every one of the {len(self.steps)} steps compiled"
        return text + " (torch_xla.debug.metrics)"

    def to_device(self, batches: list[tuple[torch.Tensor, ...]], device: torch.device) -> list[tuple[torch.Tensor, ...]]:
        """Token ids as int32, as the Neuron reference feeds them (64-bit integers are emulated there), copied
        to the device. Not through MpDeviceLoader: made anew for each step's micro-batches it overlaps nothing,
        and it cuts the graph at every batch it hands out (a second execution a step)."""
        return [tuple(t.to(torch.int32).to(device) for t in batch) for batch in batches]
