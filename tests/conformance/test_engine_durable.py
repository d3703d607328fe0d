"""Durable commits of the file engine (issue 10): a durable write's data is flushed from its
staging on, commits that wait together share one directory fsync and one WAL fsync (group
commit), and none returns before its own data file, its directory entry and a WAL fsync that
follows its row are on disk."""

from __future__ import annotations

import asyncio
import errno
import mmap
import os
import threading
import time
from pathlib import Path

import pytest

from loomfs.storage.engine.file import FileEngine
from loomfs.storage.engine.types import ChunkKey

DEADLINE_S = 20.0


def _aligned(data: bytes) -> memoryview:
    m = mmap.mmap(-1, len(data))
    m[:] = data
    return memoryview(m)


class FsyncLog:
    """Records every fsync (what the fd names, in order); may hold directory fsyncs until
    ``release`` is set, or fail them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.events: list[str] = []
        self.lock = threading.Lock()
        self.hold_dirs = threading.Event()
        self.hold_dirs.set()
        self.fail_dirs = False
        real = os.fsync

        def spy(fd: int) -> None:
            path = os.readlink(f"/proc/self/fd/{fd}")
            if os.path.isdir(path):
                assert self.hold_dirs.wait(DEADLINE_S), "directory fsync held past the deadline"
                if self.fail_dirs:
                    raise OSError(errno.EIO, "injected: directory fsync failed")
            real(fd)
            with self.lock:
                self.events.append(path)

        monkeypatch.setattr(os, "fsync", spy)

    def index_of(self, pred) -> int:  # type: ignore[no-untyped-def]
        with self.lock:
            return next(i for i, p in enumerate(self.events) if pred(p))


async def _until(cond, what: str) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + DEADLINE_S
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def test_waiting_durable_commits_share_one_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = FsyncLog(monkeypatch)
    e = FileEngine(tmp_path / "t", fsync_on_commit=False)
    keys = [ChunkKey(7, i) for i in range(12)]

    async def go() -> None:
        for i, k in enumerate(keys):
            await e.astage_write(k, 1, 0, _aligned(bytes([i]) * (1 << 20)), sync=True)
        log.hold_dirs.clear()  # the first batch waits in its directory fsync ...
        first = asyncio.ensure_future(e.commit(keys[0], 1, durable=True))
        await _until(lambda: e._durable.batches_total == 0 and e._durable._flusher is not None
                     and not e._durable._waiting, "the first batch to start")
        rest = [asyncio.ensure_future(e.commit(k, 1, durable=True)) for k in keys[1:]]
        await _until(lambda: len(e._durable._waiting) == len(keys) - 1, "the other commits to wait")
        assert not first.done() and not any(t.done() for t in rest)  # nothing acked before its WAL fsync
        log.hold_dirs.set()  # ... while the others gather into the next one
        await asyncio.gather(first, *rest)

    try:
        asyncio.run(go())
        assert e._durable.batches_total == 2 and e.durable_commits_total == len(keys)
        wal = [i for i, p in enumerate(log.events) if p.endswith("index.sqlite-wal")]
        assert len(wal) == 2  # one WAL fsync per batch, not per commit
        for k in keys:  # every data file flushed before the WAL fsync of its batch
            name = f"{k.inode:x}.{k.index:x}.1"
            assert log.index_of(lambda p, n=name: p.endswith(n)) < wal[-1]
            st = e.get(k)
            assert st is not None and st.commit_ver == 1 and not st.pending_ver
    finally:
        e.close()
    again = FileEngine(tmp_path / "t")  # what the index says after a restart
    try:
        assert [(s.key, s.commit_ver, s.length) for s in again.list_chunks(7)] == [(k, 1, 1 << 20) for k in keys]
    finally:
        again.close()


def test_a_durable_stage_flushes_before_its_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The data file's flush starts at staging (the replica forwards meanwhile)."""
    log = FsyncLog(monkeypatch)
    e = FileEngine(tmp_path / "t", fsync_on_commit=False)
    key = ChunkKey(9, 3)

    async def go() -> None:
        await e.astage_write(key, 1, 0, _aligned(os.urandom(1 << 20)), sync=True)
        await _until(lambda: any(p.endswith("9.3.1") for p in log.events), "the staged file's flush")
        assert not any(p.endswith("index.sqlite-wal") for p in log.events)
        st = e.get(key)
        assert st is not None and st.pending_ver == 1 and st.commit_ver == 0  # flushed, not committed
        await e.commit(key, 1, durable=True)

    try:
        asyncio.run(go())
        assert sum(p.endswith("9.3.1") for p in log.events) == 1  # not flushed a second time
        assert log.index_of(lambda p: p.endswith("index.sqlite-wal")) > log.index_of(lambda p: p.endswith("9.3.1"))
    finally:
        e.close()


