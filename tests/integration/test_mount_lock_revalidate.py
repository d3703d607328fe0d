"""Lock-time revalidation through two mounts of one cluster (``MountLocks._revalidate``): a
file open here before another mount changed it under a lock shows the change once this
mount's process takes the lock (close-to-open at lock time, as NFS does): the kernel's pages
and attributes and the mount's read handle are refreshed before the lock is granted."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable

import pytest
from test_mount_locks import fresh, two  # noqa: F401 - two: the module's fixture of two mounts

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SIZES = [4096, 3 << 20]  # inline at meta, and in chunks (a read hold, prefetched chunks)


def _flock(fd: int, exclusive: bool) -> None:
    fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)


def _unflock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)


def _posix(fd: int, exclusive: bool) -> None:
    fcntl.lockf(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)


def _unposix(fd: int) -> None:
    fcntl.lockf(fd, fcntl.LOCK_UN)


KINDS: dict[str, tuple[Callable[[int, bool], None], Callable[[int], None]]] = {
    "flock": (_flock, _unflock), "fcntl": (_posix, _unposix)}


@pytest.mark.parametrize("size", SIZES, ids=["inline", "chunked"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_lock_shows_what_another_mount_wrote_under_it(two: tuple[str, str], kind: str, size: int) -> None:  # noqa: F811
    lock, unlock = KINDS[kind]
    a, b = two
    pa, pb = fresh(a, b, f"reval-{kind}-{size}")
    old = b"o" * size
    pa.write_bytes(old)
    fd_b = os.open(pb, os.O_RDONLY)  # opened (and read: kernel pages, prefetch) before the change
    try:
        assert os.pread(fd_b, size + 10, 0) == old
        assert os.pread(fd_b, size + 10, 0) == old  # the second read from the kernel's pages
        new = b"N" * (size + 5000)  # new bytes and a new length
        fd_a = os.open(pa, os.O_RDWR)
        try:
            lock(fd_a, True)
            os.pwrite(fd_a, new, 0)
            unlock(fd_a)  # publishes the bytes and the length (loomfs.mount.locks)
        finally:
            os.close(fd_a)
        lock(fd_b, False)
        try:
            assert os.fstat(fd_b).st_size == len(new)
            got = os.pread(fd_b, len(new) + 10, 0)
            assert got == new, (len(got), got[:8], got[-8:])
        finally:
            unlock(fd_b)
    finally:
        os.close(fd_b)
