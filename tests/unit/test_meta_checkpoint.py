"""SQLite checkpoints run on the store's checkpoint thread, not inside a writer's COMMIT on the
loop: the WAL stays small while writes go on, and everything written is there after a reopen."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from loomfs.meta.store import sqlite as sq
from loomfs.meta.store.base import InlineData
from loomfs.meta.store.sqlite import SqliteStore

WRITES = 3072
BLOB = os.urandom(6000)  # two pages of inline data per write, and the counters' page


async def _write_many(store: SqliteStore) -> None:
    """Rounds of writes; after each, the checkpoint thread is given time to run (it competes
    for the CPU with this loop, which never pauses otherwise)."""
    for r in range(WRITES // sq.CHECKPOINT_EVERY_WRITES):
        before = store.checkpoints
        for i in range(sq.CHECKPOINT_EVERY_WRITES):
            async with store.write() as txn:
                await txn.put_inline(1000 + r * sq.CHECKPOINT_EVERY_WRITES + i, InlineData(BLOB, 1))
                await txn.add_counter("n", 1)
        deadline = time.monotonic() + 10
        while store.checkpoints == before and time.monotonic() < deadline:
            await asyncio.sleep(0.005)


def test_checkpoints_run_on_the_thread_and_keep_the_wal_small(tmp_path: Path) -> None:
    path = str(tmp_path / "m.db")

    async def go() -> tuple[int, int]:
        store = SqliteStore(path)
        try:
            await _write_many(store)
            return store.checkpoints, os.path.getsize(path + "-wal")
        finally:
            await store.close()

    checkpoints, wal_bytes = asyncio.run(go())
    assert checkpoints >= WRITES // sq.CHECKPOINT_EVERY_WRITES
    # ~9k pages written in all: without the thread the WAL grows to the backstop (8000 pages,
    # ~32 MiB) before the first checkpoint; with it, it starts over after each round (~1.5 MiB)
    assert wal_bytes < 8 << 20, wal_bytes

    async def reread() -> tuple[int, int]:
        store = SqliteStore(path)
        try:
            async with store.read() as txn:
                rows = [await txn.get_inline(1000 + i) for i in (0, WRITES // 2, WRITES - 1)]
                assert all(r is not None and r.data == BLOB for r in rows)
                return (await txn.counters())["n"], store.checkpoints
        finally:
            await store.close()

    n, _ = asyncio.run(reread())
    assert n == WRITES


def test_backstop_is_sqlites_own_checkpoint(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "m.db"))
    try:
        assert store._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == sq.AUTOCHECKPOINT_PAGES  # noqa: SLF001
    finally:
        asyncio.run(store.close())
