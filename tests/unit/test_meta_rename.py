"""rename(2) semantics and rename races expressed as interleaved operations."""

from __future__ import annotations

import asyncio
import errno
import os
import random
from collections.abc import Iterator

import pytest
from test_meta_namespace import CREAT, Env

from loomfs.wire.types import FileType


@pytest.fixture
def env() -> Iterator[Env]:
    e = Env()
    yield e
    e.close()


def test_rename_file(env: Env) -> None:
    f = env.create("/a").attr
    env.run(env.ns.rename("/a", "/b"))
    assert env.err(env.ns.stat("/a")) == errno.ENOENT
    assert env.run(env.ns.stat("/b")).inode == f.inode
    g = env.create("/c").attr
    env.run(env.ns.rename("/b", "/c"))  # replaces: old /c goes to GC
    assert env.run(env.ns.stat("/c")).inode == f.inode
    s = env.run(env.ns.statfs())
    assert s.files == 1 and s.gc_pending == 1
    assert env.names("/") == ["c"]
    assert g.inode != f.inode


def test_rename_errors(env: Env) -> None:
    env.run(env.ns.mkdir("/d/sub/deep", parents=True))
    env.run(env.ns.mkdir("/e"))
    env.create("/f")
    env.create("/d/sub/x")
    assert env.err(env.ns.rename("/nope", "/z")) == errno.ENOENT
    assert env.err(env.ns.rename("/f", "/nodir/z")) == errno.ENOENT
    assert env.err(env.ns.rename("/f", "/f/z")) == errno.ENOTDIR
    assert env.err(env.ns.rename("/f", "/e")) == errno.EISDIR
    assert env.err(env.ns.rename("/e", "/f")) == errno.ENOTDIR
    assert env.err(env.ns.rename("/e", "/d")) == errno.ENOTEMPTY
    assert env.err(env.ns.rename("/d", "/d/sub/deep/x")) == errno.EINVAL
    assert env.err(env.ns.rename("/d", "/d/sub")) == errno.EINVAL
    assert env.err(env.ns.rename("/d/sub/x", "/d")) == errno.ENOTEMPTY  # dst is an ancestor
    assert env.err(env.ns.rename("/", "/z")) == errno.EBUSY
    assert env.err(env.ns.rename("/f", "/")) == errno.EBUSY
    assert env.err(env.ns.rename("/f", "/e", no_replace=True)) == errno.EEXIST
    env.create("/g")
    assert env.err(env.ns.rename("/f", "/g", no_replace=True)) == errno.EEXIST
    # via a symlink into its own subtree
    env.run(env.ns.symlink("/d/sub", "/sl"))
    assert env.err(env.ns.rename("/d", "/sl/moved")) == errno.EINVAL


def test_rename_noops(env: Env) -> None:
    f = env.create("/f").attr
    env.run(env.ns.link("/f", "/h"))
    env.run(env.ns.rename("/f", "/f"))
    env.run(env.ns.rename("/f", "/h"))  # hard link of itself: no-op, both names stay
    assert env.names("/") == ["f", "h"]
    assert env.run(env.ns.stat("/f")).nlink == 2 and env.run(env.ns.stat("/h")).inode == f.inode
    env.run(env.ns.mkdir("/d"))
    env.run(env.ns.rename("/d", "/d"))
    assert env.run(env.ns.statfs()).gc_pending == 0


def test_rename_directories_and_nlink(env: Env) -> None:
    env.run(env.ns.mkdir("/a/x", parents=True))
    env.run(env.ns.mkdir("/b/y", parents=True))
    env.run(env.ns.mkdir("/b/z"))
    env.create("/a/x/file")
    env.run(env.ns.rename("/a/x", "/b/y"))  # replaces an empty directory
    assert env.run(env.ns.stat("/a")).nlink == 2
    assert env.run(env.ns.stat("/b")).nlink == 4
    assert env.names("/b/y") == ["file"]
    env.run(env.ns.rename("/b/z", "/b/w"))
    assert env.run(env.ns.stat("/b")).nlink == 4
    env.run(env.ns.rename("/b/w", "/w"))
    assert env.run(env.ns.stat("/b")).nlink == 3
    assert env.run(env.ns.stat("/")).nlink == 2 + 3
    assert env.run(env.ns.statfs()).directories == 1 + 4  # root, a, b, b/y(=x), w


