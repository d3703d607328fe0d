"""The schema step that brought read holds and orphan inodes (SQLite 4 -> 5, PostgreSQL 3 -> 4):
a store written before it is migrated, keeps its data, and then holds and orphans work."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import asyncpg

from loomfs.meta.store.base import MetaStore
from loomfs.meta.store.postgres import PostgresStore
from loomfs.meta.store.postgres_schema import SCHEMA_VERSION as PG_VERSION
from loomfs.meta.store.sqlite import SqliteStore
from loomfs.meta.store.sqlite_txn import SCHEMA_VERSION as SQLITE_VERSION


async def _holds_and_orphans_work(s: MetaStore) -> None:
    async with s.read() as t:
        got = await t.get_inode(30)
        assert got is not None and got.size == 5
        assert await t.session_count(30) == 1  # a write session from before the step
    async with s.write() as t:
        await t.add_hold(30, 9, 100, 1)
        await t.orphan_put(30, 2)
    async with s.read() as t:
        assert await t.holders(30) == 2
        assert await t.orphan_since(30) == 2
        assert await t.orphans_unheld(10) == []


def test_sqlite_version_4_store_gets_holds_and_orphans(tmp_path: Path) -> None:
    path = tmp_path / "v4.db"
    asyncio.run(SqliteStore(str(path)).close())  # today's schema, then taken back to version 4
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("DROP TABLE holds")
    c.execute("DROP TABLE orphans")
    c.execute("DROP TABLE IF EXISTS locks")  # and the lock tables (later still)
    c.execute("DROP TABLE IF EXISTS lock_clients")
    c.execute("INSERT INTO inodes VALUES (30, 1, 420, 1, 0, 0, 5, 1, 1, 1, NULL, '', 0, 0)")
    c.execute("INSERT INTO sessions VALUES (30, 7, 100, 1)")
    c.execute("PRAGMA user_version = 4")
    c.close()
    s = SqliteStore(str(path))

    async def check() -> None:
        try:
            assert s.schema_found == 4
            await _holds_and_orphans_work(s)
        finally:
            await s.close()

    asyncio.run(check())
    c = sqlite3.connect(path)
    assert c.execute("PRAGMA user_version").fetchone()[0] == SQLITE_VERSION
    c.close()


def test_postgres_version_3_schema_gets_holds_and_orphans(pg_url: str) -> None:
    async def go() -> None:
        s = MetaStore.open(pg_url)
        assert isinstance(s, PostgresStore)
        async with s.read():
            pass  # the schema is created at today's version
        await s.close()
        q = f'"{s.schema}"'
        conn = await asyncpg.connect(s.dsn)
        try:
            await conn.execute(f"DROP TABLE {q}.holds")
            await conn.execute(f"DROP TABLE {q}.orphans")
            await conn.execute(f"DROP TABLE {q}.locks")  # and the lock tables (later still)
            await conn.execute(f"DROP TABLE {q}.lock_clients")
            await conn.execute(f"UPDATE {q}.loomfs_schema SET version = 3")
            await conn.execute(f"INSERT INTO {q}.inodes VALUES (30, 1, 420, 1, 0, 0, 5, 1, 1, 1, NULL, '', false, 0)")
            await conn.execute(f"INSERT INTO {q}.sessions VALUES (30, 7, 100, 1)")
            again = MetaStore.open(pg_url)
            try:
                await _holds_and_orphans_work(again)
            finally:
                await again.close()
            assert await conn.fetchval(f"SELECT version FROM {q}.loomfs_schema") == PG_VERSION
        finally:
            await conn.close()

    asyncio.run(go())
