"""Reviewer's R5 at the engine: after a failed fsync the FSYNC_FAILED marker is best effort (the
failing disk may refuse it too: EROFS after errors=remount-ro, EIO). Then the next process
does not verify the target by itself; mgmtd, which remembers the failure, asks its node to
(``start_verification``), and the engine checks every chunk as the marker would have made it."""

from __future__ import annotations

import asyncio
import errno
import mmap
import os
from pathlib import Path

import pytest

from loomfs.storage.engine import file as file_engine
from loomfs.storage.engine.file import VERIFYING, FileEngine
from loomfs.storage.engine.types import ChunkKey

DEADLINE_S = 20.0


def _aligned(data: bytes) -> memoryview:
    m = mmap.mmap(-1, len(data))
    m[:] = data
    return memoryview(m)


def test_a_target_whose_marker_was_refused_is_verified_when_mgmtd_asks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fail = [False]

    def fsync(fd: int) -> None:
        if fail[0]:
            raise OSError(errno.EIO, "injected fsync failure")
        os.fsync(fd)

    refused: list[str] = []

    def marker_refused(target_dir: Path, why: str) -> bool:  # as diskfail.write_marker on EROFS
        refused.append(why)
        return False

    monkeypatch.setattr(file_engine, "write_marker", marker_refused)
    e = FileEngine(tmp_path / "t", fsync=fsync)
    plain, durable = ChunkKey(9, 0), ChunkKey(9, 1)
    data = b"p" * (1 << 20)

    async def go() -> None:
        await e.astage_write(plain, 1, 0, _aligned(data))
        await e.commit(plain, 1)  # acked; its pages only in the page cache
        await e.astage_write(durable, 1, 0, _aligned(b"d" * (1 << 20)), sync=True)
        fail[0] = True
        with pytest.raises(OSError):
            await e.commit(durable, 1, durable=True)

    try:
        asyncio.run(go())
    finally:
        e.close()
    assert e.failed and refused and not (tmp_path / "t" / "FSYNC_FAILED").exists()
    path = next((tmp_path / "t" / "chunks").glob("*/9.0.*"))
    raw = bytearray(path.read_bytes())
    raw[12345] ^= 0xFF  # the failed disk lost the plain chunk's pages
    path.write_bytes(bytes(raw))

    e2 = FileEngine(tmp_path / "t")  # the operator restarts the storage process
    try:
        assert not e2.failed and not e2.verified and e2.suspect_chunks == []  # nothing told it
        e2.start_verification()  # mgmtd's registration reply: verify_targets
        assert e2.failed in (VERIFYING, "")  # out of service until checked (a thread)
        assert e2.wait_verified(DEADLINE_S)
        assert not e2.failed and e2.verified
        assert e2.suspect_chunks == [plain]  # handed to the scrubber by the node
        assert e2.get(plain).commit_ver == 1  # type: ignore[union-attr]  # kept, not removed
        e2.start_verification()  # asked again (a second registration): nothing new
        assert not e2.failed and e2.suspect_chunks == [plain]
        # the reopened index takes commits as before
        e2.stage_write(ChunkKey(9, 2), 1, 0, b"new")
        assert asyncio.run(e2.commit(ChunkKey(9, 2), 1)).commit_ver == 1
    finally:
        e2.close()
    e3 = FileEngine(tmp_path / "t")
    try:
        keys = {s.key for s in e3.list_chunks()}
        assert {plain, ChunkKey(9, 2)} <= keys and not e3.failed and not e3.verified  # a new process
    finally:
        e3.close()
