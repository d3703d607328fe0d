"""Review of the session-15 coherence changes of the mount (names confirmed by LOOKUP and
READDIRPLUS, the writer catch-up, the reader refresh), without FUSE or sockets: the mount's
handlers (LoomOperations) over a real AsyncClient on in-memory meta and storage."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace
from typing import Any

import pyfuse3
import pytest
from test_client_support import FakeMeta, make_client

from loomfs.errors import LoomError
from loomfs.mount.edge import Handle
from loomfs.mount.inodes import InodeTable
from loomfs.mount.ops import LoomOperations
from loomfs.mount.options import MountOptions
from loomfs.wire.types import Attr


def _subtree_renames(meta: FakeMeta) -> None:
    """The fake's rename moves one node; meta's moves a directory with everything under it."""

    async def rename(src: str, dst: str, no_replace: bool = False, expect: Any = None) -> None:
        moved = {p: a for p, a in meta.nodes.items() if p == src or p.startswith(src + "/")}
        for p in moved:
            del meta.nodes[p]
        for p, a in moved.items():
            meta.nodes[dst + p[len(src):]] = a

    meta.rename = rename  # type: ignore[method-assign]


async def _ops() -> tuple[LoomOperations, Any, FakeMeta]:
    client, meta, _storage = make_client()
    _subtree_renames(meta)
    ops = LoomOperations(client, asyncio.get_running_loop(), MountOptions(prefetch_chunks=0))
    return ops, client, meta


async def _file(client: Any, path: str, data: bytes) -> None:
    f = await client.open(path, "wb")
    await f.write(data)
    await f.close()


def _as_due(ops: LoomOperations, f: Any) -> None:
    """``f`` last compared with meta longer than attr_timeout ago."""
    ops._checked_at[f] = time.monotonic() - 10 * ops.options.attr_timeout_s - 1


# --- names --------------------------------------------------------------------------------


def test_a_listing_continued_after_its_directory_was_renamed_keeps_the_subdirectory_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """READDIRPLUS entries of a stream opened before a rename of its directory (here through
    this mount) went into the table under the stream's old path, first: the subdirectory's
    subtree moved back under the old name, and once a new directory was made there, a LOOKUP
    in the subdirectory answered the other directory's file (another file's data at open)."""
    replies: list[tuple[bytes, int]] = []
    room = [3]

    def readdir_reply(token: Any, name: bytes, entry: Any, off: int) -> bool:
        if len(replies) >= room[0]:
            return False  # the kernel's buffer is full
        replies.append((name, entry.st_ino))
        return True

    monkeypatch.setattr(pyfuse3, "readdir_reply", readdir_reply)

    async def main() -> None:
        ops, client, meta = await _ops()
        await meta.mkdir("/d", 0o755, False, False)
        await _file(client, "/d/a1", b"a1")
        await meta.mkdir("/d/sub", 0o755, False, False)
        await _file(client, "/d/sub/f", b"mine")
        d = (await ops.lookup(1, b"d")).st_ino
        sub = (await ops.lookup(d, b"sub")).st_ino
        f = (await ops.lookup(sub, b"f")).st_ino
        fh = await ops.opendir(d, None)
        await ops.readdir(fh, 0, None)  # ".", "..", "a1"; "sub" did not fit
        assert [n for n, _ in replies] == [b".", b"..", b"a1"]
        await ops.rename(1, b"d", 1, b"e", 0, None)  # mv d e (a process here)
        await meta.mkdir("/d", 0o755, False, False)  # another client: mkdir -p d/sub, d/sub/f
        await meta.mkdir("/d/sub", 0o755, False, False)
        await _file(client, "/d/sub/f", b"theirs")
        room[0] = 100
        await ops.readdir(fh, 3, None)  # the listing goes on: "sub" (the directory, now e/sub)
        assert (b"sub", sub) in replies
        await ops.releasedir(fh)
        assert ops.inodes.path(sub) == "/e/sub"
        assert (await ops.lookup(sub, b"f")).st_ino == f  # e/sub/f is this file, not d/sub/f

    asyncio.run(main())


def test_a_listing_continued_after_its_directory_was_renamed_lists_that_directory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The next page of a stream whose directory was renamed since its opendir was asked of
    meta by the old path: the entries of the directory made there since went to the kernel
    as the renamed directory's (its "sub" was the other directory's "sub")."""
    replies: list[tuple[bytes, int]] = []
    room = [3]

    def readdir_reply(token: Any, name: bytes, entry: Any, off: int) -> bool:
        if len(replies) >= room[0]:
            return False
        replies.append((name, entry.st_ino))
        return True

    monkeypatch.setattr(pyfuse3, "readdir_reply", readdir_reply)

    async def main() -> None:
        ops, client, meta = await _ops()
        await meta.mkdir("/d", 0o755, False, False)
        await _file(client, "/d/a1", b"a1")
        await _file(client, "/d/a2", b"a2")
        await meta.mkdir("/d/sub", 0o755, False, False)  # on the fake's second page
        d = (await ops.lookup(1, b"d")).st_ino
        sub = (await ops.lookup(d, b"sub")).st_ino
        fh = await ops.opendir(d, None)
        await ops.readdir(fh, 0, None)  # ".", "..", "a1" (the first page: a1, a2)
        await ops.rename(1, b"d", 1, b"e", 0, None)
        await meta.mkdir("/d", 0o755, False, False)  # another client
        await meta.mkdir("/d/sub", 0o755, False, False)
        room[0] = 100
        await ops.readdir(fh, 3, None)
        await ops.releasedir(fh)
        assert [n for n, _ in replies] == [b".", b"..", b"a1", b"a2", b"sub"]
        assert (b"sub", sub) in replies
        assert ops.inodes.path(sub) == "/e/sub" and ops.inodes.inode_of("/e/sub") == sub

    asyncio.run(main())


