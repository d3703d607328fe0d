"""Write-back pieces: a client-wide byte budget for in-flight flushes and the per-chunk buffer."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from loomfs.net.buffers import Buffer


class ByteBudget:
    """Bounds the bytes of dirty data in flight; ``acquire`` waits when over the bound.

    A request larger than the whole budget is let through when nothing else is held, so
    one huge chunk can never deadlock.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.used_bytes = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self.waits = 0

    def _fits(self, n: int) -> bool:
        return self.used_bytes == 0 or self.used_bytes + n <= self.max_bytes

    async def acquire(self, n: int) -> None:
        if not self._waiters and self._fits(n):
            self.used_bytes += n
            return
        self.waits += 1
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((n, fut))
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release(n)  # granted, then cancelled before we could use it
            else:
                try:
                    self._waiters.remove((n, fut))
                except ValueError:
                    pass
                self._wake()
            raise

    def release(self, n: int) -> None:
        self.used_bytes -= n
        assert self.used_bytes >= 0, self.used_bytes
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            n, fut = self._waiters[0]
            if fut.done():
                self._waiters.popleft()
                continue
            if not self._fits(n):
                break
            self._waiters.popleft()
            self.used_bytes += n
            fut.set_result(None)

    def __repr__(self) -> str:
        return f"ByteBudget(used={self.used_bytes}/{self.max_bytes} waiting={len(self._waiters)})"


@dataclass(slots=True)
class ChunkBuffer:
    """A pooled chunk-sized buffer holding the dirty range [start, end) of chunk ``index``."""

    index: int
    buf: Buffer
    start: int
    end: int

    @property
    def dirty_bytes(self) -> int:
        return self.end - self.start
