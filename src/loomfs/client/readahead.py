"""Read-ahead cache of one open file: whole chunks fetched into pooled buffers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from loomfs.net.buffers import Buffer, BufferPool

logger = logging.getLogger(__name__)

Fetch = Callable[[int, memoryview], Coroutine[Any, Any, int]]  # (chunk index, into) -> bytes present


class CachedChunk:
    """Chunk ``index`` bytes [0, length) landing in ``buf`` (valid once ``task`` is done).
    ``readers``: reads waiting on it or copying out of it (``ReadAheadCache.hold``); a dropped
    chunk's buffer goes back to the pool only once its fetch ended and the last one let go."""

    __slots__ = ("index", "length", "buf", "task", "readers", "dropped")

    def __init__(self, index: int, length: int, buf: Buffer, task: asyncio.Task[int]):
        self.index = index
        self.length = length
        self.buf = buf
        self.task = task
        self.readers = 0
        self.dropped = False

    def __repr__(self) -> str:
        return f"CachedChunk({self.index} len={self.length} done={self.task.done()})"


class ReadAheadCache:
    """At most ``capacity_chunks`` chunks, fetched in the background; counts hits/misses."""

    def __init__(self, pool: BufferPool, capacity_chunks: int):
        self.pool = pool
        self.capacity_chunks = capacity_chunks
        self._entries: dict[int, CachedChunk] = {}
        self.hits = 0
        self.misses = 0
        self.fetches = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, index: int) -> bool:
        return index in self._entries

    def indexes(self) -> list[int]:
        return sorted(self._entries)

    def get(self, index: int) -> CachedChunk | None:
        e = self._entries.get(index)
        if e is None:
            self.misses += 1
        else:
            self.hits += 1
        return e

    @property
    def full(self) -> bool:
        return len(self._entries) >= self.capacity_chunks

    def start(self, index: int, length: int, fetch: Fetch) -> CachedChunk | None:
        """Begin fetching chunk ``index`` (``length`` valid bytes); None when full."""
        if index in self._entries:
            return self._entries[index]
        if self.full:
            return None
        buf = self.pool.acquire(length)
        task: asyncio.Task[int] = asyncio.get_running_loop().create_task(fetch(index, memoryview(buf)[:length]))
        task.add_done_callback(_retrieve)
        entry = CachedChunk(index, length, buf, task)
        self._entries[index] = entry
        self.fetches += 1
        return entry

    def drop(self, index: int) -> None:
        e = self._entries.pop(index, None)
        if e is not None:
            self._release(e)

    def drop_below(self, index: int) -> None:
        for i in [i for i in self._entries if i < index]:
            self.drop(i)

    def drop_range(self, indexes: range) -> None:
        for i in [i for i in self._entries if i in indexes]:
            self.drop(i)

    def clear(self) -> list[asyncio.Task[int]]:
        """Forget every chunk; returns the fetches still in flight (their buffers go back to
        the pool when they end), for an owner that must not outlive them."""
        pending = [e.task for e in self._entries.values() if not e.task.done()]
        for i in list(self._entries):
            self.drop(i)
        return pending

    def hold(self, e: CachedChunk) -> None:
        """A read is about to wait on ``e`` and copy out of it: its buffer stays ours until
        ``let_go`` (taken before the first await, in the step that found the entry)."""
        e.readers += 1

    def let_go(self, e: CachedChunk) -> None:
        e.readers -= 1
        if e.dropped and e.readers == 0 and e.task.done():
            self.pool.release(e.buf)

    def _release(self, e: CachedChunk) -> None:
        # never hand a buffer back while a reply may still be landing in it, nor while a read
        # that found the chunk waits on it or copies out of it (a clear() or drop() by another
        # call: a close, a truncate, a read further on): the done-callback runs a step before
        # the waiting read resumes, and another user of the pool would write into it
        e.dropped = True
        if e.readers:
            return  # the last reader gives it back (let_go)
        if e.task.done():
            self.pool.release(e.buf)
        else:
            e.task.add_done_callback(lambda _t: self._release_landed(e))

    def _release_landed(self, e: CachedChunk) -> None:
        if e.readers == 0:
            self.pool.release(e.buf)

    def __repr__(self) -> str:
        return (
            f"ReadAheadCache(chunks={self.indexes()} hits={self.hits} misses={self.misses} "
            f"fetches={self.fetches})"
        )


def _retrieve(task: asyncio.Task[int]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.debug("read-ahead fetch failed: %s", task.exception())