def test_a_failed_durable_batch_fails_the_target_until_verified(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed fsync (here: the batch's directory fsync) leaves the disk state unknown
    (fsyncgate): the update is not acked, the engine refuses every commit from then on (no
    retry of the fsync), and only a new engine that verified the chunks against their rows
    (the FSYNC_FAILED marker) commits again."""
    log = FsyncLog(monkeypatch)
    e = FileEngine(tmp_path / "t", fsync_on_commit=False)
    failed: list[str] = []
    e.on_failed = failed.append
    key = ChunkKey(4, 0)

    async def go() -> None:
        await e.astage_write(key, 1, 0, _aligned(b"a" * (1 << 20)), sync=True)
        await e.commit(key, 1, durable=True)
        await e.astage_write(key, 2, 0, _aligned(b"b" * (1 << 20)), sync=True)
        log.fail_dirs = True
        with pytest.raises(OSError) as err:
            await e.commit(key, 2, durable=True)
        assert err.value.errno == errno.EIO
        st = e.get(key)
        assert st is not None and (st.commit_ver, st.pending_ver) == (1, 2)  # not acked, still pending
        assert e.failed and failed == [e.failed]
        log.fail_dirs = False
        with pytest.raises(OSError) as err:  # the disk "works" again: no matter, the target is out
            await e.commit(key, 2, durable=True)
        assert err.value.errno == errno.EIO and "out of service" in str(err.value)

    try:
        asyncio.run(go())
    finally:
        e.close()
    assert (tmp_path / "t" / "FSYNC_FAILED").exists()
    e2 = FileEngine(tmp_path / "t", fsync_on_commit=False)  # the next process verifies, then serves
    try:
        assert e2.wait_verified(DEADLINE_S)
        assert not e2.failed and not (tmp_path / "t" / "FSYNC_FAILED").exists()
        st = e2.get(key)
        assert st is not None and st.commit_ver == 1
        buf = bytearray(1 << 20)
        assert e2.read(key, 0, memoryview(buf)) == 1 << 20 and bytes(buf) == b"a" * (1 << 20)

        async def again() -> None:
            await e2.astage_write(key, 2, 0, _aligned(b"c" * (1 << 20)), sync=True)
            await e2.commit(key, 2, durable=True)

        asyncio.run(again())
        assert e2.get(key).commit_ver == 2  # type: ignore[union-attr]
    finally:
        e2.close()


def test_index_checkpoints_are_explicit_and_a_failed_one_fails_the_target(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reviewer's R1: SQLite's automatic WAL checkpoint ignores its own failed fsync, so the index
    turns it off and checkpoints itself every CHECKPOINT_STATEMENTS rows; a failed checkpoint
    fails the target (even on a plain, non-durable commit). The WAL is fsynced through one
    long-lived fd (a fresh one would not see a writeback error SQLite's fd saw first)."""
    from loomfs.storage.engine import file_index
    from loomfs.storage.engine.file_index import IndexSyncError

    monkeypatch.setattr(file_index, "CHECKPOINT_STATEMENTS", 5)
    synced: list[int] = []

    def fsync(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        os.fsync(fd)

    e = FileEngine(tmp_path / "t", fsync_on_commit=False, fsync=fsync)
    idx = e._index
    assert idx._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    checkpoints: list[int] = []
    real = file_index.ChunkIndex.checkpoint

    def spy(self: file_index.ChunkIndex) -> None:
        checkpoints.append(1)
        if len(checkpoints) == 2:
            raise IndexSyncError(errno.EIO, "injected: WAL checkpoint failed")
        real(self)

    monkeypatch.setattr(file_index.ChunkIndex, "checkpoint", spy)

    async def go() -> None:
        for i in range(4):  # 4 rows (+ nothing before): no checkpoint yet
            e.stage_write(ChunkKey(9, i), 1, 0, b"x" * 100)
            await e.commit(ChunkKey(9, i), 1)
        assert checkpoints == []
        e.stage_write(ChunkKey(9, 4), 1, 0, b"x" * 100)
        await e.commit(ChunkKey(9, 4), 1)
        assert checkpoints == [1] and not e.failed
        await e.astage_write(ChunkKey(9, 5), 1, 0, _aligned(b"d" * (1 << 20)), sync=True)
        await e.commit(ChunkKey(9, 5), 1, durable=True)
        await e.astage_write(ChunkKey(9, 6), 1, 0, _aligned(b"d" * (1 << 20)), sync=True)
        await e.commit(ChunkKey(9, 6), 1, durable=True)
        wal_ino = os.stat(f"{tmp_path / 't' / 'index.sqlite'}-wal").st_ino
        assert synced and synced[-1] == wal_ino
        for i in range(7, 10):  # the 10th statement's checkpoint fails: a plain commit, not acked
            e.stage_write(ChunkKey(9, i), 1, 0, b"x" * 100)
            if i < 9:
                await e.commit(ChunkKey(9, i), 1)
        with pytest.raises(OSError):
            await e.commit(ChunkKey(9, 9), 1)
        assert e.failed and "checkpoint" in e.failed
        e._marker.join(DEADLINE_S)  # written on its own thread (an fsync may hang on a failing disk)
        assert (tmp_path / "t" / "FSYNC_FAILED").exists()

    try:
        asyncio.run(go())
    finally:
        e.close()


def test_verification_after_a_failed_fsync_keeps_mismatching_chunks_as_suspects(tmp_path: Path) -> None:
    """The next engine after a failed fsync reads every committed chunk back from the disk: a
    chunk whose file does not hold its row's content (lost pages) is kept, listed in
    ``suspect_chunks`` for the scrubber to repair from another replica (removing it could make
    resync delete a good copy elsewhere), the others verify, the marker goes."""
    fail = [False]

    def fsync(fd: int) -> None:
        if fail[0]:
            raise OSError(errno.EIO, "injected fsync failure")
        os.fsync(fd)

    e = FileEngine(tmp_path / "t", fsync=fsync)
    good, bad = ChunkKey(5, 0), ChunkKey(5, 1)

    async def go() -> None:
        for key, byte in ((good, b"g"), (bad, b"b")):
            await e.astage_write(key, 1, 0, _aligned(byte * (1 << 20)), sync=True)
            await e.commit(key, 1, durable=True)
        await e.astage_write(good, 2, 0, _aligned(b"h" * (1 << 20)), sync=True)
        fail[0] = True
        with pytest.raises(OSError):
            await e.commit(good, 2, durable=True)

    try:
        asyncio.run(go())
    finally:
        e.close()
    assert (tmp_path / "t" / "FSYNC_FAILED").exists()
    path = next((tmp_path / "t" / "chunks").glob("*/5.1.1"))
    raw = bytearray(path.read_bytes())
    raw[1000] ^= 0xFF  # a page the disk never got
    path.write_bytes(bytes(raw))
    e2 = FileEngine(tmp_path / "t")
    try:
        assert e2.wait_verified(DEADLINE_S)
        assert not e2.failed and not (tmp_path / "t" / "FSYNC_FAILED").exists()
        assert e2.suspect_chunks == [bad]
        assert e2.get(bad).commit_ver == 1 and e2.get(good).commit_ver == 1  # type: ignore[union-attr]
        assert e2.verify(bad) and not e2.verify(good)
    finally:
        e2.close()


def test_a_target_verifying_after_a_failed_fsync_is_out_of_service_meanwhile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check runs on a thread (a big target takes long; the node's other targets serve);
    until it ends the engine says it is failed (the node reports it OFFLINE) and commits are
    refused (reviewer's R7)."""
    from loomfs.storage.engine import diskfail
    from loomfs.storage.engine.file import VERIFYING

    e = FileEngine(tmp_path / "t")
    key = ChunkKey(6, 0)

    async def first() -> None:
        e.stage_write(key, 1, 0, b"z" * 5000)
        await e.commit(key, 1)

    asyncio.run(first())
    e._fail(OSError(errno.EIO, "injected"))
    e.close()
    release = threading.Event()
    real = diskfail.content_ok

    def slow(*args, **kw):  # type: ignore[no-untyped-def]
        assert release.wait(DEADLINE_S)
        return real(*args, **kw)

    monkeypatch.setattr(diskfail, "content_ok", slow)
    e2 = FileEngine(tmp_path / "t")
    try:
        assert e2.failed == VERIFYING
        e2.stage_write(key, 2, 0, b"y" * 10)
        with pytest.raises(OSError):
            asyncio.run(e2.commit(key, 2))
        e2.abort(key)
        release.set()
        assert e2.wait_verified(DEADLINE_S) and not e2.failed and e2.suspect_chunks == []
        e2.stage_write(key, 2, 0, b"y" * 10)
        assert asyncio.run(e2.commit(key, 2)).commit_ver == 2
    finally:
        release.set()
        e2.close()


def test_close_does_not_hang_on_a_stuck_verification(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reviewer's R17: a verification read stuck on a hung disk must not hang close()."""
    from loomfs.storage.engine import diskfail, file

    e = FileEngine(tmp_path / "t")
    key = ChunkKey(6, 1)
    e.stage_write(key, 1, 0, b"q" * 5000)
    asyncio.run(e.commit(key, 1))
    e._fail(OSError(errno.EIO, "injected"))
    e.close()
    release = threading.Event()

    def stuck(*args, **kw):  # type: ignore[no-untyped-def]
        release.wait(DEADLINE_S)
        return True

    monkeypatch.setattr(diskfail, "content_ok", stuck)
    monkeypatch.setattr(file, "MARKER_WAIT_S", 0.2)
    e2 = FileEngine(tmp_path / "t")
    t0 = time.monotonic()
    e2.close()
    assert time.monotonic() - t0 < DEADLINE_S / 2
    release.set()
    assert e2.wait_verified(DEADLINE_S) and e2.failed  # it stopped: still failed, marker kept
    assert (tmp_path / "t" / "FSYNC_FAILED").exists()
