"""Atomic file writes: a crash or a killed process never leaves half a JSON file behind."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_text_atomic(path: Path, text: str, mode: int | None = None, durable: bool = True) -> None:
    """Write to a temporary file in the same folder, then rename it over `path`. `durable` also waits
    for the disk (fsync): worth it for state, not for ten thousand jobscripts a sweep can write again."""
    path = Path(path)
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


def write_json_atomic(path: Path, data: Any, durable: bool = True) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n", durable=durable)


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())
