"""MetaStore engine contract, run against every backend: sqlite, and postgresql on a private
server (``pg_url`` in tests/conftest.py; a fresh schema per test)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from loomfs.meta.store.base import GcEntry, InlineData, MetaStore, TrimEntry
from loomfs.meta.store.postgres import PostgresStore
from loomfs.meta.store.sqlite import SqliteStore
from loomfs.wire.types import Attr, FileType, Layout

T = TypeVar("T")

BACKENDS: dict[str, Callable[[pytest.FixtureRequest, Path], str]] = {
    "sqlite": lambda request, tmp: f"sqlite:///{tmp / 'meta.db'}",
    "postgresql": lambda request, tmp: str(request.getfixturevalue("pg_url")),
}


@pytest.fixture(params=sorted(BACKENDS))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MetaStore]:
    s = MetaStore.open(BACKENDS[request.param](request, tmp_path), synchronous="NORMAL")
    _open.append(s)
    yield s
    _open.remove(s)
    asyncio.run(s.close())


_open: list[MetaStore] = []  # stores whose connections a run() closes before its loop ends


def run(aw: Awaitable[T]) -> T:
    async def main() -> T:
        try:
            return await aw
        finally:
            for s in _open:
                if isinstance(s, PostgresStore):
                    await s.release()

    return asyncio.run(main())


LAY = Layout(chunk_size=1 << 20, stripe=2, table_id=1, replicas=3, chains=[5, 6])


def _attr(ino: int, **kw: int) -> Attr:
    return Attr(inode=ino, type=FileType.FILE, mode=0o644, nlink=1, size=kw.get("size", 0),
                mtime_ns=1, ctime_ns=1, atime_ns=1, layout=LAY, symlink_target="")


def test_open_by_url(tmp_path: Path) -> None:
    s = MetaStore.open(f"sqlite:///{tmp_path}/x/meta.db")
    assert isinstance(s, SqliteStore) and "commits=0" in repr(s)
    run(s.close())
    with pytest.raises(ValueError):
        MetaStore.open("nosuch:///x")
    with pytest.raises(ValueError):
        MetaStore.open("no-scheme")
    with pytest.raises(ValueError):
        MetaStore.open(f"sqlite:///{tmp_path}/y.db", synchronous="SOMETIMES")


def test_inodes_roundtrip(store: MetaStore) -> None:
    async def go() -> None:
        a = _attr(7, size=123)
        link = Attr(inode=8, type=FileType.SYMLINK, mode=0o777, symlink_target="../é/x", size=7)
        async with store.write() as t:
            await t.put_inode(a)
            await t.put_inode(link)
        async with store.read() as t:
            assert await t.get_inode(7) == a
            assert await t.get_inode(8) == link
            assert await t.get_inode(9) is None
            assert await t.get_inodes([7, 8, 9]) == {7: a, 8: link}
        async with store.write() as t:
            await t.touch_inode(7, mtime_ns=50, ctime_ns=60, nlink_delta=2)
            await t.delete_inode(8)
        async with store.read() as t:
            got = await t.get_inode(7)
            assert got is not None and (got.mtime_ns, got.ctime_ns, got.nlink) == (50, 60, 3)
            assert await t.get_inode(8) is None
        many = list(range(100, 1300))
        async with store.write() as t:
            for i in many:
                await t.put_inode(_attr(i))
        async with store.read() as t:
            assert len(await t.get_inodes(many)) == len(many)

    run(go())


def test_dentries_lookup_and_range_scan(store: MetaStore) -> None:
    async def go() -> None:
        names = ["b", "a", "é", "Z", "aa", "a b", "日本"]
        async with store.write() as t:
            for i, n in enumerate(names):
                await t.put_dentry(1, n, 10 + i, FileType.FILE)
            await t.put_dentry(2, "other", 99, FileType.DIRECTORY)
        async with store.read() as t:
            row = await t.lookup(1, "é")
            assert row is not None and (row.inode, row.type) == (12, FileType.FILE)
            assert await t.lookup(1, "nope") is None
            assert await t.lookup(2, "a") is None
            listed = [d.name for d in await t.list_dentries(1, "", 100)]
            assert listed == sorted(names, key=lambda s: s.encode())
            assert [d.name for d in await t.list_dentries(1, "a", 2)] == ["a b", "aa"]
            assert await t.list_dentries(1, "日本", 10) == []
            assert await t.has_dentries(2) and not await t.has_dentries(3)
        async with store.write() as t:
            await t.put_dentry(1, "a", 55, FileType.SYMLINK)  # replace
            await t.delete_dentry(1, "b")
        async with store.read() as t:
            row = await t.lookup(1, "a")
            assert row is not None and row.inode == 55 and row.type == FileType.SYMLINK
            assert await t.lookup(1, "b") is None

    run(go())


def test_write_rolls_back_on_error(store: MetaStore) -> None:
    async def go() -> None:
        with pytest.raises(RuntimeError):
            async with store.write() as t:
                await t.put_inode(_attr(5))
                await t.put_dentry(1, "x", 5, FileType.FILE)
                await t.add_counter("files", 1)
                raise RuntimeError("abort")
        async with store.read() as t:
            assert await t.get_inode(5) is None
            assert await t.lookup(1, "x") is None
            assert (await t.counters()).get("files", 0) == 0

    run(go())


def test_read_txn_refuses_writes(store: MetaStore) -> None:
    async def go() -> None:
        async with store.read() as t:
            with pytest.raises(Exception):  # noqa: B017 - engine-specific error type
                await t.put_inode(_attr(5))

    run(go())


def test_counters_and_ids(store: MetaStore) -> None:
    async def go() -> None:
        async with store.write() as t:
            assert await t.next_id("inode") == 1
            assert await t.next_id("inode") == 2
            await t.add_counter("session", 40)
            assert await t.next_id("session") == 41
            await t.add_counter("bytes", 10)
            await t.add_counter("bytes", -3)
        async with store.read() as t:
            assert await t.counters() == {"inode": 2, "session": 41, "bytes": 7}

    run(go())


def test_sessions(store: MetaStore) -> None:
    async def go() -> None:
        async with store.write() as t:
            await t.add_session(7, 1, 100, 0)
            await t.add_session(7, 2, 101, 0)
            await t.add_session(8, 3, 100, 0)
        async with store.write() as t:
            assert await t.remove_session(7, 1)
            assert not await t.remove_session(7, 1)
            assert await t.has_session(7)
            assert await t.remove_client_sessions(100) == 1
        async with store.read() as t:
            assert await t.has_session(7) and not await t.has_session(8)
            assert await t.session_count(7) == 1 and await t.session_count(8) == 0

    run(go())


def test_gc_queue(store: MetaStore) -> None:
    async def go() -> None:
        async with store.write() as t:
            for ino, when in [(10, 300), (11, 100), (12, 200), (13, 50)]:
                await t.gc_put(GcEntry(ino, LAY, ino * 10, when))
            await t.add_session(13, 1, 1, 0)  # open for write: never due
        async with store.read() as t:
            assert await t.gc_count() == 4
            assert [e.inode for e in await t.gc_due(250, 10)] == [11, 12]
            assert [e.inode for e in await t.gc_due(1000, 2)] == [11, 12]
            got = await t.gc_get(10)
            assert got == GcEntry(10, LAY, 100, 300)
        async with store.write() as t:
            await t.gc_delete(11)
            await t.gc_put(GcEntry(12, LAY, 999, 200))
            await t.remove_session(13, 1)
        async with store.read() as t:
            assert [(e.inode, e.length) for e in await t.gc_due(1000, 10)] == [(13, 130), (12, 999), (10, 100)]

    run(go())


def test_trunc_epochs(store: MetaStore) -> None:
    async def go() -> None:
        async with store.write() as t:
            assert await t.trunc_epoch(7) == 0
            await t.set_trunc_epoch(7, 3)
            await t.set_trunc_epoch(8, 1)
        async with store.write() as t:
            assert (await t.trunc_epoch(7), await t.trunc_epoch(8)) == (3, 1)
            await t.set_trunc_epoch(8, 0)  # forgets it
        async with store.read() as t:
            assert (await t.trunc_epoch(7), await t.trunc_epoch(8)) == (3, 0)

    run(go())


def test_trim_queue(store: MetaStore) -> None:
    def trim(ino: int, when: int, *, idle: bool = False, until: int = 0) -> TrimEntry:
        return TrimEntry(ino, LAY, ino * 10, ino * 100, idle, 1, when, claim_owner=5 if until else 0,
                         claim_until_ns=until)

    async def go() -> None:
        async with store.write() as t:
            await t.trim_put(trim(10, 300))
            await t.trim_put(trim(11, 100, until=500))  # claimed until 500
            await t.trim_put(trim(12, 200, idle=True))  # idle: not while a write session is open
            await t.trim_put(trim(13, 50))
            await t.add_session(12, 1, 1, 0)
        async with store.read() as t:
            assert await t.trim_count() == 4
            assert [e.inode for e in await t.trim_due(499, 10)] == [13, 10]
            assert [e.inode for e in await t.trim_due(500, 10)] == [13, 11, 10]
            assert [e.inode for e in await t.trim_due(500, 1)] == [13]
            assert await t.trim_get(12) == trim(12, 200, idle=True)
            assert await t.trim_get(11) == trim(11, 100, until=500)
            assert await t.trim_get(99) is None
        async with store.write() as t:
            await t.trim_delete(13)
            await t.trim_put(TrimEntry(10, LAY, 7, 1000, False, 2, 300))  # replaces
            await t.remove_session(12, 1)
        async with store.read() as t:
            assert [(e.inode, e.length, e.generation) for e in await t.trim_due(1000, 10)] == [
                (11, 110, 1), (12, 120, 1), (10, 7, 2)]
            assert await t.trim_count() == 3

    run(go())


def test_persists_across_reopen(store: MetaStore) -> None:
    url = store.url
    run(_put(store))
    run(store.close())
    again = MetaStore.open(url)
    _open.append(again)
    try:
        async def check() -> None:
            async with again.read() as t:
                assert await t.get_inode(42) == _attr(42, size=9)
                assert await t.lookup(1, "kept") is not None

        run(check())
    finally:
        _open.remove(again)
        run(again.close())


async def _put(store: MetaStore) -> None:
    async with store.write() as t:
        await t.put_inode(_attr(42, size=9))
        await t.put_dentry(1, "kept", 42, FileType.FILE)


def test_concurrent_transactions_serialise(store: MetaStore) -> None:
    async def go() -> None:
        async def bump(k: int) -> None:
            for _ in range(20):
                async with store.write() as t:
                    await t.next_id("n")
                await asyncio.sleep(0)

        await asyncio.gather(*(bump(k) for k in range(5)))
        async with store.read() as t:
            assert (await t.counters())["n"] == 100

    run(go())


def test_concurrent_writes_commit_and_are_read_back(store: MetaStore) -> None:
    """Writes issued together (an engine may commit them as one group) each get a distinct
    id, each is readable as soon as its ``write()`` returns, and all of them stay."""

    async def go() -> None:
        async def create(ino: int) -> int:
            async with store.write() as t:
                n = await t.next_id("n")
                await t.put_inode(_attr(ino, size=n))
                await t.put_dentry(1, f"c{ino}", ino, FileType.FILE)
            async with store.read() as t:
                got = await t.get_inode(ino)
                assert got is not None and got.size == n
            return n

        ids = await asyncio.gather(*(create(300 + i) for i in range(40)))
        assert sorted(ids) == list(range(1, 41))
        async with store.read() as t:
            assert len(await t.get_inodes(range(300, 340))) == 40
            assert [d.name for d in await t.list_dentries(1, "", 100)] == sorted(f"c{i}" for i in range(300, 340))

    run(go())


def test_failing_write_among_concurrent_ones_undoes_only_itself(store: MetaStore) -> None:
    async def go() -> None:
        async def create(ino: int) -> None:
            async with store.write() as t:
                await t.put_inode(_attr(ino))
                await t.add_counter("files", 1)
                if ino == 403:
                    raise KeyError("this one fails")

        results = await asyncio.gather(*(create(400 + i) for i in range(8)), return_exceptions=True)
        assert isinstance(results[3], KeyError)  # the body's own error, as raised
        assert [r for i, r in enumerate(results) if i != 3] == [None] * 7
        async with store.read() as t:
            assert set(await t.get_inodes(range(400, 408))) == set(range(400, 408)) - {403}
            assert (await t.counters())["files"] == 7

    run(go())


def test_awkward_values_round_trip_and_a_txn_reads_its_own_writes(store: MetaStore) -> None:
    """Quotes, backslashes, $n, semicolons and every byte value (the PostgreSQL engine sends
    answerless writes later as literals); a transaction reads what it wrote before."""
    names = ["it's", "back\\slash", "$1", "semi;colon -- x", "'; DROP TABLE inodes; --", "\\x41", "é'\\"]
    target = "a'b\\c$2/../'"
    blob = bytes(range(256)) * 3

    async def go() -> None:
        async with store.write() as t:
            for i, n in enumerate(names):
                await t.put_dentry(1, n, 500 + i, FileType.FILE)
                row = await t.lookup(1, n)  # its own write, before the commit
                assert row is not None and row.inode == 500 + i
            await t.put_inode(Attr(inode=600, type=FileType.SYMLINK, mode=0o777, symlink_target=target,
                                   size=len(target)))
            await t.put_inline(601, InlineData(blob, 7, 3, True))
            assert await t.get_inline(601) == InlineData(blob, 7, 3, True)
            await t.add_counter("files", -5)
        async with store.read() as t:
            assert [d.name for d in await t.list_dentries(1, "", 100)] == sorted(names, key=lambda s: s.encode())
            for i, n in enumerate(names):
                row = await t.lookup(1, n)
                assert row is not None and row.inode == 500 + i
            link = await t.get_inode(600)
            assert link is not None and link.symlink_target == target
            assert await t.get_inline(601) == InlineData(blob, 7, 3, True)
            assert (await t.counters())["files"] == -5

    run(go())


def test_lookup_path(store: MetaStore) -> None:
    """The entries along a path in one call: stops after a non-directory and before a
    missing name."""
    D, F, L = FileType.DIRECTORY, FileType.FILE, FileType.SYMLINK

    async def go() -> None:
        async with store.write() as t:
            await t.put_dentry(1, "a", 10, D)
            await t.put_dentry(10, "b", 11, D)
            await t.put_dentry(11, "c", 12, F)
            await t.put_dentry(11, "l", 13, L)
            await t.put_dentry(10, "it's", 14, D)
        async with store.read() as t:
            got = await t.lookup_path(1, ["a", "b", "c"])
            assert [(r.name, r.inode, r.type) for r in got] == [("a", 10, D), ("b", 11, D), ("c", 12, F)]
            assert [r.inode for r in await t.lookup_path(1, ["a", "b", "c", "x"])] == [10, 11, 12]
            assert [r.inode for r in await t.lookup_path(1, ["a", "b", "l", "x"])] == [10, 11, 13]
            assert [r.inode for r in await t.lookup_path(1, ["a", "nope", "c"])] == [10]
            assert [r.inode for r in await t.lookup_path(1, ["a", "it's"])] == [10, 14]
            assert await t.lookup_path(1, ["zz", "b"]) == []
            assert [r.inode for r in await t.lookup_path(10, ["b"])] == [11]
            assert await t.lookup_path(1, []) == []
        async with store.write() as t:  # a transaction sees its own entries
            await t.put_dentry(12 + 100, "q", 99, F)
            await t.put_dentry(11, "new", 112, D)
            assert [r.inode for r in await t.lookup_path(1, ["a", "b", "new", "q"])] == [10, 11, 112, 99]

    run(go())


def test_scan_inodes_pages_in_id_order(store: MetaStore) -> None:
    async def go() -> None:
        async with store.write() as t:
            for ino in (12, 3, 40, 7):
                await t.put_inode(_attr(ino, size=ino))
        async with store.read() as t:
            first = await t.scan_inodes(0, 2)
            rest = await t.scan_inodes(first[-1].inode, 10)
            assert [a.inode for a in first] == [3, 7]
            assert [a.inode for a in rest] == [12, 40]
            assert rest[1].layout == LAY and rest[1].size == 40
            assert await t.scan_inodes(40, 10) == []

    run(go())


def test_worker_state_blobs(store: MetaStore) -> None:
    async def go() -> None:
        async with store.write() as t:
            await t.state_put("ec_rebuild/2", b"\x00two")
            await t.state_put("ec_rebuild/10", b"ten")
            await t.state_put("ec_rebuilder", b"other prefix")
            await t.state_put("gc", b"x")
        async with store.write() as t:
            await t.state_put("ec_rebuild/2", b"two again")  # replaced
        async with store.read() as t:
            assert await t.state_get("ec_rebuild/2") == b"two again"
            assert await t.state_get("nope") is None
            assert await t.state_list("ec_rebuild/") == [("ec_rebuild/10", b"ten"), ("ec_rebuild/2", b"two again")]
        async with store.write() as t:
            await t.state_delete("ec_rebuild/10")
            await t.state_delete("never-there")
        async with store.read() as t:
            assert [k for k, _ in await t.state_list("ec_rebuild")] == ["ec_rebuild/2", "ec_rebuilder"]
            assert await t.state_list("") != []

    run(go())


def test_xattrs_round_trip_and_go_with_their_inode(store: MetaStore) -> None:
    async def go() -> None:
        big = bytes(range(256)) * 256  # 64 KiB, every byte value
        names = [b"user.b", b"user.a", b"user.\xff\x00x", b"user.\xc3\xa9", b"user.A"]
        async with store.write() as t:
            await t.put_inode(_attr(7))
            await t.put_inode(_attr(8))
            for i, n in enumerate(names):
                await t.put_xattr(7, n, b"v%d" % i)
            await t.put_xattr(7, b"user.big", big)
            await t.put_xattr(7, b"user.empty", b"")
            await t.put_xattr(8, b"user.a", b"eight")
            assert await t.get_xattr(7, b"user.a") == b"v1"  # a write transaction reads its own
        async with store.read() as t:
            assert await t.get_xattr(7, b"user.\xff\x00x") == b"v2"
            assert await t.get_xattr(7, b"user.big") == big
            assert await t.get_xattr(7, b"user.empty") == b""
            assert await t.get_xattr(7, b"user.nope") is None
            assert await t.get_xattr(9, b"user.a") is None
            listed = await t.list_xattrs(7)
            assert [n for n, _ in listed] == sorted([*names, b"user.big", b"user.empty"])  # byte order
            assert dict(listed)[b"user.big"] == len(big) and dict(listed)[b"user.empty"] == 0
            assert await t.list_xattrs(8) == [(b"user.a", 5)]
            assert await t.list_xattrs(9) == []
        async with store.write() as t:
            await t.put_xattr(7, b"user.a", b"replaced")
            assert await t.delete_xattr(7, b"user.b")
            assert not await t.delete_xattr(7, b"user.b")
            assert not await t.delete_xattr(9, b"user.a")
        async with store.read() as t:
            assert await t.get_xattr(7, b"user.a") == b"replaced"
            assert await t.get_xattr(7, b"user.b") is None
        with pytest.raises(RuntimeError):  # a failed write leaves no attribute behind
            async with store.write() as t:
                await t.put_xattr(8, b"user.lost", b"x")
                raise RuntimeError("undo")
        async with store.write() as t:
            await t.delete_inode(7)  # its attributes go with it; another inode's stay
        async with store.read() as t:
            assert await t.list_xattrs(7) == [] and await t.get_xattr(7, b"user.a") is None
            assert await t.list_xattrs(8) == [(b"user.a", 5)]
        with pytest.raises(Exception):  # noqa: B017 (each engine raises its own read-only error)
            async with store.read() as t:
                await t.put_xattr(8, b"user.x", b"y")
                await t.get_xattr(8, b"user.x")  # PostgreSQL sends deferred writes with a read

    run(go())


def test_device_numbers_round_trip(store: MetaStore) -> None:
    async def go() -> None:
        dev = Attr(inode=11, type=FileType.CHAR_DEVICE, mode=0o600, rdev=(1 << 63) - 1)
        blk = Attr(inode=12, type=FileType.BLOCK_DEVICE, mode=0o600, rdev=os.makedev(8, 1))
        async with store.write() as t:
            await t.put_inode(dev)
            await t.put_inode(blk)
        async with store.read() as t:
            assert await t.get_inodes([11, 12]) == {11: dev, 12: blk}
            assert [a.rdev for a in await t.scan_inodes(10, 5)] == [dev.rdev, blk.rdev]

    run(go())


def test_get_perms_reads_type_mode_and_owner(store: MetaStore) -> None:
    async def go() -> None:
        d = Attr(inode=20, type=FileType.DIRECTORY, mode=0o1777, uid=5, gid=6)
        f = Attr(inode=21, type=FileType.FILE, mode=0o4750, uid=1000, gid=100, layout=LAY)
        async with store.write() as t:
            await t.put_inode(d)
            await t.put_inode(f)
            for i in range(1000, 1600):
                await t.put_inode(_attr(i))
            assert await t.get_perms([21]) == {21: (int(FileType.FILE), 0o4750, 1000, 100)}  # its own write
        async with store.read() as t:
            got = await t.get_perms([20, 21, 22])
            assert got == {20: (int(FileType.DIRECTORY), 0o1777, 5, 6), 21: (int(FileType.FILE), 0o4750, 1000, 100)}
            assert await t.get_perms([]) == {}
            assert len(await t.get_perms(list(range(1000, 1600)))) == 600  # past one statement's 500

    run(go())


def test_read_holds_and_orphans(store: MetaStore) -> None:
    """Read holds are leases beside write sessions (renewed, expired and removed with them)
    that grant no write; orphans list nameless files, and those with no holder left."""
    async def go() -> None:
        async with store.write() as t:
            await t.add_session(7, 1, 100, 0)
            await t.add_hold(7, 2, 100, 0)
            await t.add_hold(8, 3, 101, 0)
            await t.add_hold(9, 4, 102, 50)
            for ino in (7, 8, 9, 10):
                await t.orphan_put(ino, 1000 + ino)
        async with store.read() as t:
            assert [await t.holders(i) for i in (7, 8, 9, 10)] == [2, 1, 1, 0]
            assert await t.session_count(7) == 1 and not await t.has_session(8)  # holds are no write sessions
            assert await t.session_client(8, 3) is None
            assert await t.orphan_since(8) == 1008 and await t.orphan_since(11) is None
            assert await t.orphans_unheld(10) == [10]
            assert await t.orphan_list(7, 2) == [(8, 1008), (9, 1009)]
        async with store.write() as t:
            assert await t.renew_sessions(100, [1, 2], 40) == 2  # a session and a hold of client 100
            assert await t.remove_hold(8, 3) and not await t.remove_hold(8, 3)
            gone = await t.expire_sessions(45, 10)  # hold 4 was renewed at 50
            assert sorted(gone) == [(7, 1, 100), (7, 2, 100)]
        async with store.read() as t:
            assert sorted(await t.orphans_unheld(10)) == [7, 8, 10]
        async with store.write() as t:
            assert await t.remove_client_sessions(102) == 1
            await t.orphan_delete(10)
        async with store.read() as t:
            assert sorted(await t.orphans_unheld(10)) == [7, 8, 9]
            assert await t.orphan_since(10) is None

    run(go())
