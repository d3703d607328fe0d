"""Online resync: the predecessor of a SYNCING target copies what the target is missing.

When mgmtd marks a returning (or spare) target SYNCING it sits at the write tail of its
chain, so every new update reaches it; its predecessor (the last serving member) then walks
the union of its own chunks and the target's chunk dump (QUERY_CHUNKS) and, under each
chunk's lock (so it serialises with writes passing through), sends the committed chunk as a
``sync`` whole-chunk replace when versions differ, or removes chunks the chain no longer has.
Every ``SYNC_FLUSH_EVERY`` copies and at the end it asks the target to make the copies it received
durable (SYNC_FLUSH: resync copies commit without fsync), then reports done; mgmtd makes the target SERVING. Progress (chunks and bytes left)
goes to mgmtd every ``report_interval_s`` and shows in ``loomfs admin targets``.

A chain change cancels the worker; the next routing check starts a fresh one for the new
chain version (comparing again skips what is already equal).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass

import crc32c

from loomfs.common.retry import Backoff
from loomfs.common.routing import Routing
from loomfs.errors import LoomError, StatusError
from loomfs.storage import chain, planted
from loomfs.storage.dedupe import pack_tags
from loomfs.storage.engine.types import ChunkKey, ChunkState
from loomfs.storage.target import StorageTarget
from loomfs.wire.mgmtd import SyncReportReq
from loomfs.wire.status import Status
from loomfs.wire.storage import (
    QUERY_CHUNKS,
    REMOVE_CHUNKS,
    SYNC_FLUSH,
    WRITE,
    ChunkId,
    ChunkMeta,
    QueryChunksReq,
    RemoveChunksReq,
    SyncFlushReq,
    WriteReq,
)
from loomfs.wire.types import TargetState

logger = logging.getLogger(__name__)

Reporter = Callable[[SyncReportReq], Awaitable[bool]]
PAGE_CHUNKS = 10_000
REPORT_BACKOFF = Backoff(0.1, 0.5)
SYNC_FLUSH_TIMEOUT_S = 60.0  # the target flushes the copies since the last flush (group-committed)
SYNC_FLUSH_EVERY = 256  # copies between two SYNC_FLUSH calls (and one at the end): each stays short  # a progress report mgmtd did not answer is sent again


@dataclass(frozen=True, slots=True)
class SyncJob:
    chain_id: int
    chain_version: int
    source: int  # local target (the predecessor)
    dest: int  # the syncing target


def sync_jobs(routing: Routing, local_targets: set[int]) -> list[SyncJob]:
    """Which resyncs this node must run: for each chain whose write tail is SYNCING, the last
    serving member copies to it, if that member is one of ours."""
    jobs = []
    for c in routing.chains.values():
        states = [(t, routing.targets[t].state) for t in c.targets if t in routing.targets]
        serving = [t for t, s in states if s == TargetState.SERVING]
        syncing = [t for t, s in states if s == TargetState.SYNCING]
        if serving and syncing and serving[-1] in local_targets:
            jobs.append(SyncJob(c.chain_id, c.version, serving[-1], syncing[0]))
    return jobs


class Resyncer:
    """Runs one worker per SyncJob; ``update(routing)`` starts and cancels them."""

    def __init__(self, service: object, report: Reporter, *, bytes_per_s: int = 0,
                 report_interval_s: float = 0.5, page_chunks: int = PAGE_CHUNKS):
        from loomfs.storage.service import StorageService

        assert isinstance(service, StorageService)
        self.service = service
        self.report = report
        self.bytes_per_s = bytes_per_s
        self.report_interval_s = report_interval_s
        self.page_chunks = page_chunks
        self._tasks: dict[SyncJob, asyncio.Task[None]] = {}
        self.chunks_copied = 0
        self.chunks_removed = 0
        self.bytes_copied = 0
        self.done_total = 0

    def update(self, routing: Routing) -> None:
        jobs = set(sync_jobs(routing, set(self.service.targets)))
        me = asyncio.current_task()
        for job, task in list(self._tasks.items()):
            if task is me:
                continue  # a worker reporting done sees its own job vanish: it ends by itself
            if job not in jobs or task.done():
                if not task.done():
                    logger.info("resync %s: chain changed, stopping", job)
                    task.cancel()
                if job not in jobs:
                    del self._tasks[job]
        for job in jobs:
            if job not in self._tasks:
                self._tasks[job] = asyncio.ensure_future(self._run(job, routing))

    @property
    def active(self) -> int:
        return sum(1 for t in self._tasks.values() if not t.done())

    async def close(self) -> None:
        for t in self._tasks.values():
            t.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self._tasks.clear()

    async def _run(self, job: SyncJob, routing: Routing) -> None:
        started = self.service.clock.monotonic()
        try:
            copied = await self._sync(job, routing)
        except asyncio.CancelledError:
            raise
        except (LoomError, OSError) as exc:
            logger.warning("resync %s failed (retried on the next routing check): %s", job, exc)
            await asyncio.sleep(0.5)
            self._tasks.pop(job, None)
            return
        except Exception:
            logger.exception("resync %s crashed", job)
            await asyncio.sleep(0.5)
            self._tasks.pop(job, None)
            return
        self.done_total += 1
        logger.info("resync %s done in %.2fs: %d chunks copied", job, self.service.clock.monotonic() - started, copied)

    async def _remote_pages(self, job: SyncJob, routing: Routing) -> AsyncIterator[list[ChunkMeta]]:
        """The syncing target's chunk list, page by page, in (inode, index) order."""
        after: ChunkId | None = None
        while True:
            req = QueryChunksReq(target_id=job.dest, limit=self.page_chunks, after=after)
            try:
                rsp = await self.service.rpc.call(routing.address_of(job.dest), QUERY_CHUNKS, req,
                                                  timeout_s=self.service.forward_timeout_s)
            except LoomError as exc:
                if exc.status is None or exc.status is Status.DEADLINE_EXCEEDED:
                    self._suspect(job, routing, f"chunk dump failed: {exc}")
                raise
            page = [m for m in rsp.body.chunks if m.chunk is not None]
            yield page
            if not rsp.body.more or not page:
                return
            last = page[-1].chunk
            assert last is not None
            after = ChunkId(inode=last.inode, index=last.index)

    def _local_pages(self, target: StorageTarget) -> Iterator[list[ChunkState]]:
        after: ChunkKey | None = None
        while True:
            page = target.engine.list_chunks(0, limit=self.page_chunks, after=after)
            committed = [s for s in page if s.commit_ver]
            if committed:
                yield committed
            if len(page) < self.page_chunks:
                return
            after = page[-1].key

    def _suspect(self, job: SyncJob, routing: Routing, why: str) -> None:
        members = [t for t in routing.chain(job.chain_id).targets if t in routing.targets
                   and routing.targets[t].state in (TargetState.SERVING, TargetState.SYNCING)]
        pos = chain.position_of(job.chain_id, job.chain_version, members, job.source) \
            if job.source in members else None
        if pos is not None:
            self.service.suspect(pos, job.dest, why)

    async def _sync(self, job: SyncJob, routing: Routing) -> int:
        """Merge-walk our chunks and the target's, both paged in key order, so a target with
        millions of chunks never needs both lists in memory."""
        target = self.service.targets[job.source]
        await self.service.updates_drained(job.source, job.chain_id, job.chain_version)
        usage = target.engine.usage()
        chunks_left, bytes_left = usage.chunk_count, usage.used_bytes
        last_report = 0.0
        copied = flushed_at = 0
        local_iter = self._local_pages(target)
        remote_iter = self._remote_pages(job, routing).__aiter__()
        local: list[ChunkState] = next(local_iter, [])
        remote: list[ChunkMeta] = await anext(remote_iter, [])
        li = ri = 0
        while True:
            if li == len(local) and local:
                local, li = next(local_iter, []), 0
            if ri == len(remote) and remote:
                remote, ri = await anext(remote_iter, []), 0
            lk = local[li].key if li < len(local) else None
            rm = remote[ri] if ri < len(remote) else None
            rk = ChunkKey(rm.chunk.inode, rm.chunk.index) if rm is not None and rm.chunk is not None else None
            if lk is None and rk is None:
                break
            key = lk if rk is None or (lk is not None and lk <= rk) else rk
            assert key is not None
            mine = local[li] if lk == key else None
            theirs = rm if rk == key else None
            li += mine is not None
            ri += theirs is not None
            now = self.service.clock.monotonic()
            if now - last_report >= self.report_interval_s:
                last_report = now
                if not await self._report(job, chunks_left, bytes_left, done=False):
                    raise StatusError(Status.STALE_CHAIN_VERSION, "mgmtd refused the progress report")
            try:
                sent = await self._sync_chunk(job, routing, target, key, theirs)
            except LoomError as exc:
                if exc.status is None or exc.status is Status.DEADLINE_EXCEEDED:
                    self._suspect(job, routing, f"sync write failed: {exc}")
                raise
            copied += sent > 0
            if copied - flushed_at >= SYNC_FLUSH_EVERY:  # bounded flushes (one per this many copies)
                await self._flush_dest(job, routing)
                flushed_at = copied
            if mine is not None:
                chunks_left = max(0, chunks_left - 1)
                bytes_left = max(0, bytes_left - mine.length)
            if self.bytes_per_s and sent:
                await asyncio.sleep(sent / self.bytes_per_s)
        await self._flush_dest(job, routing)  # the copies on the target's disk before it serves
        if not await self._report(job, 0, 0, done=True):
            raise StatusError(Status.STALE_CHAIN_VERSION, "mgmtd refused the sync-done report")
        return copied

    async def _flush_dest(self, job: SyncJob, routing: Routing) -> None:
        """Ask the syncing target to make the copies it received so far durable (SYNC_FLUSH)."""
        await self._check_source(job)
        flush = SyncFlushReq(chain_id=job.chain_id, chain_version=job.chain_version, from_target=job.source)
        try:
            await self.service.rpc.call(routing.address_of(job.dest), SYNC_FLUSH, flush,
                                        timeout_s=max(self.service.forward_timeout_s, SYNC_FLUSH_TIMEOUT_S))
        except LoomError as exc:
            if exc.status is None or exc.status is Status.DEADLINE_EXCEEDED:
                self._suspect(job, routing, f"sync flush failed: {exc}")
            raise

    async def _report(self, job: SyncJob, chunks_left: int, bytes_left: int, *, done: bool) -> bool:
        req = SyncReportReq(target_id=job.dest, chain_id=job.chain_id, chain_version=job.chain_version,
                            chunks_left=chunks_left, bytes_left=bytes_left, done=done)
        for attempt in range(20):
            try:
                return await self.report(req)
            except (LoomError, OSError) as exc:
                logger.debug("sync report failed (attempt %d): %s", attempt, exc)
                await asyncio.sleep(REPORT_BACKOFF.delay_s(attempt))
        return False

    async def _check_source(self, job: SyncJob) -> None:
        """Before each copy: this node still holds its lease, and the routing it has still
        names this job (a worker mgmtd has replaced must not copy anything)."""
        svc = self.service
        if planted.on("unfenced_resync"):
            return
        svc.check_writable()
        svc.targets[job.source].check_in_service()
        if job not in sync_jobs(await svc.routing.get(), {job.source}):
            raise StatusError(Status.STALE_CHAIN_VERSION, f"resync {job}: the chain changed")

    async def _sync_chunk(self, job: SyncJob, routing: Routing, target: StorageTarget, key: ChunkKey,
                          remote: ChunkMeta | None) -> int:
        """Make ``dest``'s copy of ``key`` equal ours; returns bytes sent (0: nothing to do)."""
        svc = self.service
        address = routing.address_of(job.dest)
        async with target.locks.hold(key):
            await self._check_source(job)
            st = None if svc.being_removed(job.source, key) else target.engine.get(key)
            if st is None or st.commit_ver == 0:
                if remote is not None:
                    rm = RemoveChunksReq(chain_id=job.chain_id, chain_version=job.chain_version, inode=key.inode,
                                         index_begin=key.index, index_end=key.index + 1, forwarded=True,
                                         sync=True, from_target=job.source)
                    await svc.rpc.call(address, REMOVE_CHUNKS, rm, timeout_s=svc.forward_timeout_s)
                    self.chunks_removed += 1
                return 0
            rollback = False
            if remote is not None and remote.commit_ver > st.commit_ver:
                if st.has_pending and (st.pending_ver, st.pending_length, st.pending_crc) == (
                        remote.commit_ver, remote.length, remote.crc):
                    return 0  # it committed our leftover (its ack was lost): the leftover settles
                # the syncing target committed versions the serving chain does not have: the
                # serving replicas lost them (every replica crashed with them unsynced, and the
                # one mgmtd kept as last serving was behind). The serving chain is what clients
                # have been acked and served since: the target goes back to its version (a
                # leftover of ours then follows on top). Taking the target's copy instead could
                # replace a write acked since under a reused number.
                logger.error("resync %s: chunk %s v%d on the target is newer than ours (v%d, pending v%d): "
                             "replacing it (the serving replicas lost those versions)", job, key, remote.commit_ver,
                             st.commit_ver, st.pending_ver if st.has_pending else 0)
                rollback = True
            if remote is not None and remote.update_ver <= remote.commit_ver and (
                    remote.commit_ver, remote.length, remote.crc, remote.tags) == (
                    st.commit_ver, st.length, st.crc, pack_tags(st.tags)):
                return 0  # equal content and equal retry-dedupe state
            buf = svc.pool.acquire(max(1, st.length))
            try:
                mv = memoryview(buf)[: st.length]
                n = await target.engine.aread(key, 0, mv)  # off the event loop (file engine)
                st2 = target.engine.get(key)
                if st2 is None or (st2.commit_ver, st2.crc) != (st.commit_ver, st.crc):
                    raise StatusError(Status.VERSION_MISMATCH, f"chunk {key} changed while it was read for resync")
                if n != st.length or crc32c.crc32c(mv[:n]) != st.crc:
                    # our copy rotted: the scrubber repairs it (from any member holding this
                    # version, the syncing one included) once we let go of the lock; the
                    # worker retries on the next routing check
                    if svc.on_corrupt is not None:
                        svc.on_corrupt(target, key)
                    raise StatusError(Status.CHECKSUM_MISMATCH, f"chunk {key} v{st.commit_ver} on target "
                                      f"{job.source} is corrupt: repairing before it is copied")
                req = WriteReq(chain_id=job.chain_id, chain_version=job.chain_version,
                               chunk=ChunkId(inode=key.inode, index=key.index), offset=0, length=n,
                               chunk_size=max(n, 1), data_crc=st.crc, forwarded=True, update_ver=st.commit_ver,
                               full_replace=True, sync=True, tags=pack_tags(st.tags), from_target=job.source,
                               rollback=rollback)
                await svc.rpc.call(address, WRITE, req, payload=mv[:n], payload_crc=st.crc,
                                   timeout_s=svc.forward_timeout_s)
            finally:
                svc.pool.release(buf)
            self.chunks_copied += 1
            self.bytes_copied += n
            return max(1, n)

    def __repr__(self) -> str:
        return (f"Resyncer(active={self.active} copied={self.chunks_copied} removed={self.chunks_removed} "
                f"bytes={self.bytes_copied} done={self.done_total})")
