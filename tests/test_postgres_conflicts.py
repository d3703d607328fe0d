"""PostgreSQL metastore under concurrency (issue 12): serialisable writes from two stores (two
meta servers) on one database, conflicts raised as TxnConflict, bounded re-runs, and the
write-alone gate that keeps a hot row from starving an operation."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import time

import pytest

from loomfs.meta.service import retry_conflicts
from loomfs.meta.store.base import WRITE_ALONE, MetaStore, TxnConflict
from loomfs.meta.store.postgres import PostgresStore, StoreUnavailable
from loomfs.testing.pgserver import PgServer
from loomfs.wire.types import Attr, FileType


def _open(url: str) -> PostgresStore:
    s = MetaStore.open(url)
    assert isinstance(s, PostgresStore)
    return s


async def _bump(store: MetaStore, ino: int) -> None:
    """Read-modify-write of one inode's size: a lost update unless transactions serialise."""
    async with store.write() as t:
        a = await t.get_inode(ino)
        assert a is not None
        await asyncio.sleep(0)  # let the other writers read the same version
        await t.put_inode(dataclasses.replace(a, size=a.size + 1))


def test_read_modify_write_from_two_stores_loses_no_update(pg_url: str) -> None:
    async def go() -> None:
        a, b = _open(pg_url), _open(pg_url)
        try:
            async with a.write() as t:
                await t.put_inode(Attr(inode=7, type=FileType.FILE, mode=0o644, nlink=1))
            per_task, tasks = 15, 8
            stores = [a, b]

            async def worker(k: int) -> None:
                for _ in range(per_task):
                    await retry_conflicts(_bump, stores[k % 2], 7)

            await asyncio.gather(*(worker(k) for k in range(tasks)))
            async with b.read() as t:
                got = await t.get_inode(7)
            assert got is not None and got.size == per_task * tasks
            assert a.conflicts + b.conflicts > 0  # they did collide, and were re-run
            assert a.alone_runs + b.alone_runs > 0  # some ran alone after losing twice
        finally:
            await a.close()
            await b.close()

    asyncio.run(go())


def test_conflict_raises_txnconflict_and_stores_nothing(pg_url: str) -> None:
    async def go() -> None:
        a, b = _open(pg_url), _open(pg_url)
        try:
            async with a.write() as t:
                await t.put_inode(Attr(inode=9, type=FileType.FILE, mode=0o644, nlink=1))
            first_read = asyncio.Event()
            second_done = asyncio.Event()

            async def slow() -> None:
                async with a.write() as t:
                    x = await t.get_inode(9)
                    assert x is not None
                    await t.put_dentry(1, "slow", 9, FileType.FILE)
                    first_read.set()
                    await second_done.wait()  # b commits a change to the row read here
                    await t.put_inode(dataclasses.replace(x, size=100))

            async def fast() -> None:
                await first_read.wait()
                async with b.write() as t:
                    x = await t.get_inode(9)
                    assert x is not None
                    await t.put_inode(dataclasses.replace(x, size=5))
                second_done.set()

            results = await asyncio.gather(slow(), fast(), return_exceptions=True)
            assert isinstance(results[0], TxnConflict) and results[1] is None, results
            assert results[0].errno == 11  # EAGAIN on the wire if re-runs run out
            async with a.read() as t:
                got = await t.get_inode(9)
                assert got is not None and got.size == 5
                assert await t.lookup(1, "slow") is None  # nothing of the loser stored
        finally:
            await a.close()
            await b.close()

    asyncio.run(go())


def test_a_lone_writer_waits_for_writers_in_flight_and_then_cannot_lose(pg_url: str) -> None:
    async def go() -> None:
        a, b = _open(pg_url), _open(pg_url)
        try:
            async with a.write() as t:
                await t.put_inode(Attr(inode=11, type=FileType.FILE, mode=0o644, nlink=1))
            in_flight = asyncio.Event()
            release = asyncio.Event()
            order: list[str] = []

            async def ordinary() -> None:
                async with a.write() as t:
                    x = await t.get_inode(11)
                    assert x is not None
                    in_flight.set()
                    await release.wait()
                    await t.put_inode(dataclasses.replace(x, size=x.size + 1))
                order.append("ordinary")

            async def lone() -> None:
                await in_flight.wait()
                token = WRITE_ALONE.set(True)
                try:
                    async with b.write() as t:  # its gate waits for `ordinary` to commit
                        x = await t.get_inode(11)
                        assert x is not None
                        await t.put_inode(dataclasses.replace(x, size=x.size + 10))
                finally:
                    WRITE_ALONE.reset(token)
                order.append("lone")

            first = asyncio.ensure_future(ordinary())
            task = asyncio.ensure_future(lone())
            await in_flight.wait()
            await asyncio.sleep(0.2)  # the lone writer is waiting at the gate
            assert not task.done(), (task, order)
            release.set()
            await asyncio.wait_for(asyncio.gather(first, task), 30)
            assert order == ["ordinary", "lone"], order
            assert (b.alone_runs, b.conflicts, a.conflicts) == (1, 0, 0)
            async with a.read() as t:
                got = await t.get_inode(11)
                assert got is not None and got.size == 11  # both applied, in that order
        finally:
            await a.close()
            await b.close()

    asyncio.run(go())


