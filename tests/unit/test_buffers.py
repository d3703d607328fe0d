"""The buffer pool: size classes, and buffers private to a process after fork."""

from __future__ import annotations

import os

from loomfs.net.buffers import BufferPool


def test_size_classes_and_reuse() -> None:
    pool = BufferPool()
    a = pool.acquire(100_000)
    assert len(a) == 1 << 17 and pool.misses == 1
    pool.release(a)
    assert pool.acquire(70_000) is a and pool.hits == 1


def test_buffers_are_not_shared_with_a_forked_child() -> None:
    """Found while building the simulator: pooled buffers were MAP_SHARED anonymous maps, so a
    forked child (a DataLoader worker) and its parent wrote into each other's buffers."""
    pool = BufferPool()
    buf = pool.acquire(4096)
    buf[:6] = b"parent"
    pid = os.fork()
    if pid == 0:  # the child scribbles over its copy and leaves at once
        buf[:6] = b"child!"
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert bytes(buf[:6]) == b"parent"
