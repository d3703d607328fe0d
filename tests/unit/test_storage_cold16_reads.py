"""Small reads whose range is not in the page cache leave the event loop (session 16): read on
the loop, a cold read waited for the disk with the storage process stopped, and concurrent cold
reads went to the disk one at a time. Resident ones stay on the loop (a thread hop costs more
than the copy); a file system that cannot tell keeps them there as before."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from loomfs.storage.engine import file_async
from loomfs.storage.engine.file import FileEngine
from loomfs.storage.engine.types import ChunkKey

KEY = ChunkKey(inode=7, index=0)
DATA = bytes(range(256)) * 1024  # 256 KiB: a small read by the engine's measure


def _engine(tmp_path: Path) -> FileEngine:
    e = FileEngine(tmp_path / "t")

    async def put() -> None:
        e.stage_write(KEY, 1, 0, DATA)
        await e.commit(KEY, 1)
    asyncio.run(put())
    return e


@pytest.mark.parametrize("resident", [True, None])
def test_resident_or_unknown_reads_stay_on_the_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    resident: bool | None) -> None:
    e = _engine(tmp_path)
    try:
        monkeypatch.setattr(file_async, "in_page_cache", lambda fd, off, n: resident)
        into = bytearray(5000)
        assert asyncio.run(e.aread(KEY, 4000, memoryview(into))) == 5000
        assert bytes(into) == DATA[4000:9000]
        assert e.cold_reads_offloaded == 0
    finally:
        e.close()


def test_a_cold_small_read_leaves_the_loop_free(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    e = _engine(tmp_path)
    try:
        monkeypatch.setattr(file_async, "in_page_cache", lambda fd, off, n: False)
        slow_disk = threading.Event()
        real = e._read_checked  # noqa: SLF001

        def slow(*args: Any, **kw: Any) -> None:  # the disk takes its time
            slow_disk.wait(5)
            real(*args, **kw)

        monkeypatch.setattr(e, "_read_checked", slow)

        async def main() -> None:
            into = [bytearray(5000) for _ in range(4)]
            reads = [asyncio.ensure_future(e.aread(KEY, 4000 + 10_000 * i, memoryview(into[i]))) for i in range(4)]
            ticks = 0
            deadline = time.monotonic() + 5
            while ticks < 20:  # the loop runs on while the reads wait for the disk
                assert time.monotonic() < deadline, "the loop was blocked"
                await asyncio.sleep(0)
                ticks += 1
            assert not any(r.done() for r in reads)
            slow_disk.set()
            assert await asyncio.gather(*reads) == [5000] * 4
            for i in range(4):
                assert bytes(into[i]) == DATA[4000 + 10_000 * i:9000 + 10_000 * i]
        asyncio.run(main())
        assert e.cold_reads_offloaded == 4
    finally:
        e.close()


def test_whole_small_chunk_cold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    e = _engine(tmp_path)
    try:
        monkeypatch.setattr(file_async, "in_page_cache", lambda fd, off, n: False)
        into = bytearray(len(DATA))
        assert asyncio.run(e.aread(KEY, 0, memoryview(into))) == len(DATA)
        assert bytes(into) == DATA and e.cold_reads_offloaded == 1
    finally:
        e.close()


def test_the_probe_tells_resident_from_dropped_pages(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(DATA)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.pread(fd, len(DATA), 0)
        first = file_async.in_page_cache(fd, 0, len(DATA))
        assert first is True  # (None: this kernel or file system cannot tell, no RWF_NOWAIT)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert file_async.in_page_cache(fd, 0, len(DATA)) is False
    finally:
        os.close(fd)
