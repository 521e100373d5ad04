"""Locks on points and on the run counter, so that two bench processes (a sweep and its resume, two
resumes) never submit the same point twice nor run two jobs in one folder.

POSIX record locks (fcntl): the kernel drops them when the holder exits, however it exits, so a lock
is never left behind by a killed bench. They work on local file systems and on the parallel and network
file systems HPC sites use for their project folders (NFSv4, Lustre and GPFS/Spectrum Scale with locking
enabled); where the file system refuses them (ENOLCK), the store says so rather than running unlocked.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from nlp_bench.errors import BenchError
from nlp_bench.store.files import Unwritable, os_reason


class Busy(BenchError):
    """Another process holds the lock; the message says which, as far as its lock file tells."""


#: the lock files this process holds, with how many blocks hold each: POSIX locks belong to the process, and
#: closing any descriptor of a locked file drops the lock, so a nested hold must not open the file again
_HELD: dict[str, int] = {}


@contextlib.contextmanager
def hold(path: Path, what: str, wait: bool = False) -> Iterator[None]:
    """Hold the lock file `path` for the block (again, if this process holds it already). Without `wait`,
    a lock another process holds raises Busy at once."""
    key = os.path.realpath(path)
    if key in _HELD:
        _HELD[key] += 1
        try:
            yield
        finally:
            _HELD[key] -= 1
        return
    with _acquire(path, what, wait):
        _HELD[key] = 1
        try:
            yield
        finally:
            del _HELD[key]


@contextlib.contextmanager
def _acquire(path: Path, what: str, wait: bool) -> Iterator[None]:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise Unwritable(f"cannot lock {what} ({path}): {os_reason(exc)}") from None
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
                raise Busy(f"{what} is in use by {holder}") from None
            raise Unwritable(f"cannot lock {what} ({path}): {os_reason(exc)}; the results folder must be on a "
                             "file system with POSIX locks") from None
        with contextlib.suppress(OSError):  # who holds it: for the message a second process gets
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"bench pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
