"""Schema versions and migrations of both engines; SQLite writers never block the event loop
while another process holds the file's write lock (issue 12)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import asyncpg
import pytest

from loomfs.meta.store.base import MetaStore
from loomfs.meta.store.postgres import PostgresStore
from loomfs.meta.store.postgres_schema import SCHEMA_VERSION as PG_VERSION
from loomfs.meta.store.postgres_schema import SchemaTooNew as PgSchemaTooNew
from loomfs.meta.store.sqlite import SqliteStore
from loomfs.meta.store.sqlite_txn import SCHEMA_VERSION as SQLITE_VERSION
from loomfs.meta.store.sqlite_txn import SchemaTooNew
from loomfs.wire.types import Attr, FileType

OLD_INODES = """CREATE TABLE inodes (
    id INTEGER PRIMARY KEY, type INTEGER NOT NULL, mode INTEGER NOT NULL, nlink INTEGER NOT NULL,
    uid INTEGER NOT NULL, gid INTEGER NOT NULL, size INTEGER NOT NULL, atime_ns INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL, ctime_ns INTEGER NOT NULL, layout BLOB, symlink TEXT NOT NULL)"""


def test_sqlite_store_from_before_versions_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    c = sqlite3.connect(path)
    c.execute(OLD_INODES)
    c.execute("INSERT INTO inodes VALUES (5, 1, 420, 1, 0, 0, 3, 1, 1, 1, NULL, '')")
    c.commit()
    c.close()
    s = SqliteStore(str(path))
    try:
        assert s.schema_found == 0

        async def check() -> None:
            async with s.read() as t:
                got = await t.get_inode(5)
                assert got is not None and got.size == 3 and not got.inline
            async with s.write() as t:  # the tables version 1 added are there
                await t.add_session(5, 1, 9, 0)
                await t.put_dentry(1, "f", 5, FileType.FILE)

        asyncio.run(check())
    finally:
        asyncio.run(s.close())
    c = sqlite3.connect(path)
    assert c.execute("PRAGMA user_version").fetchone()[0] == SQLITE_VERSION
    c.close()
    again = SqliteStore(str(path))
    assert again.schema_found == SQLITE_VERSION
    asyncio.run(again.close())


def test_sqlite_store_from_a_newer_loomfs_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    c = sqlite3.connect(path)
    c.execute(f"PRAGMA user_version = {SQLITE_VERSION + 1}")
    c.close()
    with pytest.raises(SchemaTooNew):
        SqliteStore(str(path))


def test_postgres_schema_versions(pg_url: str) -> None:
    async def go() -> None:
        s = MetaStore.open(pg_url)
        assert isinstance(s, PostgresStore)
        async with s.write() as t:
            await t.put_inode(Attr(inode=9, type=FileType.FILE, mode=0o644, nlink=1))
        conn = await asyncpg.connect(s.dsn)
        try:
            assert await conn.fetchval(f'SELECT version FROM "{s.schema}".loomfs_schema') == PG_VERSION
            await s.close()
            again = MetaStore.open(pg_url)  # at the version already: nothing applied, data kept
            async with again.read() as t:
                assert await t.get_inode(9) is not None
            await again.close()
            await conn.execute(f'UPDATE "{s.schema}".loomfs_schema SET version = {PG_VERSION + 1}')
            newer = MetaStore.open(pg_url)
            with pytest.raises(PgSchemaTooNew):
                async with newer.read():
                    pass
            await newer.close()
        finally:
            await conn.close()

    asyncio.run(go())


def test_sqlite_write_waits_for_another_writer_without_blocking_the_loop(tmp_path: Path) -> None:
    """Another process's write transaction holds the file: the store's writer waits for it by
    polling, and the loop keeps running other tasks meanwhile."""
    path = tmp_path / "shared.db"
    store = SqliteStore(str(path))
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("PRAGMA journal_mode = WAL")
    hold_s = 0.3

    async def go() -> None:
        other.execute("BEGIN IMMEDIATE")
        other.execute("INSERT INTO counters (name, value) VALUES ('other', 1)")
        loop = asyncio.get_running_loop()
        loop.call_later(hold_s, other.execute, "COMMIT")
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        t = loop.create_task(ticker())
        started = time.monotonic()
        async with store.write() as txn:
            await txn.add_counter("mine", 1)
        waited_s = time.monotonic() - started
        stop.set()
        await t
        assert waited_s >= hold_s * 0.9, waited_s  # it did wait for the other writer
        assert store.busy_waits > 0
        assert ticks >= 10, ticks  # the loop ran on while it waited (about 30 ticks)
        async with store.read() as txn:
            assert await txn.counters() == {"other": 1, "mine": 1}

    try:
        asyncio.run(go())
    finally:
        other.close()
        asyncio.run(store.close())


def test_sqlite_busy_writer_gives_up_after_its_timeout(tmp_path: Path) -> None:
    path = tmp_path / "stuck.db"
    store = SqliteStore(str(path), busy_timeout_s=0.2)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")

    async def go() -> None:
        with pytest.raises(sqlite3.OperationalError):
            async with store.write() as txn:
                await txn.add_counter("never", 1)
        other.execute("ROLLBACK")
        async with store.write() as txn:  # the store is fine afterwards
            await txn.add_counter("later", 1)

    try:
        asyncio.run(go())
    finally:
        other.close()
        asyncio.run(store.close())
