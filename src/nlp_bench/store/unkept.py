"""States a reader worked out but could not write. A `bench status` or `bench result table` on a results folder
it may not write (mounted read-only, a colleague's) still asks each unfinished job's executor how it stands
and records its end as a writer would; where state.json cannot be written, that state is held here, for this
process, and every later read of the point gets it, so each view shows the same state and says it was not
kept. A writer never comes here: outside `shown()` a refused write is the error it always was."""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

from nlp_bench.store.files import Unwritable
from nlp_bench.store.records import StateRecord

#: state.json's path -> (what identifies the file as it was read, the state worked out from it)
_HELD: dict[str, tuple[tuple[int, int, int] | None, StateRecord]] = {}
#: while a reader brings states up to date: the line to say for each state.json it could not write
_SAID: ContextVar[dict[str, str] | None] = ContextVar("unkept_said", default=None)


def _identity(path: Path) -> tuple[int, int, int] | None:
    """The file as it is on disk: a held state stands only while nobody has written the file since."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns


@contextlib.contextmanager
def shown() -> Iterator[dict[str, str]]:
    """The block may hold states it cannot write instead of failing; yields, by state.json, the line that
    says so (the file system's reason, the state shown, and that it was not kept)."""
    said: dict[str, str] = {}
    token = _SAID.set(said)
    try:
        yield said
    finally:
        _SAID.reset(token)


def refused(exc: Unwritable) -> Unwritable:
    """A write or lock of state.json the file system refused: raised again, unless a reader is inside
    `shown()`; then returned, for `remember`."""
    if _SAID.get() is None:
        raise exc
    return exc


def remember(path: Path, record: StateRecord, why: Unwritable) -> None:
    """Hold `record` for `path` in this process, and say why it is not on disk."""
    key = os.path.abspath(path)
    _HELD[key] = (_identity(path), copy.deepcopy(record))
    said = _SAID.get()
    if said is not None:
        said[key] = f"{why} (the state {record.state} is shown, not kept)"


def held(path: Path) -> StateRecord | None:
    """The state this process worked out for `path` and could not write, while the file is unchanged."""
    key = os.path.abspath(path)
    found = _HELD.get(key)
    if found is None:
        return None
    if found[0] != _identity(path):
        del _HELD[key]
        return None
    return copy.deepcopy(found[1])
