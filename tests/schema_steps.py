"""Shared harness of the schema-step tests (``test_meta_store_*_schema.py``): a store made at
today's schema, taken back to an older version by the test's statements (drop what later
steps added, insert rows as the old code wrote them), opened again (the steps run), and
checked; then the version is today's."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import asyncpg

from loomfs.meta.store.base import MetaStore
from loomfs.meta.store.postgres import PostgresStore
from loomfs.meta.store.postgres_schema import SCHEMA_VERSION as PG_VERSION
from loomfs.meta.store.sqlite import SqliteStore
from loomfs.meta.store.sqlite_txn import SCHEMA_VERSION as SQLITE_VERSION

Check = Callable[[MetaStore], Awaitable[None]]
# a statement, or (statement, parameters); PostgreSQL statements name the schema as {q}
Statement = str | tuple[str, Sequence[Any]]


def sqlite_step(tmp_path: Path, version: int, statements: Sequence[Statement], check: Check) -> None:
    path = tmp_path / f"v{version}.db"
    asyncio.run(SqliteStore(str(path)).close())  # today's schema, then taken back
    c = sqlite3.connect(path, isolation_level=None)
    for st in statements:
        c.execute(*((st,) if isinstance(st, str) else st))
    c.execute(f"PRAGMA user_version = {version}")
    c.close()
    s = SqliteStore(str(path))

    async def go() -> None:
        try:
            assert s.schema_found == version
            await check(s)
        finally:
            await s.close()

    asyncio.run(go())
    c = sqlite3.connect(path)
    assert c.execute("PRAGMA user_version").fetchone()[0] == SQLITE_VERSION
    c.close()


def postgres_step(pg_url: str, version: int, statements: Sequence[Statement], check: Check) -> None:
    async def go() -> None:
        s = MetaStore.open(pg_url)
        assert isinstance(s, PostgresStore)
        async with s.read():
            pass  # the schema is created at today's version
        await s.close()
        q = f'"{s.schema}"'
        conn = await asyncpg.connect(s.dsn)
        try:
            for st in statements:
                sql, args = (st, ()) if isinstance(st, str) else st
                await conn.execute(sql.format(q=q), *args)
            await conn.execute(f"UPDATE {q}.loomfs_schema SET version = {version}")
            again = MetaStore.open(pg_url)
            try:
                await check(again)
            finally:
                await again.close()
            assert await conn.fetchval(f"SELECT version FROM {q}.loomfs_schema") == PG_VERSION
        finally:
            await conn.close()

    asyncio.run(go())