def test_a_lookup_answered_before_an_ancestor_rename_here_takes_the_new_path() -> None:
    """A LOOKUP of a directory whose answer came back after a rename of one of its ancestors
    through this mount (the kernel does not serialise the two: different parents) put the
    path it asked by, gone now, first among the directory's names."""

    async def main() -> None:
        ops, _client, meta = await _ops()
        for p in ("/a", "/a/b", "/a/b/c"):
            await meta.mkdir(p, 0o755, False, False)
        a = (await ops.lookup(1, b"a")).st_ino
        b = (await ops.lookup(a, b"b")).st_ino
        gate = asyncio.Event()
        asked = asyncio.Event()
        stat = meta.stat

        async def slow_stat(path: str, follow_symlinks: bool = True) -> Attr:
            attr = await stat(path, follow_symlinks)  # meta answered before the rename
            if path == "/a/b/c":
                asked.set()
                await gate.wait()
            return attr

        meta.stat = slow_stat  # type: ignore[method-assign]
        lookup = asyncio.ensure_future(ops.lookup(b, b"c"))
        await asyncio.wait_for(asked.wait(), 5)
        await ops.rename(1, b"a", 1, b"z", 0, None)
        gate.set()
        c = (await lookup).st_ino
        assert ops.inodes.path(c) == "/z/b/c"
        assert ops.inodes.inode_of("/a/b/c") is None

    asyncio.run(main())


def test_a_lookup_miss_by_a_path_an_ancestor_rename_here_moved_drops_no_name() -> None:
    """The other order: meta renamed the ancestor first, so the LOOKUP by the old path missed;
    the name under the parent's new path is not what meta said was missing."""

    async def main() -> None:
        ops, _client, meta = await _ops()
        for p in ("/a", "/a/b", "/a/b/c"):
            await meta.mkdir(p, 0o755, False, False)
        a = (await ops.lookup(1, b"a")).st_ino
        b = (await ops.lookup(a, b"b")).st_ino
        c = (await ops.lookup(b, b"c")).st_ino
        gate = asyncio.Event()
        asked = asyncio.Event()
        stat = meta.stat

        async def slow_stat(path: str, follow_symlinks: bool = True) -> Attr:
            if path == "/a/b/c":
                asked.set()
                await gate.wait()  # meta answers after the rename
            return await stat(path, follow_symlinks)

        meta.stat = slow_stat  # type: ignore[method-assign]
        lookup = asyncio.ensure_future(ops.lookup(b, b"c"))
        await asyncio.wait_for(asked.wait(), 5)
        await ops.rename(1, b"a", 1, b"z", 0, None)
        gate.set()
        with pytest.raises(pyfuse3.FUSEError):
            await lookup
        assert ops.inodes.path(c) == "/z/b/c"

    asyncio.run(main())


def test_a_directory_found_under_a_name_the_table_knew_children_under_drops_them() -> None:
    """found() moves a directory's subtree under its new name; entries the table still had
    under that name (of the directory removed there, elsewhere) must go, not stay as names of
    their inodes that now lead to the moved directory's children."""
    t = InodeTable()
    t.remember(2, "/d")
    t.remember(3, "/d/sub")
    t.remember(4, "/e")
    t.remember(5, "/e/sub")  # stale: another client removed e/sub and e, then mv d e
    t.found(2, "/e", directory=True)
    assert t.inode_of("/e/sub") == 3 and t.path(3) == "/e/sub"
    assert not t.has_name(5)  # /e/sub leads to inode 3: no name of 5 any more


# --- the writer catch-up ------------------------------------------------------------------


async def _writer(ops: LoomOperations, meta: FakeMeta, name: bytes, data: bytes) -> tuple[int, int, Handle]:
    fi, entry = await ops.create(1, name, 0o644, os.O_WRONLY | os.O_CREAT, None)
    assert await ops.write(fi.fh, 0, data) == len(data)
    await ops.fsync(fi.fh, False)
    h = ops.handles[fi.fh]
    assert isinstance(h, Handle)
    return fi.fh, entry.st_ino, h


