"""The mount's inode -> path table (no I/O, no mount needed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import pytest

from loomfs.mount.dirs import DirStream
from loomfs.mount.inodes import ROOT_INODE, InodeTable
from loomfs.mount.options import MountOptions
from loomfs.wire.types import Attr, DirEntry


def test_lookups_and_forget() -> None:
    t = InodeTable()
    t.remember(5, "/a")
    t.remember(5, "/a")
    assert t.path(5) == "/a" and t.lookups(5) == 2
    t.forget(5, 1)
    assert t.path(5) == "/a"
    t.forget(5, 1)
    with pytest.raises(FileNotFoundError):
        t.path(5)
    assert t.inode_of("/a") is None
    t.forget(ROOT_INODE, 10)
    assert t.path(ROOT_INODE) == "/"


def test_rename_moves_subtrees_and_replaces() -> None:
    t = InodeTable()
    t.remember(2, "/d")
    t.remember(3, "/d/x")
    t.remember(4, "/d/xy")
    t.remember(9, "/e")
    t.renamed("/d", "/e")
    assert (t.path(2), t.path(3), t.path(4)) == ("/e", "/e/x", "/e/xy")
    with pytest.raises(FileNotFoundError):
        t.path(9)  # replaced by the rename
    t.renamed("/e/x", "/e/xy", exchange=True)
    assert (t.path(3), t.path(4)) == ("/e/xy", "/e/x")
    assert repr(t) == "InodeTable(inodes=5, paths=4, open=0)"


def test_hard_links_keep_the_inode_named() -> None:
    t = InodeTable()
    t.remember(7, "/a")
    t.remember(7, "/b")
    t.unlinked("/a")
    assert t.path(7) == "/b"
    t.unlinked("/b")
    with pytest.raises(FileNotFoundError):
        t.path(7)


def test_options() -> None:
    o = MountOptions.parse(["attr_timeout=2,entry_timeout=0.5,allow_other", "loop=separate"])
    assert (o.attr_timeout_s, o.entry_timeout_s, o.loop) == (2.0, 0.5, "separate")
    assert o.fuse_options("loomfs:x") >= {"allow_other", "default_permissions", "fsname=loomfs:x"}
    assert "default_permissions" not in MountOptions.parse(["no_default_permissions"]).kernel
    with pytest.raises(ValueError):
        MountOptions.parse(["max_read=4194304"])
    with pytest.raises(ValueError):
        MountOptions.parse(["loop=trio"])


def test_dir_stream_pages_and_seeks() -> None:
    """readdir offsets over a paged listing: sequential, past the end, seekdir back, rewinddir."""
    names = [f"n{i:04d}" for i in range(25)]
    fetched: list[str] = []

    async def pages_after(after: str) -> AsyncIterator[list[DirEntry]]:
        fetched.append(after)
        rest = [n for n in names if n > after]
        for k in range(0, len(rest), 10):
            yield [DirEntry(name=n) for n in rest[k:k + 10]]

    async def run(coro: Coroutine[Any, Any, Any]) -> Any:
        return await coro

    async def listing(s: DirStream, start: int) -> list[str]:
        out, i = [], start
        base, page = await s.page_at(i)
        while page:
            out += [e.name for e in page[i - base:]]
            i = base + len(page)
            base, page = await s.page_at(i)
        return out

    async def scenario() -> None:
        s = DirStream("/d", pages_after, run)
        assert await listing(s, 0) == names and fetched == [""]
        assert s.pages is None and len(s.starts) == 3  # read to the end; one cursor per page
        assert await listing(s, 25) == []
        assert await listing(s, 13) == names[13:] and fetched[-1] == "n0009"  # seekdir: from page 2
        assert await listing(s, 3) == names[3:] and fetched[-1] == ""
        names.append("n9999")  # rewinddir sees new entries
        assert await listing(s, 0) == names
        base, page = await s.page_at(4)
        assert base == 0 and page[4].name == "n0004" and "DirStream('/d'" in repr(s)
        await s.close()

    asyncio.run(scenario())


def test_open_inodes_keep_their_attributes() -> None:
    t = InodeTable()
    t.remember(7, "/f")
    t.seen(Attr(inode=7, nlink=2, size=1))  # not open: not kept
    assert t.kept(7) is None
    t.opened(7)
    t.opened(7)
    t.seen(Attr(inode=7, nlink=2, size=5))
    t.unlinked("/f")
    kept = t.kept(7)
    assert kept is not None and (kept.nlink, kept.size) == (1, 5) and not t.has_name(7)
    assert "open=1" in repr(t)
    t.closed(7)
    assert t.kept(7) is not None and t.is_open(7)
    t.closed(7)
    assert t.kept(7) is None and not t.is_open(7)


def test_id_maps_and_page_cache_options() -> None:
    from loomfs.mount.idmap import IdMap

    m = IdMap.parse("1000:5000/1001:5001")
    assert (m.cluster(1000), m.cluster(7), m.local(5001), m.local(1000), m.cluster(-1)) == (5000, 7, 1001, 1000, -1)
    for bad in ("1000", "1000:5000/1000:6000", "1:2/3:2", "-1:3", "a:b"):
        with pytest.raises(ValueError):
            IdMap.parse(bad)
    o = MountOptions.parse(["uid_map=1000:0,gid_map=10:20/11:21,cache=keep,direct_io,ro,consistency=relaxed"])
    assert (o.uid_map.cluster(1000), o.gid_map.local(21), o.cache, o.direct_io, o.read_only, o.consistency) == (
        0, 11, "keep", True, True, "relaxed")
    assert "ro" in o.fuse_options("x")
    for bad in ("cache=maybe", "consistency=eventual", "max_read=4096"):
        with pytest.raises(ValueError):
            MountOptions.parse([bad])
