"""Operations in flight per client file, so that a file a lock's revalidation swapped out
(``loomfs.mount.revalidate``) is closed only once the reads that had it in hand are done.

A READ takes ``h.file`` when it starts; with ``loop=separate`` its ``pread`` runs on the
client's loop after a hop, and a prefetch fetch starts a loop step later still. Closing the
old file at the swap would let such a read find it closed (``ValueError``), or start a
read-ahead on its emptied cache that nothing ever waits for. Write files need no count:
every use of one holds the file's lock, as the swap does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from loomfs.client.file import AsyncFile

logger = logging.getLogger(__name__)


class FileUses:
    def __init__(self, close: Callable[[AsyncFile], Coroutine[Any, Any, None]]):
        self._close = close  # LoomOperations: the file's close on the client's loop
        self._count: dict[AsyncFile, int] = {}
        self._retired: set[AsyncFile] = set()
        self._closing: set[asyncio.Task[None]] = set()
        self._ended: asyncio.Future[None] | None = None  # drain() waiting for a retired file's last use
        self.deferred_closes = 0  # files closed by their last use, not at the swap

    def begin(self, f: AsyncFile) -> None:
        self._count[f] = self._count.get(f, 0) + 1

    def end(self, f: AsyncFile) -> None:
        n = self._count[f] - 1
        if n:
            self._count[f] = n
            return
        del self._count[f]
        if f in self._retired:
            self._retired.discard(f)
            self.deferred_closes += 1
            task = asyncio.get_running_loop().create_task(self._close_quietly(f))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
            if self._ended is not None and not self._ended.done():
                self._ended.set_result(None)

    def in_use(self, f: AsyncFile) -> int:
        return self._count.get(f, 0)

    async def retire(self, f: AsyncFile) -> None:
        """``f`` is no handle's file any more: closed now when nothing uses it, else by the
        end of its last use."""
        if f in self._count:
            self._retired.add(f)
        else:
            await self._close(f)

    async def drain(self) -> None:
        """Every file retired so far is closed (at unmount: after its last read ended)."""
        while self._retired or self._closing:
            if self._closing:
                await asyncio.wait(list(self._closing))
            else:
                self._ended = asyncio.get_running_loop().create_future()
                await self._ended

    async def _close_quietly(self, f: AsyncFile) -> None:
        try:
            await self._close(f)
        except (OSError, ValueError) as exc:
            logger.warning("closing %s after its last read: %s", f.path, exc)
