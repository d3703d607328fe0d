"""Sequential read-ahead of the mount: whole chunks fetched ahead into pooled buffers, and each
FUSE READ of a sequential stream answered with a view into them.

The kernel asks for 1 MiB at a time (the bdi read-ahead); a file's chunks are 4 MiB. Once a
handle's reads continue each other, its next ``depth`` chunks are fetched in the background
(one ``pread`` per chunk straight into a buffer of the client's pool: the stripe's chains
serve them in parallel), and a READ inside a fetched chunk costs a dictionary lookup and a
``memoryview`` slice: pyfuse3 copies the reply into the kernel before any other handler
runs, so no copy is made here and no task is created per request. Reads that do not continue
the stream (random access) go straight to the client.

Buffers go back to the pool once the stream has moved past their chunk (or the stream is
dropped or closed) and no READ is waiting on them or answering from them: never while a fetch
may still be writing into one, nor before the READ that answers from one has been copied.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from loomfs.client.file import AsyncFile
from loomfs.client.readahead import CachedChunk as _Chunk  # the same record: readers, dropped
from loomfs.mount.stats import MountStats
from loomfs.mount.uses import FileUses
from loomfs.net.buffers import BufferPool

logger = logging.getLogger(__name__)
Call = Callable[[Coroutine[Any, Any, int]], Coroutine[Any, Any, int]]


class Budget:
    """Bytes of prefetch buffers all handles of a mount may hold at once."""

    __slots__ = ("max_bytes", "used_bytes")

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.used_bytes = 0


class Prefetcher:
    """One open, read-only handle's sequential stream."""

    def __init__(self, file: AsyncFile, pool: BufferPool, budget: Budget, depth_chunks: int, call: Call,
                 stats: MountStats | None = None, uses: FileUses | None = None):
        self.file = file
        self.stats = stats
        self.pool = pool
        self.budget = budget
        self.depth_chunks = depth_chunks
        self.call = call
        self.chunk_bytes = file.layout.chunk_size
        self._chunks: dict[int, _Chunk] = {}
        self._next_off = -1  # where a read continuing the stream starts
        self.served = 0  # READs answered from fetched chunks
        self.uses = uses
        self.closed = False

    async def read(self, off: int, size: int, fallback: Callable[[], Coroutine[Any, Any, memoryview]]) -> memoryview:
        sequential = off == self._next_off
        if not sequential:
            self.drop_all()  # a new stream (or random reads): what was fetched is not wanted
        self._next_off = off + size
        cs = self.chunk_bytes
        index = off // cs
        length = self.file.length
        if off >= length:
            return memoryview(b"")
        end = min(off + size, length)
        if not sequential:
            return await fallback()
        if (end - 1) // cs != index:  # across a chunk boundary (unaligned requests): direct
            self._fill(index)
            return await fallback()
        self._fill(index)
        c = self._chunks.get(index)
        if c is None:  # over the budget
            return await fallback()
        c.readers += 1
        try:
            try:
                n = await asyncio.shield(c.task)
            except Exception as exc:  # noqa: BLE001 - the direct read reports it
                logger.debug("%s: prefetch of chunk %d failed (%s); reading directly", self.file.path, index, exc)
                self._drop(c)
                n = -1
            start = off - index * cs
            if 0 <= n < start + (end - off):  # the chunk came back short (file shrank meanwhile)
                self._drop(c)
                n = -1
            if n >= 0:
                self._drop_below(index)
                self.served += 1
                if self.stats is not None:
                    self.stats.read_prefetched += 1
                return memoryview(c.buf)[start : start + (end - off)]
        finally:
            c.readers -= 1
            if c.dropped and not c.readers:  # dropped while this READ waited (a close, a new
                # stream): the buffer goes back after this step, in which pyfuse3 copies the reply
                self._release(c, later=True)
        return await fallback()

    def _fill(self, index: int) -> None:
        """Fetches for chunks index .. index + depth - 1 not fetched yet (within the budget)."""
        if self.closed:  # swapped out at a lock (mount/revalidate.py): its file is not read any more
            return
        cs = self.chunk_bytes
        length = self.file.length
        last = (length - 1) // cs
        for i in range(index, min(index + self.depth_chunks, last + 1)):
            if i in self._chunks:
                continue
            n = min(cs, length - i * cs)
            if self.budget.used_bytes + n > self.budget.max_bytes:
                return
            buf = self.pool.acquire(n)
            self.budget.used_bytes += len(buf)
            if self.uses is not None:  # the file stays open until the fetch ends
                self.uses.begin(self.file)
            task = asyncio.ensure_future(self.call(self.file.pread(i * cs, memoryview(buf)[:n], readahead=False)))
            task.add_done_callback(self._fetched)
            self._chunks[i] = _Chunk(i, n, buf, task)

    def _fetched(self, task: asyncio.Future[int]) -> None:
        _retrieve(task)
        if self.uses is not None:
            self.uses.end(self.file)

    def _drop_below(self, index: int) -> None:
        if len(self._chunks) and min(self._chunks) < index:
            for c in [c for c in self._chunks.values() if c.index < index]:
                self._drop(c)

    def _drop(self, c: _Chunk) -> None:
        """Forget ``c``; its buffer goes back to the pool once its fetch has landed and no READ
        waits on it or answers from it (the last such READ gives it back, see ``read``)."""
        if self._chunks.get(c.index) is c:
            del self._chunks[c.index]
        if c.dropped:
            return
        c.dropped = True
        if not c.readers:  # else the last READ gives it back
            self._release(c, later=False)

    def _release(self, c: _Chunk, *, later: bool) -> None:
        if not c.task.done():  # a fetch may still be landing in it (no READ can join it now)
            c.task.add_done_callback(lambda _t: self._give_back(c))
        elif later:
            asyncio.get_running_loop().call_soon(self._give_back, c)
        else:
            self._give_back(c)

    def _give_back(self, c: _Chunk) -> None:
        self.budget.used_bytes -= len(c.buf)
        self.pool.release(c.buf)

    def drop_all(self) -> None:
        """Forget what was fetched (the next read starts a new stream). A READ waiting on a
        chunk still answers from it (it asked before whatever made the chunks unwanted)."""
        self._next_off = -1
        for c in list(self._chunks.values()):
            self._drop(c)

    def close(self) -> None:
        """At release, or when a lock's revalidation swaps the handle's file (while READs of
        this stream may be waiting on chunks: they answer, then give the buffers back)."""
        self.closed = True
        self.drop_all()


def _retrieve(task: asyncio.Future[int]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.debug("prefetch failed: %s", task.exception())
