"""A second random stream for tensor-parallel regions.

Dropout on the replicated residual stream must draw the same mask on every tensor-parallel rank (or
the replicas drift apart), while dropout on a rank's own attention heads should differ between ranks.
The default generator serves the first; this tracker swaps in a per-tp-rank state for the second. On xla the
device's generator is a running seed (an integer the host keeps; setting it adds no host read to the graph).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

#: Megatron's offset between the default seed and the tensor-parallel seed.
TP_SEED_OFFSET = 2718


class ParallelRNG:
    def __init__(self, seed: int, tp_rank: int, device: torch.device) -> None:
        self.device = device
        if device.type == "xla":
            self._state: torch.Tensor | int = seed + TP_SEED_OFFSET + tp_rank
            return
        saved = self._get()
        torch.manual_seed(seed + TP_SEED_OFFSET + tp_rank)
        self._state = self._get()
        self._set(saved)

    def _get(self) -> torch.Tensor | int:
        if self.device.type == "xla":
            import torch_xla.core.xla_model as xm

            return xm.get_rng_state(self.device)
        if self.device.type == "cpu":
            return torch.get_rng_state()
        return torch.get_device_module(self.device).get_rng_state(self.device)  # cuda, neuron

    def _set(self, state: torch.Tensor | int) -> None:
        if self.device.type == "xla":
            import torch_xla.core.xla_model as xm

            xm.set_rng_state(state, self.device)
        elif self.device.type == "cpu":
            torch.set_rng_state(state)
        else:
            torch.get_device_module(self.device).set_rng_state(state, self.device)

    def saved(self) -> dict:
        """What a checkpoint keeps: the tensor-parallel stream, and on xla the device's running seed."""
        return {"tp_stream": _copied(self._state), "xla": self._get() if self.device.type == "xla" else None}

    def restore(self, saved: dict) -> None:
        """Put back what `saved` kept; ValueError for the streams of another kind of device (an xla stream is a
        seed, the others a generator's state)."""
        if isinstance(saved["tp_stream"], int) != (self.device.type == "xla"):
            raise ValueError("its random streams are another kind of device's (xla keeps seeds, CPU and CUDA a "
                             "generator's state)")
        self._state = saved["tp_stream"]
        if self.device.type == "xla" and saved.get("xla") is not None:
            self._set(saved["xla"])

    @contextlib.contextmanager
    def fork(self) -> Iterator[None]:
        """Run the block on the tensor-parallel stream, then return to the default one."""
        saved = self._get()
        self._set(self._state)
        try:
            yield
        finally:
            self._state = self._get()
            self._set(saved)


def recompute(fn, *args, rng: ParallelRNG):
    """Activation recompute of fn(*args): keep only the inputs, run fn again in the backward pass.

    torch restores the default generator for the recomputation; the tensor-parallel stream is restored
    here too, so dropout inside fn draws the same masks both times. On xla torch's checkpoint cannot reach
    the device's generator (it looks for a `torch.xla` module): torch-xla's own checkpoint restores the running
    seed the forward pass started from (whichever stream that was) and keeps the compiler from merging the
    recomputation into the forward pass; it reruns fn itself, so the stream is put back around that rerun.
    """
    if rng.device.type == "xla":
        from torch_xla.utils.checkpoint import checkpoint as xla_checkpoint

        first: list[torch.Tensor | int] = []

        def run(*inputs):
            if not first:
                first.append(_copied(rng._state))
                return fn(*inputs)
            current, rng._state = rng._state, _copied(first[0])
            try:
                return fn(*inputs)
            finally:
                rng._state = current

        return xla_checkpoint(run, *args, use_reentrant=True)

    from torch.utils.checkpoint import checkpoint as torch_checkpoint

    saved: list[torch.Tensor | int] = []

    @contextlib.contextmanager
    def forward_ctx():
        saved.append(_copied(rng._state))
        yield

    @contextlib.contextmanager
    def recompute_ctx():
        current = rng._state
        rng._state = _copied(saved[0])
        try:
            yield
        finally:
            rng._state = current

    return torch_checkpoint(fn, *args, use_reentrant=False, context_fn=lambda: (forward_ctx(), recompute_ctx()))


def _copied(state: torch.Tensor | int) -> torch.Tensor | int:
    return state.clone() if isinstance(state, torch.Tensor) else state
