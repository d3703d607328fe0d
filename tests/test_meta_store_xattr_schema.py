"""The schema step that brought extended attributes and device numbers (SQLite 3 -> 4,
PostgreSQL 2 -> 3): stores written before it are migrated, device numbers kept as decimal
text in ``symlink`` move to the ``rdev`` column."""

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
from loomfs.wire.types import FileType

CHR = int(FileType.CHAR_DEVICE)
BLK = int(FileType.BLOCK_DEVICE)
LNK = int(FileType.SYMLINK)


def _rows(rdev_text: str) -> list[tuple[int, int, str]]:
    # a char device, a block device, a symlink whose target is digits (stays a target)
    return [(20, CHR, rdev_text), (21, BLK, "2049"), (22, LNK, "1234")]


def test_sqlite_version_3_store_gets_xattrs_and_rdev(tmp_path: Path) -> None:
    path = tmp_path / "v3.db"
    asyncio.run(_create(path))  # today's schema, then taken back to version 3
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("DROP TABLE xattrs")
    c.execute("DROP TABLE holds")  # and what later versions added
    c.execute("DROP TABLE orphans")
    c.execute("DROP TABLE IF EXISTS locks")  # and the lock tables (later still)
    c.execute("DROP TABLE IF EXISTS lock_clients")
    c.execute("ALTER TABLE inodes DROP COLUMN rdev")
    for ino, typ, text in _rows("259"):
        c.execute("INSERT INTO inodes VALUES (?, ?, 384, 1, 0, 0, 0, 1, 1, 1, NULL, ?, 0)", (ino, typ, text))
    c.execute("PRAGMA user_version = 3")
    c.close()
    s = SqliteStore(str(path))

    async def check() -> None:
        try:
            assert s.schema_found == 3
            async with s.read() as t:
                got = await t.get_inodes([20, 21, 22])
            assert (got[20].rdev, got[20].symlink_target) == (259, "")
            assert (got[21].rdev, got[21].symlink_target) == (2049, "")
            assert (got[22].rdev, got[22].symlink_target) == (0, "1234")
            async with s.write() as t:
                await t.put_xattr(20, b"user.k", b"v")
            async with s.read() as t:
                assert await t.list_xattrs(20) == [(b"user.k", 1)]
        finally:
            await s.close()

    asyncio.run(check())
    c = sqlite3.connect(path)
    assert c.execute("PRAGMA user_version").fetchone()[0] == SQLITE_VERSION
    c.close()


async def _create(path: Path) -> None:
    s = SqliteStore(str(path))
    await s.close()


def test_postgres_version_2_schema_gets_xattrs_and_rdev(pg_url: str) -> None:
    async def go() -> None:
        s = MetaStore.open(pg_url)
        assert isinstance(s, PostgresStore)
        async with s.read():
            pass  # the schema is created at today's version
        await s.close()
        q = f'"{s.schema}"'
        conn = await asyncpg.connect(s.dsn)
        try:
            await conn.execute(f"DROP TABLE {q}.xattrs")
            await conn.execute(f"DROP TABLE {q}.holds")  # and what later versions added
            await conn.execute(f"DROP TABLE {q}.orphans")
            await conn.execute(f"DROP TABLE {q}.locks")  # and the lock tables (later still)
            await conn.execute(f"DROP TABLE {q}.lock_clients")
            await conn.execute(f"ALTER TABLE {q}.inodes DROP COLUMN rdev")
            await conn.execute(f"UPDATE {q}.loomfs_schema SET version = 2")
            for ino, typ, text in _rows("65535"):
                await conn.execute(
                    f"INSERT INTO {q}.inodes VALUES ($1, $2, 384, 1, 0, 0, 0, 1, 1, 1, NULL, $3, false)",
                    ino, typ, text)
            again = MetaStore.open(pg_url)
            async with again.read() as t:
                got = await t.get_inodes([20, 21, 22])
            assert (got[20].rdev, got[20].symlink_target) == (65535, "")
            assert (got[21].rdev, got[21].symlink_target) == (2049, "")
            assert (got[22].rdev, got[22].symlink_target) == (0, "1234")
            async with again.write() as t:
                await t.put_xattr(21, b"user.k", b"v")
            async with again.read() as t:
                assert await t.get_xattr(21, b"user.k") == b"v"
            await again.close()
            assert await conn.fetchval(f"SELECT version FROM {q}.loomfs_schema") == PG_VERSION
        finally:
            await conn.close()

    asyncio.run(go())
