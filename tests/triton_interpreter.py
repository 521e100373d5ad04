"""Triton's interpreter for the kernel tests on a machine without a GPU: the same kernel code, executed on CPU
tensors. Triton reads TRITON_INTERPRET when it defines a kernel (its own library's too) and when one runs, so
it is set for the import of triton and the kernel modules (`interpreted`) and, by conftest's
`triton_interpreter` fixture, for each kernel test (`KERNEL_MARKS`), so the rest of the session (the trainer's
tests) still sees a machine without the interpreter."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

#: the marks of a kernel test module: the interpreter for each test where no GPU is, and the interpreter's
#: numpy exp() warnings ignored where the kernels rely on exp overflowing to inf
KERNEL_MARKS = [pytest.mark.usefixtures("triton_interpreter"),
                pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")]


@contextmanager
def interpreted() -> Iterator[None]:
    """TRITON_INTERPRET=1 for the imports in the block where there is no GPU and it is not set already."""
    interpret = not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if interpret:
            del os.environ["TRITON_INTERPRET"]
