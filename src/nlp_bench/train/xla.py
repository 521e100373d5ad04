"""The xla backend: torch-xla's device and process group, graph execution at the end of every step, its
parallel loader for input; or, with NLP_BENCH_XLA_CPU=1, a CPU stand-in with the same call sites (sync
points counted, collectives over gloo), like neuronx-distributed's CPU mode, so CI runs the path where
torch-xla is missing."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from nlp_bench.train.args import UsageError

STAND_IN = "NLP_BENCH_XLA_CPU"


class XlaRuntime:
    def __init__(self) -> None:
        self.stand_in = os.environ.get(STAND_IN) == "1"
        self.syncs = 0
        if not self.stand_in:
            try:
                import torch_xla  # noqa: F401
            except ImportError:
                raise UsageError("--distributed-backend xla needs torch_xla (torch-xla, or torch-neuronx on "
                                 f"Trainium); {STAND_IN}=1 runs the CPU stand-in") from None

    def start(self) -> torch.device:
        """Join the process group and return this rank's device."""
        if self.stand_in:
            dist.init_process_group(backend="gloo")
            return torch.device("cpu")
        import torch_xla
        import torch_xla.distributed.xla_backend  # noqa: F401  (registers the "xla" process-group backend)

        dist.init_process_group(backend="xla", init_method="xla://")
        if hasattr(torch_xla, "device"):
            return torch_xla.device()
        import torch_xla.core.xla_model as xm

        return xm.xla_device()

    def sync(self) -> None:
        """Cut and run the step's graph (torch_xla.sync; xm.mark_step before torch-xla 2.6)."""
        self.syncs += 1
        if self.stand_in:
            return
        import torch_xla

        if hasattr(torch_xla, "sync"):
            torch_xla.sync()
        else:
            import torch_xla.core.xla_model as xm

            xm.mark_step()

    def to_device(self, batches: list[tuple[torch.Tensor, ...]], device: torch.device) -> list[tuple[torch.Tensor, ...]]:
        """Token ids as int32, as the Neuron reference feeds them (64-bit integers are emulated there), moved
        to the device; on torch-xla through MpDeviceLoader, which overlaps the copy with the step."""
        small = [tuple(t.to(torch.int32) for t in batch) for batch in batches]
        if self.stand_in:
            return [tuple(t.to(device) for t in batch) for batch in small]
        from torch_xla.distributed.parallel_loader import MpDeviceLoader

        return list(MpDeviceLoader(small, device))
