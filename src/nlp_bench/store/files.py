"""Reading and writing the store's JSON records: atomically, and with one line naming the file when a
record is missing, damaged or cannot be written."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from nlp_bench.errors import ResultError
from nlp_bench.fsio import dumps, write_text_atomic


class StoreError(ResultError):
    """A record of the run store cannot be read or written; the message names the file and what is wrong."""


class Unwritable(StoreError):
    """The file system refused a write or a lock (mounted read-only, not this user's, full): a reader that
    only meant to bring a record up to date may show what it worked out instead (store.unkept)."""


def os_reason(exc: OSError) -> str:
    """The operating system's words for a failed file operation (ENOSPC: "No space left on device"), also
    where a library raised the error with its number only (pyarrow)."""
    return exc.strerror or (os.strerror(exc.errno) if exc.errno else type(exc).__name__)


def naming(path: Path, exc: Exception) -> str:
    """An error's message with the path it concerns in front, unless the message names it already."""
    return str(exc) if str(path) in str(exc) else f"{path}: {exc}"


def read_object(path: Path) -> dict[str, Any]:
    """A JSON object from `path`; StoreError names the file when it is missing, unreadable, cut off or not
    an object."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise StoreError(f"{path}: missing") from None
    except IsADirectoryError:
        raise StoreError(f"{path}: a folder where a file was expected") from None
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {os_reason(exc)}") from None
    if not raw.strip():
        raise StoreError(f"{path}: empty (a write was cut off, or the file was emptied)")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise StoreError(f"{path}: not UTF-8 text (byte {exc.start}); the file is damaged") from None
    except json.JSONDecodeError as exc:
        raise StoreError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno} column {exc.colno}); "
                         "the file is damaged or was cut off") from None
    if not isinstance(data, dict):
        raise StoreError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def write_text(path: Path, text: str, mode: int | None = None, durable: bool = True) -> None:
    """Atomically replace `path` (a reader sees the old file or the new one, never half of one). Its folder
    must exist: a run folder moved away while bench runs is not made again at the old place."""
    path = Path(path)
    if not path.parent.is_dir():
        raise StoreError(f"cannot write {path}: its folder is gone (moved or removed while bench ran?)")
    try:
        write_text_atomic(path, text, mode, durable, make_parents=False)
    except OSError as exc:
        raise Unwritable(f"cannot write {path}: {os_reason(exc)}") from None


def write_object(path: Path, data: dict[str, Any], durable: bool = True) -> None:
    write_text(path, dumps(data) + "\n", durable=durable)
