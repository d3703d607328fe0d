"""Meta operations the mount needs: RENAME_EXCHANGE and special files (no sockets)."""

from __future__ import annotations

import errno
from collections.abc import Iterator

import pytest
from test_meta_namespace import Env

from loomfs.meta.ops.special import rdev_of
from loomfs.wire.types import FileType


@pytest.fixture
def env() -> Iterator[Env]:
    e = Env()
    yield e
    e.close()


def test_exchange_swaps_files_and_directories(env: Env) -> None:
    ns = env.ns
    f = env.create("/f").attr
    env.run(ns.mkdir("/d"))
    env.create("/d/in")
    env.run(ns.mkdir("/p"))
    before = env.run(ns.stat("/"))
    env.clock.advance(1.0)
    env.run(ns.exchange("/f", "/d"))
    assert env.run(ns.stat("/d")).inode == f.inode
    assert env.names("/f") == ["in"]
    assert env.run(ns.stat("/")).nlink == before.nlink  # same parent: '..' counts unchanged
    assert env.run(ns.stat("/")).mtime_ns > before.mtime_ns
    # across parents: the directory moves into /p, the file out of it
    env.create("/p/g")
    p_before = env.run(ns.stat("/p")).nlink
    env.run(ns.exchange("/f", "/p/g"))
    assert env.names("/p/g") == ["in"] and env.run(ns.stat("/f")).type == FileType.FILE
    assert env.run(ns.stat("/p")).nlink == p_before + 1
    assert env.run(ns.stat("/")).nlink == before.nlink - 1


def test_exchange_errors(env: Env) -> None:
    ns = env.ns
    env.run(ns.mkdir("/a"))
    env.run(ns.mkdir("/a/b"))
    env.create("/f")
    assert env.err(ns.exchange("/f", "/missing")) == errno.ENOENT
    assert env.err(ns.exchange("/missing", "/f")) == errno.ENOENT
    assert env.err(ns.exchange("/a", "/a/b")) == errno.EINVAL
    assert env.err(ns.exchange("/a/b", "/a")) == errno.EINVAL
    assert env.err(ns.exchange("/", "/f")) == errno.EBUSY
    env.run(ns.link("/f", "/g"))
    env.run(ns.exchange("/f", "/g"))  # two names of one file: nothing to do
    assert env.run(ns.stat("/f")).inode == env.run(ns.stat("/g")).inode


def test_mknod_types_and_device_numbers(env: Env) -> None:
    ns = env.ns
    fifo = env.run(ns.mknod("/p", type=FileType.FIFO, mode=0o640, uid=5, gid=6))
    dev = env.run(ns.mknod("/c", type=FileType.CHAR_DEVICE, mode=0o600, rdev=(1 << 8) | 3))
    sock = env.run(ns.mknod("/s", type=FileType.SOCKET))
    assert (fifo.type, fifo.mode, fifo.uid, fifo.gid, fifo.size) == (FileType.FIFO, 0o640, 5, 6, 0)
    assert (rdev_of(dev), dev.size, rdev_of(fifo), rdev_of(sock)) == ((1 << 8) | 3, 0, 0, 0)
    assert env.run(ns.stat("/c")).size == 0 and rdev_of(env.run(ns.stat("/c"))) == (1 << 8) | 3
    assert env.err(ns.mknod("/p", type=FileType.FIFO)) == errno.EEXIST
    assert env.err(ns.mknod("/x", type=FileType.FILE)) == errno.EINVAL
    assert env.err(ns.mknod("/x", type=FileType.BLOCK_DEVICE, rdev=-1)) == errno.EINVAL
    assert env.err(ns.readlink("/c")) == errno.EINVAL
    assert env.err(ns.setattr("/p", size=0)) == errno.EINVAL
    env.run(ns.link("/p", "/p2"))
    assert env.run(ns.stat("/p2")).nlink == 2
    env.run(ns.rename("/c", "/c2"))
    for name in ("/p", "/p2", "/c2", "/s"):
        env.run(ns.unlink(name))
    assert env.names("/") == []
    assert env.run(ns.statfs()).files == 0  # special files are not counted as files
