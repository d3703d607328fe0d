"""The schema step that brought inline files' migration claims (SQLite 6 -> 7, PostgreSQL
5 -> 6): a store written before it is migrated, keeps its inline rows (unclaimed), and a
claim then round-trips."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from pathlib import Path

import asyncpg

from loomfs.meta.store.base import InlineData, MetaStore
from loomfs.meta.store.postgres import PostgresStore
from loomfs.meta.store.postgres_schema import SCHEMA_VERSION as PG_VERSION
from loomfs.meta.store.sqlite import SqliteStore
from loomfs.meta.store.sqlite_txn import SCHEMA_VERSION as SQLITE_VERSION


async def _claims_work(s: MetaStore) -> None:
    async with s.read() as t:
        got = await t.get_inline(7)
    assert got == InlineData(b"abc", 5, 3, True, 0, 0)
    async with s.write() as t:
        await t.put_inline(7, dataclasses.replace(got, claim_owner=11, claim_until_ns=1 << 62))
    async with s.read() as t:
        again = await t.get_inline(7)
    assert again is not None and again.claim_owner == 11 and again.claim_until_ns == 1 << 62


def test_sqlite_version_6_store_gets_inline_claims(tmp_path: Path) -> None:
    path = tmp_path / "v6.db"
    asyncio.run(SqliteStore(str(path)).close())  # today's schema, then taken back to version 6
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("DROP TABLE inline_data")
    c.execute("CREATE TABLE inline_data (inode INTEGER PRIMARY KEY, data BLOB NOT NULL, crc INTEGER NOT NULL, "
              "version INTEGER NOT NULL, chunks_dirty INTEGER NOT NULL)")
    c.execute("INSERT INTO inline_data VALUES (7, x'616263', 5, 3, 1)")
    c.execute("PRAGMA user_version = 6")
    c.close()
    s = SqliteStore(str(path))

    async def check() -> None:
        try:
            assert s.schema_found == 6
            await _claims_work(s)
        finally:
            await s.close()

    asyncio.run(check())
    c = sqlite3.connect(path)
    assert c.execute("PRAGMA user_version").fetchone()[0] == SQLITE_VERSION
    c.close()


def test_postgres_version_5_schema_gets_inline_claims(pg_url: str) -> None:
    async def go() -> None:
        s = MetaStore.open(pg_url)
        assert isinstance(s, PostgresStore)
        async with s.read():
            pass  # the schema is created at today's version
        await s.close()
        q = f'"{s.schema}"'
        conn = await asyncpg.connect(s.dsn)
        try:
            await conn.execute(f"ALTER TABLE {q}.inline_data DROP COLUMN claim_owner, DROP COLUMN claim_until_ns")
            await conn.execute(f"UPDATE {q}.loomfs_schema SET version = 5")
            await conn.execute(f"INSERT INTO {q}.inline_data VALUES (7, 'abc'::bytea, 5, 3, true)")
            again = MetaStore.open(pg_url)
            try:
                await _claims_work(again)
            finally:
                await again.close()
            assert await conn.fetchval(f"SELECT version FROM {q}.loomfs_schema") == PG_VERSION
        finally:
            await conn.close()

    asyncio.run(go())
