"""The schema step that brought inline files' migration claims (SQLite 6 -> 7, PostgreSQL
5 -> 6): a store written before it is migrated, keeps its inline rows (unclaimed), and a
claim then round-trips."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from loomfs.meta.store.base import InlineData, MetaStore
from schema_steps import postgres_step, sqlite_step


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
    sqlite_step(tmp_path, 6, [
        "DROP TABLE inline_data",
        "CREATE TABLE inline_data (inode INTEGER PRIMARY KEY, data BLOB NOT NULL, crc INTEGER NOT NULL, "
        "version INTEGER NOT NULL, chunks_dirty INTEGER NOT NULL)",
        "INSERT INTO inline_data VALUES (7, x'616263', 5, 3, 1)",
    ], _claims_work)


def test_postgres_version_5_schema_gets_inline_claims(pg_url: str) -> None:
    postgres_step(pg_url, 5, [
        "ALTER TABLE {q}.inline_data DROP COLUMN claim_owner, DROP COLUMN claim_until_ns",
        "INSERT INTO {q}.inline_data VALUES (7, 'abc'::bytea, 5, 3, true)",
    ], _claims_work)