def test_rename_symlink_is_not_followed(env: Env) -> None:
    env.create("/f")
    env.run(env.ns.mkdir("/d"))
    env.run(env.ns.symlink("/d", "/l"))
    env.run(env.ns.rename("/f", "/l"))  # replaces the link, not a file inside /d
    assert env.run(env.ns.stat("/l", follow_symlinks=False)).type == FileType.FILE
    assert env.names("/d") == []


def test_rename_replace_open_file_keeps_session(env: Env) -> None:
    env.create("/src")
    o = env.run(env.ns.open("/dst", CREAT))
    env.run(env.ns.rename("/src", "/dst"))
    env.run(env.ns.close(o.attr.inode, o.session_id, 4096))  # writer of the replaced file closes
    async def gc_len() -> int:
        async with env.store.read() as txn:
            e = await txn.gc_get(o.attr.inode)
            assert e is not None
            return e.length

    assert env.run(gc_len()) == 4096


def test_conditional_replace_needs_the_same_idle_file(env: Env) -> None:
    """``expect`` (a layout conversion's switch): the target must be the file the caller saw,
    unchanged and with no writer open, checked in the rename's own transaction (EBUSY)."""
    env.create("/copy")
    o = env.run(env.ns.open("/src", CREAT))  # a writer still has it open
    env.run(env.ns.close(o.attr.inode, o.session_id, 10, mtime_ns=5))
    a = env.run(env.ns.stat("/src"))
    seen = (a.inode, a.size, a.mtime_ns)
    w = env.run(env.ns.open("/src", os.O_WRONLY))
    assert env.err(env.ns.rename("/copy", "/src", expect=seen)) == errno.EBUSY  # open for writing
    env.run(env.ns.close(w.attr.inode, w.session_id, 12, trunc_epoch=w.trunc_epoch))
    assert env.err(env.ns.rename("/copy", "/src", expect=seen)) == errno.EBUSY  # grew since
    assert env.err(env.ns.rename("/copy", "/gone", expect=seen)) == errno.EBUSY  # not there
    b = env.run(env.ns.stat("/src"))
    assert env.err(env.ns.rename("/copy", "/src", expect=(b.inode + 1, b.size, b.mtime_ns))) == errno.EBUSY
    assert env.names("/") == ["copy", "src"]  # nothing moved
    env.run(env.ns.rename("/copy", "/src", expect=(b.inode, b.size, b.mtime_ns)))
    assert env.names("/") == ["src"]


def test_interleaved_renames_keep_namespace_consistent(env: Env) -> None:
    """Many concurrent renames/creates/unlinks: entries are never lost or duplicated."""
    rng = random.Random(11)
    env.run(env.ns.mkdir("/a"))
    env.run(env.ns.mkdir("/b"))
    for i in range(20):
        env.create(f"/a/f{i}")

    async def mover(k: int) -> None:
        for _ in range(30):
            i = rng.randrange(20)
            src_dir, dst_dir = rng.sample(["a", "b"], 2)
            try:
                await env.ns.rename(f"/{src_dir}/f{i}", f"/{dst_dir}/f{i}", no_replace=rng.random() < 0.5)
            except OSError as exc:
                assert exc.errno in (errno.ENOENT, errno.EEXIST)
            await asyncio.sleep(0)

    async def go() -> None:
        await asyncio.gather(*(mover(k) for k in range(4)))

    env.run(go())
    names = [f"a/{n}" for n in env.names("/a")] + [f"b/{n}" for n in env.names("/b")]
    base = sorted(n.split("/")[1] for n in names)
    assert base == sorted(f"f{i}" for i in range(20))  # each file in exactly one place
    s = env.run(env.ns.statfs())
    assert s.files == 20 and s.gc_pending == 0


def test_rename_race_loser_sees_enoent(env: Env) -> None:
    env.create("/x")

    async def go() -> list[BaseException | None]:
        res = await asyncio.gather(
            env.ns.rename("/x", "/y"), env.ns.rename("/x", "/z"), return_exceptions=True
        )
        return list(res)

    res = env.run(go())
    assert res[0] is None and isinstance(res[1], OSError) and res[1].errno == errno.ENOENT
    assert env.names("/") == ["y"]
    assert os.O_CREAT  # keep os imported for CREAT users