def test_bad_schema_names_are_refused(pg_url: str) -> None:
    with pytest.raises(ValueError):
        MetaStore.open(pg_url.split("&schema=")[0] + "&schema=pg_x")


def test_store_recovers_after_the_database_restarts(pg_server: PgServer, pg_url: str) -> None:
    """The database goes away: operations fail with EIO (StoreUnavailable), nothing hangs;
    once it is back the same store serves again (broken connections are replaced)."""

    async def go() -> None:
        s = _open(pg_url)
        try:
            async with s.write() as t:
                await t.put_inode(Attr(inode=21, type=FileType.FILE, mode=0o644, nlink=1, size=3))
            async with s.read() as t:  # a reader connection is kept
                assert await t.get_inode(21) is not None
            await asyncio.to_thread(pg_server.stop)
            try:
                with pytest.raises(StoreUnavailable) as err:
                    async with s.write() as t:
                        await t.put_inode(Attr(inode=22, type=FileType.FILE, mode=0o644, nlink=1))
                assert err.value.errno == errno.EIO
                with pytest.raises(StoreUnavailable):
                    async with s.read() as t:
                        await t.get_inode(21)
            finally:
                await asyncio.to_thread(pg_server.start)
            deadline = time.monotonic() + 30
            while True:
                try:
                    async with s.write() as t:
                        await t.put_inode(Attr(inode=23, type=FileType.FILE, mode=0o644, nlink=1))
                    async with s.read() as t:
                        got = await t.get_inode(21)
                    break
                except StoreUnavailable:  # connections broken by the restart are dropped one by one
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.05)
            assert got is not None and got.size == 3
        finally:
            await s.close()

    asyncio.run(go())


def test_values_postgresql_cannot_hold_are_einval(pg_url: str) -> None:
    """PostgreSQL hunt (session 14): an integer past int64 or a NUL in a name answered INTERNAL
    (asyncpg's DataError) or EIO (at the commit of deferred writes), where SQLite answers
    BAD_REQUEST; a conflict at commit went back to the pool inside the failed transaction."""
    import os
    import random

    from loomfs.meta.ops.namespace import Namespace
    from loomfs.wire.types import ChainInfo, ChainTable, Layout, RoutingInfo

    class OneTable:
        def __init__(self) -> None:
            from loomfs.common.routing import Routing

            infos = [ChainInfo(chain_id=101, targets=[101], table_id=1)]
            tables = [ChainTable(table_id=1, replicas=1, chain_ids=[101])]
            self.routing = Routing(RoutingInfo(version=1, chains=infos, tables=tables))

        async def get(self) -> object:
            return self.routing

        async def refresh(self, min_version: int = 0) -> object:
            return self.routing

    async def go() -> None:
        store = _open(pg_url)
        ns = Namespace(store, routing=OneTable(), rng=random.Random(1),  # type: ignore[arg-type]
                       default_layout=Layout(table_id=1, inline_max_bytes=0))
        try:
            await ns.init()
            await ns.open("/f", os.O_CREAT | os.O_WRONLY)
            for call in (ns.setattr("", inode=1 << 63, mode=0o600),  # an argument past int64
                         ns.readdir("/", after="a\x00b"),  # a NUL PostgreSQL text cannot hold
                         ns.setattr("/f", mtime_ns=1 << 63)):  # a deferred write's, at commit
                with pytest.raises(OSError) as e:
                    await call
                assert e.value.errno == errno.EINVAL, e.value
            assert (await ns.stat("/f")).size == 0  # the store goes on
        finally:
            await store.close()

    asyncio.run(go())


def test_counters_past_int64_keep_statfs_and_folding_working(pg_url: str) -> None:
    """Review (session 14): thousands of 1 PiB sparse files summed bytes_used past int64:
    every STATFS failed (bigint out of range), and so did every fold of the counter deltas
    (the table grew without bound). The sum is read held at the bound, and a fold writes a
    total past int64 back as several delta rows, so removing the files brings it back exactly."""
    from loomfs.wire.types import FILE_BYTES_MAX

    async def go() -> None:
        store = _open(pg_url)
        try:
            async with store.write() as txn:
                await txn.add_counter("bytes_used", 12345)
            for _ in range(3):
                async with store.write() as txn:
                    for _ in range(3000):
                        await txn.add_counter("bytes_used", FILE_BYTES_MAX)
            async with store.read() as txn:
                assert (await txn.counters())["bytes_used"] == (1 << 63) - 1
            await store.fold_counters()
            async with store.read() as txn:
                assert (await txn.counters())["bytes_used"] == (1 << 63) - 1
            async with store.write() as txn:
                for _ in range(9000):
                    await txn.add_counter("bytes_used", -FILE_BYTES_MAX)
            await store.fold_counters()
            async with store.read() as txn:
                assert (await txn.counters())["bytes_used"] == 12345
        finally:
            await store.close()

    asyncio.run(go())
