"""A get's reads end with it (reviewer finding F2): when ``get_many`` raises, no read it
started is still running to write into the caller's ``into=`` buffers later; a buffer too
small fails before any read is issued (no sockets: a storage double whose reads take a while,
then write into the buffer they were given)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import crc32c
import pytest

from loomfs.errors import ConnectionFailed, InvalidArgument
from loomfs.kvcache import _entry as E
from loomfs.kvcache._config import KVConfig, KVStats
from loomfs.kvcache._get import GetPath
from loomfs.kvcache._jobs import run_all
from loomfs.kvcache._values import Target
from loomfs.testing.simloop import run_virtual

CHUNK = 64 << 10
READ_S = 0.05  # how long a read of the double takes before it writes (virtual seconds: run_virtual)


def _fill(index: int, n: int) -> bytes:
    return bytes([index % 250 + 1]) * n


class _Store:
    """Chunk reads that write ``_fill(chunk index)`` after ``READ_S``; ``fail`` maps a chunk
    index to the error its read raises (once the other reads are under way)."""

    def __init__(self, fail: dict[int, BaseException] | None = None):
        self.fail = fail or {}
        self.calls: list[int] = []

    async def read_chunk(self, layout: Any, inode: int, index: int, offset: int, length: int,
                         view: memoryview) -> None:
        self.calls.append(index)
        if index in self.fail:
            await asyncio.sleep(READ_S / 5)
            raise self.fail[index]
        await asyncio.sleep(READ_S)
        view[:] = _fill(index, length)


class _Cache(GetPath):
    def __init__(self, store: _Store):
        self.client = SimpleNamespace(storage=store)
        self.config = KVConfig()
        self.stats = KVStats()
        self.prefix = "/kv"
        self.clock = lambda: 0.0
        self._touches: dict[str, E.Entry] = {}


def _entry(i: int, nbytes: int = 1000, chunk: int | None = None) -> E.Entry:
    """Value i at the start of chunk i (each read alone), or from ``chunk``'s start."""
    at = (i if chunk is None else chunk) * CHUNK
    data = b"".join(_fill(c, min(CHUNK - (at + o) % CHUNK, nbytes - o))
                    for c, o in _pieces(at, nbytes))
    return E.Entry(key=b"k%d" % i, touched_s=0.0, value_bytes=nbytes, value_crc=crc32c.crc32c(data),
                   seg_name="s", seg_inode=7, seg_offset=at, chunk_size=CHUNK, chains=(1, 2))


def _pieces(at: int, nbytes: int) -> list[tuple[int, int]]:
    out, o = [], 0
    while o < nbytes:
        out.append(((at + o) // CHUNK, o))
        o += CHUNK - (at + o) % CHUNK
    return out


async def _after_raise(coro: Any, exc: type[BaseException], bufs: list[bytearray]) -> tuple[list[bytes], int]:
    """Await ``coro`` (it must raise ``exc``); the buffers as they were at the raise, and how
    many other tasks were still running then. Then wait past every read's time: a read still
    running would have written by then."""
    with pytest.raises(exc):
        await coro
    at_raise = [bytes(b) for b in bufs]
    left = len(asyncio.all_tasks()) - 1
    await asyncio.sleep(3 * READ_S)
    return at_raise, left


def test_a_buffer_too_small_fails_before_any_read() -> None:
    store = _Store()
    cache = _Cache(store)
    bufs = [bytearray(1000), bytearray(1000), bytearray(10)]

    async def main() -> tuple[list[bytes], int]:
        return await _after_raise(cache._read_values([_entry(i) for i in range(3)], [Target(b) for b in bufs]),
                                  InvalidArgument, bufs)

    at_raise, left = run_virtual(main())
    assert store.calls == []  # not one read issued
    assert left == 0
    assert [bytes(b) for b in bufs] == at_raise == [bytes(1000), bytes(1000), bytes(10)]


def test_a_read_failing_mid_batch_leaves_no_read_running() -> None:
    store = _Store(fail={2: RuntimeError("not an OSError: raised to the caller")})
    cache = _Cache(store)
    bufs = [bytearray(1000) for _ in range(5)]

    async def main() -> tuple[list[bytes], int]:
        return await _after_raise(cache._read_values([_entry(i) for i in range(5)], [Target(b) for b in bufs]),
                                  RuntimeError, bufs)

    at_raise, left = run_virtual(main())
    assert sorted(store.calls) == [0, 1, 2, 3, 4]  # all under way when one failed
    assert left == 0
    assert [bytes(b) for b in bufs] == at_raise  # nothing written after the raise
    assert at_raise == [bytes(1000)] * 5  # the others were cancelled mid-read


def test_a_failed_piece_of_a_value_across_chunks_is_a_miss_with_no_read_left() -> None:
    store = _Store(fail={3: ConnectionFailed("storage gone")})  # the first piece of the value
    cache = _Cache(store)
    buf = bytearray(CHUNK + 5000)

    async def main() -> tuple[list[Any], bytes, int]:
        got = await cache._read_values([_entry(0, len(buf), chunk=3)], [Target(buf)])
        at_return, left = bytes(buf), len(asyncio.all_tasks()) - 1
        await asyncio.sleep(3 * READ_S)
        return got, at_return, left

    got, at_return, left = run_virtual(main())
    assert got == [None] and cache.stats.read_errors == 1
    assert sorted(store.calls) == [3, 4] and left == 0
    assert bytes(buf) == at_return == bytes(len(buf))


def test_the_same_values_without_a_failure_are_hits() -> None:
    """The doubles above do read: with nothing failing every value arrives."""
    cache = _Cache(_Store())
    bufs = [bytearray(1000) for _ in range(3)] + [bytearray(CHUNK + 5000)]
    entries = [_entry(i) for i in range(3)] + [_entry(3, CHUNK + 5000, chunk=5)]
    got = run_virtual(cache._read_values(entries, [Target(b) for b in bufs]))
    assert got == bufs and bufs[0] == _fill(0, 1000) and bufs[3][-1:] == _fill(6, 1)


def test_run_all_waits_for_every_job_before_raising_even_when_cancelled() -> None:
    ended: list[str] = []

    async def slow_to_stop(name: str) -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(READ_S)  # cleanup that takes a while
            ended.append(name)
            raise

    async def fails() -> None:
        await asyncio.sleep(0)
        raise ValueError("a job failed")

    async def main() -> tuple[list[int], list[str], list[str]]:
        first = await run_all([asyncio.sleep(0, i) for i in range(3)])
        with pytest.raises(ValueError):
            await run_all([slow_to_stop("a"), fails()])
        at_raise = list(ended)
        task = asyncio.ensure_future(run_all([slow_to_stop("b"), fails()]))
        await asyncio.sleep(READ_S / 5)  # the failure came; run_all waits for "b" to stop
        task.cancel()  # a cancel meanwhile is raised once "b" has ended, not at once
        with pytest.raises(asyncio.CancelledError):
            await task
        return first, at_raise, list(ended)

    first, at_raise, at_cancel = run_virtual(main())
    assert first == [0, 1, 2]
    assert at_raise == ["a"] and at_cancel == ["a", "b"]
