"""The client's read-ahead cache never gives a chunk's buffer back to the pool while a read
that found the chunk still waits on it or copies out of it (no sockets).

A clear() or drop() by another call (a close, an fsync after a truncate, the mount dropping
prefetched data, a read further on) used to release the buffer in the fetch's done-callback,
one loop step before the waiting read resumed and copied: another user of the pool could
write into it first, and the read returned that user's bytes (mountfix's find, session 12)."""

from __future__ import annotations

import asyncio

import pytest

from loomfs.client.readahead import ReadAheadCache
from loomfs.net.buffers import BufferPool


@pytest.mark.parametrize("landed_first", [False, True])
def test_a_dropped_chunk_stays_with_its_waiting_reader(landed_first: bool) -> None:
    async def main() -> None:
        pool = BufferPool()
        gate = asyncio.Event()

        async def fetch(index: int, into: memoryview) -> int:
            await gate.wait()
            into[:] = b"A" * len(into)
            return len(into)

        cache = ReadAheadCache(pool, 4)
        entry = cache.start(0, 4096, fetch)
        assert entry is not None
        out = bytearray(8)
        copied = asyncio.Event()

        async def reader() -> None:  # what AsyncFile's read does with an entry it found
            cache.hold(entry)
            try:
                await asyncio.shield(entry.task)
                out[:] = memoryview(entry.buf)[:8]
                copied.set()
            finally:
                cache.let_go(entry)

        task = asyncio.ensure_future(reader())
        await asyncio.sleep(0)  # the reader waits on the fetch
        if landed_first:
            gate.set()
            await entry.task  # the fetch landed; the reader has not resumed yet
            assert not copied.is_set()
        cache.clear()
        gate.set()
        while not task.done():
            if not copied.is_set():  # another pool user, every step until the reader copied
                assert not any(pool._free.values()), "the buffer went back before the reader copied"
            await asyncio.sleep(0)
        await task
        assert bytes(out) == b"AAAAAAAA"
        assert any(pool._free.values())  # and it did go back once the reader let go

    asyncio.run(main())


def test_an_unread_dropped_chunk_goes_back_when_its_fetch_lands() -> None:
    async def main() -> None:
        pool = BufferPool()
        gate = asyncio.Event()

        async def fetch(index: int, into: memoryview) -> int:
            await gate.wait()
            return len(into)

        cache = ReadAheadCache(pool, 4)
        entry = cache.start(0, 4096, fetch)
        assert entry is not None
        pending = cache.clear()
        assert pending == [entry.task] and not any(pool._free.values())
        gate.set()
        await entry.task
        await asyncio.sleep(0)  # the done-callback
        assert any(pool._free.values())

    asyncio.run(main())
