"""Which implementation each fused op uses, decided once per process.

Triton where it can run (a CUDA device and a Triton with a driver, or TRITON_INTERPRET=1), plain
torch otherwise; NLP_BENCH_KERNELS=triton|torch forces one, and the trainer switches single ops back to
torch with Megatron's --no-*-fusion flags; NLP_BENCH_NORM_LAUNCH overrides the norm kernels' launch
settings (see norm_settings). A tensor that is not on the GPU always takes the torch path
(unless interpreting): Triton cannot launch on CPU memory.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable

import torch

from nlp_bench.kernels import norm_settings
from nlp_bench.kernels.blocks import interpreting

OPS = ("layer_norm", "rms_norm", "bias_gelu", "swiglu", "cross_entropy", "adam")
KERNELS_ENV = "NLP_BENCH_KERNELS"

_unfused: dict[str, str] = {}  # op -> the switch that turned its fusion off
_persistent = [True]
_norm_launch: list[str] = []  # the NLP_BENCH_NORM_LAUNCH applied, for the log


class KernelChoiceError(ValueError):
    """NLP_BENCH_KERNELS asks for something this process cannot do."""


def _triton_missing() -> str | None:
    """Why Triton cannot run here, or None."""
    try:
        import triton
    except ImportError:
        return "Triton is not installed"
    if interpreting():
        return None
    if not torch.cuda.is_available():
        return "no GPU"
    try:
        triton.runtime.driver.active.get_current_device()
    except Exception as exc:  # triton raises RuntimeError("0 active drivers") and others without a driver
        return f"Triton has no usable driver ({exc})"
    return None


@functools.cache
def backend() -> tuple[str, str]:
    """("triton" | "torch", why)."""
    forced = os.environ.get(KERNELS_ENV, "").strip().lower()
    if forced not in ("", "triton", "torch"):
        raise KernelChoiceError(f"{KERNELS_ENV}={forced!r} is not an implementation; use triton or torch")
    if forced == "torch":
        return "torch", f"{KERNELS_ENV}=torch"
    missing = _triton_missing()
    if forced == "triton":
        if missing:
            raise KernelChoiceError(f"{KERNELS_ENV}=triton but {missing}")
        return "triton", f"{KERNELS_ENV}=triton" + (" under TRITON_INTERPRET=1" if interpreting() else "")
    if missing:
        return "torch", missing
    return "triton", "TRITON_INTERPRET=1" if interpreting() else "GPU with Triton"


def configure(unfused: dict[str, str] | Iterable[str] = (), persist_layer_norm: bool = True) -> None:
    """Turn the fusion of some ops off (op -> the flag that asked, for the log), pick the layer-norm
    launch (persistent programs looping over rows, or one program per row) and apply the norm launch
    settings in NLP_BENCH_NORM_LAUNCH (as benchmark/perf/norm_launch.py prints them for a GPU)."""
    unknown = set(unfused) - set(OPS)
    if unknown:
        raise KernelChoiceError(f"unknown fused op(s): {', '.join(sorted(unknown))}; ops: {', '.join(OPS)}")
    launch = os.environ.get(norm_settings.NORM_LAUNCH_ENV, "").strip()
    try:
        norm_settings.override(launch)
    except ValueError as exc:
        raise KernelChoiceError(f"{norm_settings.NORM_LAUNCH_ENV}: {exc}") from None
    _norm_launch[:] = [launch] if launch else []
    _unfused.clear()
    _unfused.update(unfused if isinstance(unfused, dict) else {op: "configure()" for op in unfused})
    _persistent[0] = persist_layer_norm


def persistent_layer_norm() -> bool:
    return _persistent[0]


def implementation(op: str) -> str:
    return "torch" if op in _unfused else backend()[0]


def runs_triton(op: str, tensor: torch.Tensor) -> bool:
    return implementation(op) == "triton" and (tensor.is_cuda or interpreting())


def describe() -> str:
    """One line for the trainer's log: the implementation of every op and why."""
    name, why = backend()
    ops = []
    for op in OPS:
        note = f" ({_unfused[op]})" if op in _unfused else ""
        if op in ("layer_norm", "rms_norm") and implementation(op) == "triton" and not _persistent[0]:
            note = " (--no-persist-layer-norm)"
        ops.append(f"{op}={implementation(op)}{note}")
    launch = f"; {norm_settings.NORM_LAUNCH_ENV}={_norm_launch[0]}" if _norm_launch and name == "triton" else ""
    return f"fused ops: {' '.join(ops)} [{name}: {why}{launch}]"
