"""The blocking lock shortcuts (``loomfs.client.sync_locks``) against another client and a
mount: exclusion, shared locks, byte ranges, the ``with`` form's unlock."""

from __future__ import annotations

import fcntl
import os
import threading
import time

import pytest
from test_mount_options import mounted

import loomfs
from loomfs.client.sync_locks import POSIX, READ, WRITE, lock, locked, unlock
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_shortcuts_between_clients_and_a_mount(cluster: LocalCluster) -> None:
    path = f"/synclocks-{os.getpid()}-{time.monotonic_ns()}"
    with loomfs.connect(str(cluster.root)) as a, loomfs.connect(str(cluster.root)) as b:
        a.pipe(path, b"x" * 100)
        lock(a, path)
        with pytest.raises(BlockingIOError):
            lock(b, path, wait=False)
        got = threading.Event()

        def waiter() -> None:
            lock(b, path)  # blocks until a unlocks
            got.set()

        t = threading.Thread(target=waiter)
        t.start()
        assert not got.wait(0.3)  # still held by a (a wait that ends early would be the failure)
        unlock(a, path)
        t.join(30)
        assert got.is_set()
        unlock(b, path)
        lock(a, path, READ)
        lock(b, path, READ, wait=False)  # shared with shared
        unlock(a, path)
        unlock(b, path)
        with locked(a, path, kind=POSIX, first=0, last=9):
            lock(b, path, WRITE, kind=POSIX, first=10, last=19, wait=False)  # another range
            with pytest.raises(BlockingIOError):
                lock(b, path, WRITE, kind=POSIX, first=5, last=12, wait=False)
            unlock(b, path, kind=POSIX, first=10, last=19)
            with mounted(cluster) as mp:  # a mount's fcntl meets the same lock
                fd = os.open(mp / path[1:], os.O_RDWR)
                try:
                    with pytest.raises(BlockingIOError):
                        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0)
                finally:
                    os.close(fd)
        lock(b, path, WRITE, kind=POSIX, first=0, last=9, wait=False)  # the with block unlocked it
        unlock(b, path, kind=POSIX, first=0, last=9)
