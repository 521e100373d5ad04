"""Launch sizes shared by the kernels (block widths, program counts), chosen in Python because the
interpreter cannot run Triton's autotuner with more than one configuration."""

from __future__ import annotations

import functools
import os

import torch


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def _processors(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def programs(rows: int, device: torch.device, per_processor: int = 4) -> int:
    """Programs for a persistent kernel (each loops over rows): a few per multiprocessor on a GPU, a handful
    under the interpreter, where every program instance costs milliseconds."""
    if device.type != "cuda":
        return max(1, min(rows, 4))
    return max(1, min(rows, per_processor * _processors(device.index or 0)))


def row_block(width: int) -> int:
    """One block covering a whole row (norms keep the row in registers)."""
    return max(16, 1 << (width - 1).bit_length())

