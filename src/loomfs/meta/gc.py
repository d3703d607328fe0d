"""The GC worker: removes the chunks of unlinked files after a delay, and cuts the chunks of
truncated files whose trim nobody finished (one periodic loop).

An entry is due when it has waited ``delay_s`` (injected clock) and its inode has no open
write session; files still open for write are kept until closed. The remover is injected
(``loomfs.client.storage_client.StorageClient`` in the service, a fake in tests).

Write sessions are leases (``session_lease_s``): clients renew theirs (RENEW_SESSIONS), and
the worker drops sessions not renewed for a lease, so a writer that is gone (an OPEN whose
reply was lost in a meta crash, a CLOSE that never arrived, a crashed client) cannot keep an
unlinked file's chunks forever. For one lease after the worker starts nothing expires: the
clients of a meta that was down longer than a lease get the time to renew.

Orphans (``loomfs.meta.orphans``: files kept with no name while clients hold them) are dropped
when their last holder goes; an orphan whose last holder went by a path that did not drop it
is dropped by this worker's sweep, each round.

Trims (``loomfs.meta.trim``) are due at once, unless claimed by a performer that may still
be cutting (a crashed meta's claim runs out); idle ones once no write session is open. An
unlinked file's chunks are removed only once it has no trim left, so a late cut cannot leave
a chunk behind.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from typing import Protocol

from loomfs.common.clock import SYSTEM_CLOCK, Clock
from loomfs.errors import LoomError
from loomfs.meta import orphans
from loomfs.meta.store.base import MetaStore
from loomfs.meta.trim import Trimmer
from loomfs.wire.types import Layout

logger = logging.getLogger(__name__)


SESSION_LEASE_S = 60.0  # a write session not renewed this long is dropped (clients renew every third)
SESSIONS_EXPIRED_MAX = 1024  # per expiry pass


class ChunkRemover(Protocol):
    async def remove_files_chunks(self, files: list[tuple[int, Layout]]) -> None: ...


def remover_client_id(node_id: int, rng: random.Random | None = None) -> int:
    """The storage client id of one meta process's chunk remover: fresh for every process.

    Storage heads keep a cache of (client id, request id) -> result to apply retried writes
    once, and request ids restart at 1 with every process. An id that survived a restart
    made the restarted meta's first removals "retries" of the previous process's: answered
    from the cache, never applied, and their GC entries deleted (orphan chunks).
    """
    rng = rng or random.SystemRandom()
    return (1 << 62) | (rng.getrandbits(46) << 16) | (node_id & 0xFFFF)


class GcWorker:
    def __init__(
        self,
        store: MetaStore,
        remover: ChunkRemover,
        *,
        delay_s: float,
        interval_s: float = 1.0,
        batch_max: int = 256,
        files_per_s: float = 2000.0,  # removal rate cap (0 = none): GC yields to foreground work
        session_lease_s: float = 0.0,  # 0 = write sessions never expire
        clock: Clock = SYSTEM_CLOCK,
        trimmer: Trimmer | None = None,
    ):
        self.store = store
        self.trimmer = trimmer
        self.remover = remover
        self.delay_s = delay_s
        self.interval_s = interval_s
        self.batch_max = batch_max
        self.files_per_s = files_per_s
        self.session_lease_s = session_lease_s
        self.clock = clock
        self.removed_total = 0
        self.failures_total = 0
        self.sessions_expired_total = 0
        self.orphans_dropped_total = 0  # nameless files dropped once their last holder went
        self._started_ns = clock.now_ns()
        self._next_expiry_ns = self._started_ns + int(session_lease_s * 1e9)

    async def expire_sessions(self) -> int:
        """Drop write sessions not renewed for a lease (at most every lease/8, and not during
        the first lease after start). Returns how many were dropped."""
        if self.session_lease_s <= 0:
            return 0
        now = self.clock.now_ns()
        if now < self._next_expiry_ns:
            return 0
        lease_ns = int(self.session_lease_s * 1e9)
        self._next_expiry_ns = now + lease_ns // 8
        async with self.store.write() as txn:
            gone = await txn.expire_sessions(now - lease_ns, SESSIONS_EXPIRED_MAX)
            for inode in sorted({g[0] for g in gone}):  # a nameless file's last holder may be gone
                if await orphans.release_if_unheld(txn, inode, now, Layout()):
                    self.orphans_dropped_total += 1
        for inode, session_id, client_id in gone:
            logger.info("gc: write session %d of client %#x on inode %d expired (not renewed for %.0fs)",
                        session_id, client_id, inode, self.session_lease_s)
        if len(gone) == SESSIONS_EXPIRED_MAX:
            self._next_expiry_ns = now  # more to drop: next round
        self.sessions_expired_total += len(gone)
        return len(gone)

    async def drop_orphans(self) -> int:
        """Drop orphans (files kept nameless for their holders, ``loomfs.meta.orphans``) that
        have no holder left, one bounded batch: a holder ended by a call that did not drop it
        (a WRITE_INLINE that closed, a client's sessions removed at once). Returns how many."""
        async with self.store.read() as txn:
            due = await txn.orphans_unheld(self.batch_max)
        if not due:
            return 0
        dropped = 0
        async with self.store.write() as txn:
            now = self.clock.now_ns()
            for inode in due:
                if await orphans.release_if_unheld(txn, inode, now, Layout()):
                    dropped += 1
        self.orphans_dropped_total += dropped
        return dropped

    async def trim_once(self) -> int:
        """Cut one bounded batch of due trims; returns how many were settled."""
        if self.trimmer is None:
            return 0
        async with self.store.read() as txn:
            entries = await txn.trim_due(self.clock.now_ns(), self.batch_max)
        done = 0
        for e in entries:
            try:
                await self.trimmer.settle(e.inode)
            except asyncio.CancelledError:
                raise
            except (LoomError, OSError) as exc:  # the trimmer backed it off: next round
                self.failures_total += 1
                logger.warning("gc: trim of inode %d failed: %s", e.inode, exc)
                continue
            done += 1
        return done

    async def run_once(self) -> int:
        """Expire stale sessions, cut due trims, then remove one bounded batch of due
        entries; returns how many trims and removals were done."""
        await self.expire_sessions()
        await self.drop_orphans()
        trimmed = await self.trim_once()
        due_before_ns = self.clock.now_ns() - int(self.delay_s * 1e9)
        async with self.store.read() as txn:
            entries = await txn.gc_due(due_before_ns, self.batch_max)
            held = {e.inode for e in entries if await txn.trim_get(e.inode) is not None}
        batch = [e for e in entries if e.inode not in held]  # held: a cut may still be on its way
        removed = 0
        if batch:
            try:
                # one request per chain for the whole batch (one per file and chain made GC of
                # a small-file workload a quarter of a storage process)
                await self.remover.remove_files_chunks([(e.inode, e.layout) for e in batch])
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep the entries; try again after delay_s
                self.failures_total += 1
                logger.warning("gc: removing chunks of %d inodes failed: %s", len(batch), exc)
                async with self.store.write() as txn:
                    for e in batch:
                        cur = await txn.gc_get(e.inode)
                        if cur is not None:
                            await txn.gc_put(dataclasses.replace(cur, enqueued_ns=self.clock.now_ns()))
                batch = []
            async with self.store.write() as txn:
                for e in batch:
                    cur = await txn.gc_get(e.inode)
                    if cur is not None and (cur.length > e.length or cur.enqueued_ns != e.enqueued_ns):
                        continue  # a late length report, or chunks written since (a migration's
                        # copy landing after this removal): remove again next round
                    await txn.gc_delete(e.inode)
                    removed += 1
                    logger.debug("gc: removed inode %d (%d bytes)", e.inode, e.length)
            if self.files_per_s > 0 and batch:
                await asyncio.sleep(len(batch) / self.files_per_s)  # background work: bounded rate
        self.removed_total += removed
        return removed + trimmed

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
        trims = self.trimmer.trims_total if self.trimmer is not None else 0
        return (f"GcWorker(delay={self.delay_s}s removed={self.removed_total} trims={trims} "
                f"failures={self.failures_total} sessions_expired={self.sessions_expired_total} "
                f"orphans_dropped={self.orphans_dropped_total})")
