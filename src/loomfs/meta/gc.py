"""The GC worker: removes the chunks of unlinked files after a delay (one periodic loop).

An entry is due when it has waited ``delay_s`` (injected clock) and its inode has no open
write session; files still open for write are kept until closed. The remover is injected
(``loomfs.client.storage_client.StorageClient`` in the service, a fake in tests).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Protocol

from loomfs.common.clock import SYSTEM_CLOCK, Clock
from loomfs.meta.store.base import MetaStore
from loomfs.wire.types import Layout

logger = logging.getLogger(__name__)


class ChunkRemover(Protocol):
    async def remove_file_chunks(self, inode: int, layout: Layout, length: int) -> None: ...


class GcWorker:
    def __init__(
        self,
        store: MetaStore,
        remover: ChunkRemover,
        *,
        delay_s: float,
        interval_s: float = 1.0,
        batch_max: int = 64,
        clock: Clock = SYSTEM_CLOCK,
    ):
        self.store = store
        self.remover = remover
        self.delay_s = delay_s
        self.interval_s = interval_s
        self.batch_max = batch_max
        self.clock = clock
        self.removed_total = 0
        self.failures_total = 0

    async def run_once(self) -> int:
        """Process one bounded batch of due entries; returns how many were removed."""
        due_before_ns = self.clock.now_ns() - int(self.delay_s * 1e9)
        async with self.store.read() as txn:
            entries = await txn.gc_due(due_before_ns, self.batch_max)
        removed = 0
        for e in entries:
            try:
                await self.remover.remove_file_chunks(e.inode, e.layout, e.length)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep the entry; try again next round
                self.failures_total += 1
                logger.warning("gc: removing chunks of inode %d failed: %s", e.inode, exc)
                async with self.store.write() as txn:  # back off: due again after delay_s
                    cur = await txn.gc_get(e.inode)
                    if cur is not None:
                        await txn.gc_put(dataclasses.replace(cur, enqueued_ns=self.clock.now_ns()))
                continue
            async with self.store.write() as txn:
                cur = await txn.gc_get(e.inode)
                if cur is not None and cur.length > e.length:
                    continue  # a late length report arrived meanwhile: remove again next round
                await txn.gc_delete(e.inode)
            removed += 1
            logger.debug("gc: removed inode %d (%d bytes)", e.inode, e.length)
        self.removed_total += removed
        return removed

    async def run(self) -> None:
        """Forever: a batch, then sleep ``interval_s`` (immediately again if the batch was full)."""
        while True:
            try:
                n = await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("gc round failed")
                n = 0
            if n < self.batch_max:
                await asyncio.sleep(self.interval_s)
            else:
                await asyncio.sleep(0)

    def __repr__(self) -> str:
        return f"GcWorker(delay={self.delay_s}s removed={self.removed_total} failures={self.failures_total})"
