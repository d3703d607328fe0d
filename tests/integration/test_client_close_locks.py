"""A native client that closes lets go of its cluster locks at once (not one lease later)."""

from __future__ import annotations

import pytest

import loomfs
from loomfs.client import locks
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_closed_client_locks_go_at_once(cluster: LocalCluster, fs: loomfs.LoomFS, base: str) -> None:
    path = f"{base}/locked"
    fs.pipe(path, b"x")
    holder = loomfs.connect(str(cluster.root))
    try:
        holder.run(locks.lock(holder.client, path, locks.WRITE, wait=False))
        with pytest.raises(BlockingIOError):  # held by the other client
            fs.run(locks.lock(fs.client, path, locks.WRITE, wait=False))
    finally:
        holder.close()
    fs.run(locks.lock(fs.client, path, locks.WRITE, wait=False))  # at once: the lease (30 s) not waited out
    fs.run(locks.unlock(fs.client, path))
