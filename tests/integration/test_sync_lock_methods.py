"""``LoomFS.lock`` / ``unlock`` / ``locked``: the blocking client's methods over
``loomfs.client.sync_locks``, between two clients."""

from __future__ import annotations

import os
import time

import pytest

import loomfs
from loomfs.client.locks import POSIX, READ
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_lock_methods_between_two_clients(cluster: LocalCluster) -> None:
    path = f"/lockmethods-{os.getpid()}-{time.monotonic_ns()}"
    with loomfs.connect(str(cluster.root)) as a, loomfs.connect(str(cluster.root)) as b:
        a.pipe(path, b"x" * 10)
        a.lock(path)  # WRITE by default
        with pytest.raises(BlockingIOError):
            b.lock(path, wait=False)
        with pytest.raises(BlockingIOError):
            b.lock(path, READ, wait=False)
        a.unlock(path)
        b.lock(path, READ, wait=False)
        a.lock(path, READ, wait=False)  # shared with shared
        b.unlock(path)
        a.unlock(path)
        with a.locked(path, kind=POSIX, first=0, last=4):
            with pytest.raises(BlockingIOError):
                b.lock(path, kind=POSIX, first=2, last=3, wait=False)
            b.lock(path, kind=POSIX, first=5, last=9, wait=False)  # another range
            b.unlock(path, kind=POSIX, first=5, last=9)
        b.lock(path, kind=POSIX, first=0, last=4, wait=False)  # the with block unlocked it
        b.unlock(path, kind=POSIX, first=0, last=4)
