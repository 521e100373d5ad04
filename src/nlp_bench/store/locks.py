"""Locks on points and on the run counter, so that two bench processes (a sweep and its resume, two
resumes) never submit the same point twice nor run two jobs in one folder.

POSIX record locks (fcntl): the kernel drops them when the holder exits, however it exits, so a lock
is never left behind by a killed bench. They work on local file systems and on the parallel and network
file systems HPC sites use for their project folders (NFSv4, Lustre and GPFS/Spectrum Scale with locking
enabled); where the file system refuses them (ENOLCK), the store says so rather than running unlocked.

A lock held for jobs (the results folder's lock that keeps two local jobs apart) is an open file description
lock instead: the same kind on the wire and on disk, but it belongs to the open file, which the jobs this
process starts inherit, so it lives as long as the last of them, whatever becomes of the bench.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

from nlp_bench.errors import BenchError
from nlp_bench.store.files import Unwritable, os_reason


class Busy(BenchError):
    """Another process holds the lock; the message says which, as far as its lock file tells."""


#: the lock files this process holds, with how many blocks hold each: POSIX locks belong to the process, and
#: closing any descriptor of a locked file drops the lock, so a nested hold must not open the file again
_HELD: dict[str, int] = {}
#: the descriptors of the locks held for jobs (hold(..., for_jobs=True)), by lock file
_FOR_JOBS: dict[str, int] = {}


@contextlib.contextmanager
def hold(path: Path, what: str, wait: bool = False, for_jobs: bool = False) -> Iterator[None]:
    """Hold the lock file `path` for the block (again, if this process holds it already). Without `wait`,
    a lock another process holds raises Busy at once. With `for_jobs`, a job started in the block inherits
    the lock (see for_jobs()) and holds it after the block, until it ends."""
    key = os.path.realpath(path)
    if key in _HELD:
        _HELD[key] += 1
        try:
            yield
        finally:
            _HELD[key] -= 1
        return
    with _acquire(path, what, wait, for_jobs) as fd:
        _HELD[key] = 1
        if for_jobs:
            _FOR_JOBS[key] = fd
        try:
            yield
        finally:
            del _HELD[key]
            _FOR_JOBS.pop(key, None)


def for_jobs() -> tuple[int, ...]:
    """The descriptors a job started now must inherit (subprocess's pass_fds) to hold the locks held for it."""
    return tuple(_FOR_JOBS.values())


def passed_on(holder: str) -> None:
    """Say in every lock held for jobs who holds it now (`holder`: the job just started), for the message
    a second process gets while the job runs, this bench gone or not."""
    for fd in _FOR_JOBS.values():
        _write_holder(fd, f"{holder} (started by bench pid {os.getpid()} on {socket.gethostname()})")


def _write_holder(fd: int, holder: str) -> None:
    with contextlib.suppress(OSError):  # who holds it: for the message a second process gets
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{holder}\n".encode(), 0)


def _lock(fd: int, wait: bool, for_jobs: bool) -> None:
    """lockf's lock, or for jobs an open file description lock (Linux's F_OFD_SETLK; struct flock is short
    l_type, short l_whence, off_t l_start, off_t l_len, pid_t l_pid, which must be 0): the whole file."""
    if not for_jobs:
        fcntl.lockf(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        return
    whole = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
    fcntl.fcntl(fd, fcntl.F_OFD_SETLKW if wait else fcntl.F_OFD_SETLK, whole)


@contextlib.contextmanager
def _acquire(path: Path, what: str, wait: bool, for_jobs: bool) -> Iterator[int]:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise Unwritable(f"cannot lock {what} ({path}): {os_reason(exc)}") from None
    try:
        try:
            _lock(fd, wait, for_jobs)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
                raise Busy(f"{what} is in use by {holder}") from None
            raise Unwritable(f"cannot lock {what} ({path}): {os_reason(exc)}; the results folder must be on a "
                             "file system with POSIX locks") from None
        _write_holder(fd, f"bench pid {os.getpid()} on {socket.gethostname()}")
        yield fd
    finally:
        os.close(fd)  # releases the lock (one held for jobs: where no job holds it too)
