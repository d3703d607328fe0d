"""``open_region`` (zero-copy sends of a committed chunk file, multicore's request): the file
engine hands out a private fd of the committed version; nothing while an update is pending, for
a missing chunk, or once the target failed; engines without files give None."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import crc32c

from loomfs.storage.engine.file import FileEngine
from loomfs.storage.engine.memory import MemoryEngine
from loomfs.storage.engine.types import ChunkKey


def test_open_region_of_the_committed_version(tmp_path: Path) -> None:
    e = FileEngine(tmp_path / "t")
    key = ChunkKey(3, 1)
    data = os.urandom(70_000)
    try:
        assert e.open_region(key) is None
        e.stage_write(key, 1, 0, data)
        assert e.open_region(key) is None  # pending only
        asyncio.run(e.commit(key, 1))
        region = e.open_region(key)
        assert region is not None
        fd, length, crc = region
        try:
            assert (length, crc) == (len(data), crc32c.crc32c(data))
            assert os.pread(fd, length, 0) == data
        finally:
            os.close(fd)  # the caller's own: the engine's fd stays open
        e.stage_write(key, 2, len(data), b"more")  # an append in place is pending
        assert e.open_region(key) is None
        e.abort(key)
        again = e.open_region(key)
        assert again is not None
        os.close(again[0])
        e.failed = "fsync failed: test"
        assert e.open_region(key) is None
    finally:
        e.close()
    assert MemoryEngine().open_region(key) is None
