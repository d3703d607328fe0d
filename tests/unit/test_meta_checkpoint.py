"""SQLite checkpoints run on the store's checkpoint thread, not inside a writer's COMMIT on the
loop: the WAL stays small while writes go on, and everything written is there after a reopen."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from pathlib import Path

import pytest

from loomfs.meta.store import sqlite as sq
from loomfs.meta.store.base import CommitFailed, InlineData
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
        while store.checkpoints == before and time.monotonic() < deadline:  # noqa: ASYNC110 (a thread's counter)
            await asyncio.sleep(0.005)


def test_checkpoints_run_on_the_thread_and_keep_the_wal_small(tmp_path: Path) -> None:
    path = str(tmp_path / "m.db")

    async def go() -> tuple[int, int]:
        store = SqliteStore(path)
        try:
            await _write_many(store)
            return store.checkpoints, os.path.getsize(path + "-wal")  # noqa: ASYNC240
        finally:
            await store.close()

    checkpoints, wal_bytes = asyncio.run(go())
    assert checkpoints >= WRITES // sq.CHECKPOINT_EVERY_WRITES
    # ~9k pages written in all (3 a write): without the thread the WAL holds them all (~38 MiB;
    # the backstop comes at 8 rounds, after the last write); with it, it starts over after each
    # round (~6.3 MiB for 512 writes), or after two when a RESTART found a reader on old frames
    assert wal_bytes < 2 * sq.CHECKPOINT_EVERY_WRITES * 4 * (4096 + 24), wal_bytes
    assert wal_bytes < WRITES * 3 * (4096 + 24) // 2, wal_bytes  # and well below "all of them"

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


def test_the_loop_checkpoints_when_the_thread_falls_behind(tmp_path: Path) -> None:
    """SQLite's own automatic checkpoint is off (it ignores its result); without the thread
    the loop checkpoints itself every ``BACKSTOP_WRITES`` writers."""
    path = str(tmp_path / "m.db")

    async def go() -> tuple[int, int]:
        store = SqliteStore(path)
        assert store._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0  # noqa: SLF001
        store._checkpointer = None  # noqa: SLF001  (as if its thread could not keep up at all)
        try:
            for i in range(3 * sq.BACKSTOP_WRITES):
                async with store.write() as txn:
                    await txn.put_inline(1000 + i, InlineData(BLOB, 1))
            return store.checkpoints, os.path.getsize(path + "-wal")  # noqa: ASYNC240
        finally:
            await store.close()

    checkpoints, wal_bytes = asyncio.run(go())
    assert checkpoints == 3
    assert wal_bytes < sq.BACKSTOP_WRITES * 4 * 4096  # about 3 pages a write, never more than one backstop's worth


@pytest.mark.parametrize("code", [sqlite3.SQLITE_IOERR_FSYNC, sqlite3.SQLITE_IOERR_WRITE, sqlite3.SQLITE_BUSY,
                                  sqlite3.SQLITE_FULL])
def test_a_checkpoint_io_error_fails_the_store(tmp_path: Path, code: int) -> None:
    """A checkpoint the disk refused (a failed write or fsync) fails the store for good: no
    later write is acknowledged and ``on_fatal`` is called once; SQLITE_BUSY and a full disk
    (the WAL still holds every frame) are tried again."""
    async def go() -> None:
        store = SqliteStore(str(tmp_path / "m.db"))
        fatal: list[BaseException] = []
        store.on_fatal = fatal.append
        checkpointer = store._checkpointer  # noqa: SLF001
        assert checkpointer is not None

        tries: list[int] = []

        def refused(conn: sqlite3.Connection) -> None:  # the disk's answer, injected
            tries.append(code)
            exc = sqlite3.OperationalError("disk I/O error")
            exc.sqlite_errorcode = code  # type: ignore[attr-defined]
            raise exc

        checkpointer._checkpoint = refused  # type: ignore[method-assign]  # noqa: SLF001
        try:
            for i in range(sq.CHECKPOINT_EVERY_WRITES):
                async with store.write() as txn:
                    await txn.put_inline(1000 + i, InlineData(b"x", 1))
            deadline = time.monotonic() + 10
            retried = code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_FULL)
            while not (tries if retried else fatal) and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.005)  # the checkpoint thread's turn
            assert tries
            if retried:
                await asyncio.sleep(0)  # a failure would be reported through the loop by now
                assert store.failed is None and not fatal
                async with store.write() as txn:  # still writable
                    await txn.put_inline(1, InlineData(b"y", 1))
                return
            assert len(fatal) == 1 and store.failed is fatal[0]
            with pytest.raises(CommitFailed):
                async with store.write() as txn:
                    await txn.put_inline(1, InlineData(b"y", 1))
            async with store.read() as txn:  # what was acknowledged is still readable
                assert (await txn.get_inline(1000)) is not None
        finally:
            await store.close()

    asyncio.run(go())
