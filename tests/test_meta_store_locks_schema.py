"""The schema step that brought the lock tables (SQLite 5 -> 6, PostgreSQL 4 -> 5): a store
written before it is migrated, keeps its data, and then locks work."""

from __future__ import annotations

from pathlib import Path

from loomfs.meta.locks import POSIX, WRITE, LockTable
from loomfs.meta.store.base import MetaStore
from schema_steps import postgres_step, sqlite_step


async def _locks_work(s: MetaStore) -> None:
    async with s.read() as t:
        got = await t.get_inode(30)
        assert got is not None and got.size == 5
        assert await t.holders(30) == 2  # a write session and a read hold from before the step
    table = LockTable(s)
    assert await table.setlk(30, 1, 2, POSIX, WRITE, 0, 9) is None
    assert await table.setlk(30, 3, 4, POSIX, WRITE, 5, 5) is not None


def test_sqlite_version_5_store_gets_locks(tmp_path: Path) -> None:
    sqlite_step(tmp_path, 5, [
        "DROP TABLE locks",
        "DROP TABLE lock_clients",
        "INSERT INTO inodes VALUES (30, 1, 420, 1, 0, 0, 5, 1, 1, 1, NULL, '', 0, 0)",
        "INSERT INTO sessions VALUES (30, 7, 100, 1)",
        "INSERT INTO holds VALUES (30, 8, 100, 1)",
    ], _locks_work)


def test_postgres_version_4_schema_gets_locks(pg_url: str) -> None:
    postgres_step(pg_url, 4, [
        "DROP TABLE {q}.locks",
        "DROP TABLE {q}.lock_clients",
        "INSERT INTO {q}.inodes VALUES (30, 1, 420, 1, 0, 0, 5, 1, 1, 1, NULL, '', false, 0)",
        "INSERT INTO {q}.sessions VALUES (30, 7, 100, 1)",
        "INSERT INTO {q}.holds VALUES (30, 8, 100, 1)",
    ], _locks_work)
