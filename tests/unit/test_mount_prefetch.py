"""The mount's sequential prefetch (loomfs.mount.prefetch) without a mount: a chunk's buffer
never goes back to the pool while a READ waits on it or answers from it, whatever drops the
chunk meanwhile (a lock's revalidation closing the stream, a new stream, a short chunk). The
pool and the Prefetcher are real; a gated file stands in for the client's."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from loomfs.mount.prefetch import Budget, Prefetcher
from loomfs.net.buffers import BufferPool

CHUNK = 1 << 20


class _Layout:
    chunk_size = CHUNK


class _File:
    """The file's bytes are b"A"; each pread waits for the gate."""

    path = "/f"
    layout = _Layout()

    def __init__(self, length: int = 4 * CHUNK, *, short: int | None = None) -> None:
        self.length = length
        self.short = short  # a fetch returns this many bytes (the file shrank meanwhile)
        self.gate = asyncio.Event()
        self.preads = 0

    async def pread(self, off: int, view: memoryview, readahead: bool = True) -> int:
        self.preads += 1
        await self.gate.wait()
        n = len(view) if self.short is None else min(self.short, len(view))
        view[:n] = b"A" * n
        return n


async def _call(c: Coroutine[Any, Any, int]) -> int:  # the shared loop's ops.call
    return await c


async def _steps(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def _until(cond: Any, steps: int = 20) -> None:
    for _ in range(steps):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("not reached in 20 loop steps")


def _stream(f: _File, pool: BufferPool, budget: Budget, depth: int = 2) -> Prefetcher:
    p = Prefetcher(f, pool, budget, depth, _call)
    p._next_off = 0  # a sequential stream at offset 0
    return p


async def _fallback() -> memoryview:
    raise AssertionError("the READ should answer from the fetched chunk")


def _other_users(pool: BufferPool, n: int) -> list[Any]:
    """The pool's next users, writing into what they get at once."""
    got = [pool.acquire(CHUNK) for _ in range(n)]
    for b in got:
        memoryview(b)[:4096] = b"B" * 4096
    return got


def test_a_close_while_a_read_waits_keeps_its_buffer_until_the_read_answered() -> None:
    """The reviewer's F5: a lock granted on another descriptor of the file closes this stream
    (mount/revalidate.py) while a READ waits on chunk 0. The fetch lands; the buffer must not
    be another pool user's before the READ has answered from it."""

    async def main() -> None:
        pool, budget, f = BufferPool(), Budget(64 << 20), _File()
        p = _stream(f, pool, budget)
        read = asyncio.ensure_future(p.read(0, 4096, _fallback))
        await _until(lambda: f.preads == 2)  # chunks 0 and 1 in flight, the READ waits on 0
        p.close()
        f.gate.set()
        for _ in range(10):  # the loop steps between the fetch's end and the READ's wake-up
            await asyncio.sleep(0)
            if read.done():
                break
            others = _other_users(pool, 2)  # whoever runs then: the pool has only chunk 1's
            for o in others:
                pool.release(o)
        view = read.result()
        assert bytes(view[:8]) == b"AAAAAAAA"
        # pyfuse3 copied the reply in the READ's own step; after it the buffer is free again
        chunk0 = view.obj
        await _steps(2)
        assert any(b is chunk0 for bs in pool._free.values() for b in bs)
        assert budget.used_bytes == 0
        assert not p._chunks
        await p.read(4096, 4096, _fallback_direct)  # a closed stream fetches nothing more
        assert f.preads == 2

    asyncio.run(main())


async def _fallback_direct() -> memoryview:
    return memoryview(b"direct")


def test_a_new_stream_while_a_read_waits_keeps_its_buffer_until_the_read_answered() -> None:
    async def main() -> None:
        pool, budget, f = BufferPool(), Budget(64 << 20), _File()
        p = _stream(f, pool, budget)
        read = asyncio.ensure_future(p.read(0, 4096, _fallback))
        await _until(lambda: f.preads == 2)
        p.drop_all()  # a write open here: what was fetched may be stale for later READs
        f.gate.set()
        while not read.done():
            await asyncio.sleep(0)
            for o in _other_users(pool, 2):
                pool.release(o)
        assert bytes(read.result()[:8]) == b"AAAAAAAA"
        await _steps(2)
        assert budget.used_bytes == 0 and not p._chunks

    asyncio.run(main())


def test_two_reads_waiting_on_a_closed_chunk_both_answer_and_the_last_gives_it_back() -> None:
    async def main() -> None:
        pool, budget, f = BufferPool(), Budget(64 << 20), _File()
        p = _stream(f, pool, budget, depth=1)
        first = asyncio.ensure_future(p.read(0, 4096, _fallback))
        second = asyncio.ensure_future(p.read(4096, 4096, _fallback))
        await _until(lambda: f.preads == 1)
        p.close()
        f.gate.set()
        while not second.done():
            await asyncio.sleep(0)
            for o in _other_users(pool, 1):
                pool.release(o)
        assert bytes(first.result()[:8]) == bytes(second.result()[:8]) == b"AAAAAAAA"
        await _steps(2)
        assert budget.used_bytes == 0

    asyncio.run(main())


def test_a_cancelled_read_gives_the_buffer_back_once_the_fetch_lands() -> None:
    async def main() -> None:
        pool, budget, f = BufferPool(), Budget(64 << 20), _File()
        p = _stream(f, pool, budget, depth=1)
        read = asyncio.ensure_future(p.read(0, 4096, _fallback))
        await _until(lambda: f.preads == 1)
        read.cancel()  # the kernel interrupted the READ
        await _steps(2)
        p.close()
        assert budget.used_bytes == CHUNK  # the fetch may still land in it
        f.gate.set()
        await _steps(3)
        assert budget.used_bytes == 0

    asyncio.run(main())
