"""The schema step that brought the lock tables (SQLite 5 -> 6, PostgreSQL 4 -> 5): a store
written before it is migrated, keeps its data, and then locks work."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import asyncpg

from loomfs.meta.locks import POSIX, WRITE, LockTable
from loomfs.meta.store.base import MetaStore
from loomfs.meta.store.postgres import PostgresStore
from loomfs.meta.store.postgres_schema import SCHEMA_VERSION as PG_VERSION
from loomfs.meta.store.sqlite import SqliteStore
from loomfs.meta.store.sqlite_txn import SCHEMA_VERSION as SQLITE_VERSION


async def _locks_work(s: MetaStore) -> None:
    async with s.read() as t:
        got = await t.get_inode(30)
        assert got is not None and got.size == 5
        assert await t.holders(30) == 2  # a write session and a read hold from before the step
    table = LockTable(s)
    assert await table.setlk(30, 1, 2, POSIX, WRITE, 0, 9) is None
    assert await table.setlk(30, 3, 4, POSIX, WRITE, 5, 5) is not None


def test_sqlite_version_5_store_gets_locks(tmp_path: Path) -> None:
    path = tmp_path / "v5.db"
    asyncio.run(SqliteStore(str(path)).close())  # today's schema, then taken back to version 5
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("DROP TABLE locks")
    c.execute("DROP TABLE lock_clients")
    c.execute("INSERT INTO inodes VALUES (30, 1, 420, 1, 0, 0, 5, 1, 1, 1, NULL, '', 0, 0)")
    c.execute("INSERT INTO sessions VALUES (30, 7, 100, 1)")
    c.execute("INSERT INTO holds VALUES (30, 8, 100, 1)")
    c.execute("PRAGMA user_version = 5")
    c.close()
    s = SqliteStore(str(path))

    async def check() -> None:
        try:
            assert s.schema_found == 5
            await _locks_work(s)
        finally:
            await s.close()

    asyncio.run(check())
    c = sqlite3.connect(path)
    assert c.execute("PRAGMA user_version").fetchone()[0] == SQLITE_VERSION
    c.close()


def test_postgres_version_4_schema_gets_locks(pg_url: str) -> None:
    async def go() -> None:
        s = MetaStore.open(pg_url)
        assert isinstance(s, PostgresStore)
        async with s.read():
            pass  # the schema is created at today's version
        await s.close()
        q = f'"{s.schema}"'
        conn = await asyncpg.connect(s.dsn)
        try:
            await conn.execute(f"DROP TABLE {q}.locks")
            await conn.execute(f"DROP TABLE {q}.lock_clients")
            await conn.execute(f"UPDATE {q}.loomfs_schema SET version = 4")
            await conn.execute(f"INSERT INTO {q}.inodes VALUES (30, 1, 420, 1, 0, 0, 5, 1, 1, 1, NULL, '', false, 0)")
            await conn.execute(f"INSERT INTO {q}.sessions VALUES (30, 7, 100, 1)")
            await conn.execute(f"INSERT INTO {q}.holds VALUES (30, 8, 100, 1)")
            again = MetaStore.open(pg_url)
            try:
                await _locks_work(again)
            finally:
                await again.close()
            assert await conn.fetchval(f"SELECT version FROM {q}.loomfs_schema") == PG_VERSION
        finally:
            await conn.close()

    asyncio.run(go())
