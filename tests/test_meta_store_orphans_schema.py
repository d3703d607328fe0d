"""The schema step that brought read holds and orphan inodes (SQLite 4 -> 5, PostgreSQL 3 -> 4):
a store written before it is migrated, keeps its data, and then holds and orphans work."""

from __future__ import annotations

from pathlib import Path

from loomfs.meta.store.base import MetaStore
from schema_steps import postgres_step, sqlite_step


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
    sqlite_step(tmp_path, 4, [
        "DROP TABLE holds",
        "DROP TABLE orphans",
        "DROP TABLE IF EXISTS locks",  # and the lock tables (later still)
        "DROP TABLE IF EXISTS lock_clients",
        "INSERT INTO inodes VALUES (30, 1, 420, 1, 0, 0, 5, 1, 1, 1, NULL, '', 0, 0)",
        "INSERT INTO sessions VALUES (30, 7, 100, 1)",
    ], _holds_and_orphans_work)


def test_postgres_version_3_schema_gets_holds_and_orphans(pg_url: str) -> None:
    postgres_step(pg_url, 3, [
        "DROP TABLE {q}.holds",
        "DROP TABLE {q}.orphans",
        "DROP TABLE {q}.locks",  # and the lock tables (later still)
        "DROP TABLE {q}.lock_clients",
        "INSERT INTO {q}.inodes VALUES (30, 1, 420, 1, 0, 0, 5, 1, 1, 1, NULL, '', false, 0)",
        "INSERT INTO {q}.sessions VALUES (30, 7, 100, 1)",
    ], _holds_and_orphans_work)
