"""Background work yields to foreground I/O: scrubbing and GC removals wait (a bounded time)
while clients' reads and writes are in flight on the node, so they take idle time first."""

from __future__ import annotations

import asyncio
import contextlib


class ForegroundGate:
    def __init__(self) -> None:
        self.inflight = 0
        self._idle: asyncio.Event | None = None  # made on first use (inside the loop)
        self.waits_total = 0  # times background work found foreground I/O and waited

    def busy(self) -> ForegroundGate:
        """Around a client's read or write: ``with gate.busy():`` (the gate is its own context
        manager, re-entrant by its count: no generator per request on the I/O path)."""
        return self

    def __enter__(self) -> None:
        self.inflight += 1
        if self._idle is not None:
            self._idle.clear()

    def __exit__(self, *exc: object) -> None:
        self.inflight -= 1
        if self.inflight == 0 and self._idle is not None:
            self._idle.set()

    async def quiet(self, max_wait_s: float) -> None:
        """Return when no foreground I/O is in flight, or after ``max_wait_s`` (background work
        is slowed, never starved)."""
        if self.inflight == 0:
            return
        if self._idle is None:
            self._idle = asyncio.Event()
        self.waits_total += 1
        # asyncio.timeout, not wait_for: on 3.11 wait_for returns normally when its inner wait
        # finishes in the same step as a cancel of the caller, so the cancel is lost (a crashed
        # node's scrubber woke from the gate as the client handlers it was waiting on were
        # cancelled, and lived on: simulator seed 218556)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max_wait_s):
                await self._idle.wait()