def test_a_getattr_of_an_idle_write_file_does_not_sync_it() -> None:
    """Meta stamps mtime and ctime at every sync that reports a length: the catch-up's fsync
    at a GETATTR of a file open for writing, idle since its last fsync, moved the file's
    mtime forward at every stat (once per attr_timeout), and every reader's copy with it."""

    async def main() -> None:
        ops, _client, meta = await _ops()
        _fh, inode, h = await _writer(ops, meta, b"w", b"x" * 10)
        syncs = len(meta.syncs)
        _as_due(ops, h.file)
        assert (await ops.getattr(inode, None)).st_size == 10
        assert len(meta.syncs) == syncs

    asyncio.run(main())


def test_a_getattr_does_not_wait_for_the_write_file_lock_when_not_due() -> None:
    """A GETATTR of a file with a write descriptor here took the file's lock before looking
    whether a catch-up was due: every stat waited for the WRITE, fsync or close in flight."""

    async def main() -> None:
        ops, _client, meta = await _ops()
        _fh, inode, h = await _writer(ops, meta, b"w", b"x" * 10)
        async with h.lock:  # a WRITE (or fsync) of the file in flight
            entry = await asyncio.wait_for(ops.getattr(inode, None), 2)
        assert entry.st_size == 10

    asyncio.run(main())


def test_an_append_write_is_not_refused_for_a_failed_length_check() -> None:
    """The catch-up before an O_APPEND write asks meta's length; that check failing (meta
    unreachable for a moment) failed the write itself, which before needed no meta call."""

    async def main() -> None:
        ops, client, meta = await _ops()
        await _file(client, "/log", b"line1\n")
        inode = meta.nodes["/log"].inode
        ops.inodes.remember(inode, "/log")
        fi = await ops.open(inode, os.O_WRONLY | os.O_APPEND, None)
        h = ops.handles[fi.fh]
        assert isinstance(h, Handle)
        _as_due(ops, h.file)

        async def down(path: str, follow_symlinks: bool = True) -> Attr:
            raise LoomError("meta unreachable", errno=110, path=path)

        meta.stat = down  # type: ignore[method-assign]
        assert await ops.write(fi.fh, 0, b"line2\n") == 6
        await ops.flush(fi.fh)
        await ops.release(fi.fh)
        f = await client.open("/log", "rb")
        assert await f.read() == b"line1\nline2\n"
        await f.close()

    asyncio.run(main())


def test_a_catch_up_whose_name_went_meanwhile_keeps_the_open_file() -> None:
    """The catch-up found the lengths different, closed the write file, then opened its name
    again: renamed (logrotate elsewhere) between meta's answer and that open, the descriptor
    was left a closed file no name reopens, and every later write failed (ENOENT)."""

    async def main() -> None:
        ops, client, meta = await _ops()
        await _file(client, "/log", b"line1\n")
        inode = meta.nodes["/log"].inode
        ops.inodes.remember(inode, "/log")
        fi = await ops.open(inode, os.O_WRONLY | os.O_APPEND, None)
        h = ops.handles[fi.fh]
        assert isinstance(h, Handle)
        _as_due(ops, h.file)
        stat = meta.stat
        open_ = meta.open

        async def longer(path: str, follow_symlinks: bool = True) -> Attr:
            attr = await stat(path, follow_symlinks)  # another client wrote to it
            return replace(attr, size=attr.size + 1) if path == "/log" else attr

        async def then_renamed(path: str, *args: Any, **kw: Any) -> Any:
            if path == "/log" and "/log" in meta.nodes:  # then renamed it away (logrotate)
                meta.nodes["/log.1"] = meta.nodes.pop("/log")
            return await open_(path, *args, **kw)

        meta.stat = longer  # type: ignore[method-assign]
        meta.open = then_renamed  # type: ignore[method-assign]

        assert await ops.write(fi.fh, 0, b"line2\n") == 6
        assert await ops.write(fi.fh, 0, b"line3\n") == 6
        await ops.flush(fi.fh)
        await ops.release(fi.fh)
        f = await client.open("/log.1", "rb")
        assert await f.read() == b"line1\nline2\nline3\n"
        await f.close()

    asyncio.run(main())


# --- the reader refresh -------------------------------------------------------------------


def test_a_read_is_not_refused_for_a_failed_refresh() -> None:
    """A READ of a read-only handle due for a refresh asks meta's attributes first; that
    call failing (meta unreachable for a moment) failed the READ, which needs only storage."""

    async def main() -> None:
        ops, client, meta = await _ops()
        await _file(client, "/r", b"0123456789")
        inode = meta.nodes["/r"].inode
        ops.inodes.remember(inode, "/r")
        f = await client.open("/r", "rb")
        ops.handles[1] = Handle(inode, f, False)
        _as_due(ops, f)

        async def down(path: str, follow_symlinks: bool = True) -> Attr:
            raise LoomError("meta unreachable", errno=110, path=path)

        meta.stat = down  # type: ignore[method-assign]
        assert bytes(await ops.read(1, 0, 4)) == b"0123"
        await ops.release(1)

    asyncio.run(main())
