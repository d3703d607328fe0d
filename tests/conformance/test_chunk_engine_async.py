"""The off-loop engine calls (aread / astage_write) agree with the synchronous ones, through
O_DIRECT (pooled page-aligned buffers) and through buffered fallbacks (unaligned buffers)."""

from __future__ import annotations

import asyncio
import mmap
import os
from pathlib import Path

import crc32c
import pytest

from loomfs.storage.engine.base import ChunkEngine
from loomfs.storage.engine.blocks import block_crcs_of, unpack_blocks
from loomfs.storage.engine.file import FileEngine
from loomfs.storage.engine.memory import MemoryEngine
from loomfs.storage.engine.types import ChunkKey


def _engine(kind: str, path: Path) -> ChunkEngine:
    if kind == "memory":
        return MemoryEngine()
    return FileEngine(path, direct_io=kind == "file-direct")


def _aligned(data: bytes) -> memoryview:
    m = mmap.mmap(-1, max(len(data), 1))
    m[: len(data)] = data
    return memoryview(m)[: len(data)]


@pytest.mark.parametrize("kind", ["memory", "file", "file-direct"])
@pytest.mark.parametrize("size", [4 << 20, (1 << 20) + 123, 600 << 10])
@pytest.mark.parametrize("aligned", [True, False])
def test_async_write_read_roundtrip(tmp_path: Path, kind: str, size: int, aligned: bool) -> None:
    async def go() -> None:
        e = _engine(kind, tmp_path / "t")
        key = ChunkKey(1, 2)
        v1 = os.urandom(size)
        src = _aligned(v1) if aligned else memoryview(bytearray(v1))
        st = await e.astage_write(key, 1, 0, src, data_crc=crc32c.crc32c(v1))
        assert st.pending_ver == 1 and st.pending_length == size
        await e.commit(key, 1)
        # a second version replaces the first; the first's bytes never come back
        v2 = os.urandom(size)
        await e.astage_write(key, 2, 0, _aligned(v2) if aligned else v2, data_crc=crc32c.crc32c(v2))
        await e.commit(key, 2)
        assert e.get(key).crc == crc32c.crc32c(v2)  # type: ignore[union-attr]
        for off, n in [(0, size), (4096, size - 4096), (0, 5000), (size - 3, 3), (123, 700_000)]:
            n = min(n, size - off)
            out = _aligned(bytes(n)) if aligned else memoryview(bytearray(n))
            assert await e.aread(key, off, out) == n
            assert bytes(out) == v2[off:off + n]
            sync_out = bytearray(n)
            assert e.read(key, off, memoryview(sync_out)) == n and bytes(sync_out) == v2[off:off + n]
        # past the end: short read
        out = _aligned(bytes(1 << 20))
        assert await e.aread(key, size - 10, out) == 10
        # the block CRCs were computed beside the (O_DIRECT) write; partial reads above checked them
        assert e.block_crcs(key) == unpack_blocks(block_crcs_of(v2)) and e.verify(key) == []
        e.close()

    asyncio.run(go())


def test_partial_overwrite_after_direct_write_is_coherent(tmp_path: Path) -> None:
    async def go() -> None:
        e = FileEngine(tmp_path / "t", direct_io=True)
        key = ChunkKey(9, 0)
        data = bytearray(os.urandom(4 << 20))
        await e.astage_write(key, 1, 0, _aligned(bytes(data)), data_crc=crc32c.crc32c(data))
        await e.commit(key, 1)
        patch = os.urandom(5000)
        e.stage_write(key, 2, 4096 * 3 + 7, patch)  # buffered copy-on-write path
        await e.commit(key, 2)
        data[4096 * 3 + 7: 4096 * 3 + 7 + 5000] = patch
        out = _aligned(bytes(4 << 20))
        assert await e.aread(key, 0, out) == 4 << 20  # O_DIRECT read sees the buffered write
        assert bytes(out) == bytes(data)
        assert e.get(key).crc == crc32c.crc32c(data)  # type: ignore[union-attr]
        assert e.block_crcs(key) == unpack_blocks(block_crcs_of(data)) and e.verify(key) == []
        part = _aligned(bytes(1 << 20))
        assert await e.aread(key, 4096, part) == 1 << 20 and bytes(part) == bytes(data[4096 : 4096 + (1 << 20)])
        e.close()
        e2 = FileEngine(tmp_path / "t", direct_io=True)  # restart: same content
        out2 = _aligned(bytes(4 << 20))
        assert await e2.aread(key, 0, out2) == 4 << 20 and bytes(out2) == bytes(data)
        e2.close()

    asyncio.run(go())


def test_a_durable_commit_fsyncs_data_directory_and_index(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Issue 10: a commit for a durable layout reaches the disk (data file, its directory entry,
    the index's WAL) although the engine does not fsync every commit."""
    import os as _os

    from loomfs.storage.engine.types import ChunkKey

    synced: list[str] = []
    real = _os.fsync

    def spy(fd: int) -> None:
        synced.append(_os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    e = FileEngine(tmp_path / "t", fsync_on_commit=False)
    try:
        key = ChunkKey(5, 0)
        monkeypatch.setattr(_os, "fsync", spy)
        e.stage_write(key, 1, 0, memoryview(b"x" * 5000))
        asyncio.run(e.commit(key, 1))
        assert synced == []  # an ordinary commit: no fsync
        e.stage_write(key, 2, 0, memoryview(b"y" * 5000))
        asyncio.run(e.commit(key, 2, durable=True))
        assert e.durable_commits_total == 1
        assert any("/chunks/" in p and _os.path.isfile(p) for p in synced)  # the data file
        assert any(p.endswith("index.sqlite-wal") for p in synced)
        assert any(_os.path.isdir(p) for p in synced)  # the directory entry of a new file
    finally:
        e.close()
