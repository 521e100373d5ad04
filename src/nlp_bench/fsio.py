"""Atomic file writes and strict JSON: a crash or a killed process never leaves half a file behind, and no
file or output holds NaN or Infinity, which JSON does not have."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def write_text_atomic(path: Path, text: str, mode: int | None = None, durable: bool = True,
                      make_parents: bool = True) -> None:
    """Write to a temporary file in the same folder, then rename it over `path`. `durable` also waits
    for the disk (fsync): worth it for state, not for ten thousand jobscripts a sweep can write again.
    Raises OSError (ENOSPC, EROFS, ...) naming `path`, with nothing left behind."""
    path = Path(path)
    try:
        _write(path, text, mode, durable, make_parents)
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from None


def _write(path: Path, text: str, mode: int | None, durable: bool, make_parents: bool) -> None:
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.chmod(tmp, mode if mode is not None else 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def finite(value: Any) -> Any:
    """`value` with every NaN or infinity replaced by None (null)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(data: Any, indent: int | None = 2) -> str:
    """Strict JSON: non-finite numbers become null, and anything else JSON cannot hold fails loudly."""
    return json.dumps(finite(data), indent=indent, allow_nan=False)


def write_json_atomic(path: Path, data: Any, durable: bool = True) -> None:
    write_text_atomic(path, dumps(data) + "\n", durable=durable)


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())
