"""Storage service: RPC handlers that run the CRAQ decisions (storage.chain) on engines.

The service takes a routing *source* (``RoutingClient`` in production;
``loomfs.testing.routing.StaticRouting`` in tests) and an ``RpcClient`` for forwarding to
successors, so it needs no mgmtd to run. Forwarding lives in ``storage.forward``, the update
path (stage locally, forward, commit; leftover pending versions) in ``storage.updates``, reads in
``storage.reads``, removals and trims in ``storage.removals``, the lease gate and resync fencing
in ``storage.fencing``, retry dedupe in ``storage.dedupe``; this module is the node's service:
its state, write and truncate handlers, resync copies, chunk listings.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Awaitable, Callable

from loomfs.common.clock import SYSTEM_CLOCK, Clock
from loomfs.errors import InvalidArgument, StatusError
from loomfs.net.buffers import DEFAULT_POOL, BufferPool
from loomfs.net.rpc import CallContext, RpcClient, handles
from loomfs.storage import chain, planted
from loomfs.storage.dedupe import TagCache, pack_tags, unpack_tags
from loomfs.storage.engine.types import ChunkKey
from loomfs.storage.fencing import chain_peers_only
from loomfs.storage.foreground import ForegroundGate
from loomfs.storage.grantcheck import GrantCheck, ReadGrantCheck, dedupe_slot
from loomfs.storage.reads import ChunkReads
from loomfs.storage.removals import ChunkRemovals
from loomfs.storage.routing import RoutingSource, write_chain
from loomfs.storage.target import StorageTarget
from loomfs.storage.tenantcheck import TenantCheck
from loomfs.storage.updates import chunk_key, write_rsp
from loomfs.wire.message import Empty
from loomfs.wire.status import Status
from loomfs.wire.storage import (
    QUERY_CHUNKS,
    STORAGE_PING,
    SYNC_FLUSH,
    TRUNCATE,
    WRITE,
    ChunkId,
    ChunkMeta,
    QueryChunksReq,
    QueryChunksRsp,
    SyncFlushReq,
    TruncateReq,
    WriteReq,
    WriteRsp,
)
from loomfs.wire.types import ScrubStats, TargetInfo, TargetState

logger = logging.getLogger(__name__)

__all__ = ["StorageService", "pack_tags", "write_chain"]

_EMPTY = memoryview(b"")
REMOVE_PAGE = 1024
SYNC_FLUSH_BATCH = 1024
READ_LEASE_FRACTION = 0.8


class StorageService(ChunkReads, ChunkRemovals):
    def __init__(
        self,
        targets: list[StorageTarget],
        routing: RoutingSource,
        rpc: RpcClient,
        *,
        max_chunk_size_bytes: int = 64 << 20,
        forward_timeout_s: float = 10.0,
        pool: BufferPool = DEFAULT_POOL,
        dedupe_max: int = 8192,
        target_capacity_bytes: int = 0,
        reconfig_wait_s: float = 1.0,
        suspect_after_s: float = 5.0,
        report_unreachable: Callable[[chain.Position, int, str], Awaitable[None]] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ):
        self.clock = clock
        self.targets = {t.target_id: t for t in targets}
        self.routing = routing
        self.rpc = rpc
        self.max_chunk_size_bytes = max_chunk_size_bytes
        self.forward_timeout_s = forward_timeout_s
        self.pool = pool
        self.tags = TagCache(dedupe_max)
        self.grant_check = GrantCheck()  # chunk changes by clients need meta's write grant (server sets the key)
        self.tenant_check = TenantCheck()  # clients touch only their tenant's chunks (server sets the resolver)
        self.read_grants = ReadGrantCheck()  # clients read chunks with meta's read grant (server sets the key)
        self.forwards_total = 0
        self.reforwards_total = 0
        self.replaces_total = 0  # forwards redone as whole-chunk replaces (version gap at the successor)
        self.target_capacity_bytes = target_capacity_bytes
        self.reconfig_wait_s = reconfig_wait_s  # a forward slower than this starts watching routing
        # a successor that fails or stays silent this long although it heartbeats (a network cut,
        # a hung process) is reported to mgmtd, which takes it out of the chain
        self.suspect_after_s = suspect_after_s
        self.report_unreachable = report_unreachable
        self.unreachable_reports_total = 0
        self.corrupt_reads_total = 0  # partial reads whose block CRC did not match
        self.on_corrupt: Callable[[StorageTarget, ChunkKey], None] | None = None  # the scrubber repairs
        self.scrub_stats: Callable[[int], ScrubStats] | None = None  # the scrubber's, per target
        self.corrupt_reports_total = 0  # clients' reports of chunks that failed their CRC
        self._removing: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (target, inode) -> ranges under way
        self._reported: set[tuple[int, int, int]] = set()  # (chain, version, successor) already reported
        # writes are refused once mgmtd has not been reached for half a lease (the node may be
        # cut off and already replaced); the node's heartbeat loop pushes this forward
        self.writable_until_s = math.inf
        self.readable_until_s = math.inf
        # a storage process serves nothing before it registered and fetched the routing that
        # registration produced (a restart rejoins its chains as syncing); StorageNode clears it
        self.ready = True
        # targets mgmtd is taking out of their chains: nothing is served from them from now on
        self.revoked: set[int] = set()
        self.dedupes_total = 0  # client retries answered from the chunk's request tags
        self.repairs_total = 0  # committed versions replaced because another replica had other bytes
        # target id -> chunks with a pending version whose forward failed (pushed down again on
        # the next update or chain change)
        self._leftovers: dict[int, set[ChunkKey]] = {}
        self._gapped: dict[int, set[ChunkKey]] = {}  # see ChunkUpdates._gapped
        self._located: dict[tuple[int, int, int], int] = {}  # see ChunkUpdates._located
        self._drained = asyncio.Event()
        self.replacing: set[tuple[int, ChunkKey]] = set()
        self.foreground = ForegroundGate()  # clients' I/O in flight: background work yields to it
        # target id -> chunks a resync copied here (committed without fsync): made durable by
        # SYNC_FLUSH before the predecessor reports the resync done
        self._sync_copies: dict[int, set[ChunkKey]] = {}
        # told (from any thread) when a failed fsync takes a target out of service: the node
        # heartbeats at once so mgmtd drops it from its chain (server.StorageNode sets it)
        self.on_target_failed: Callable[[int, str], None] | None = None
        for t in targets:
            t.engine.on_failed = functools.partial(self._target_failed, t.target_id)

    def _target_failed(self, target_id: int, why: str) -> None:
        logger.critical("target %d is out of service: %s", target_id, why)
        if self.on_target_failed is not None:
            self.on_target_failed(target_id, why)

    # ---- writes -----------------------------------------------------------------------
    @handles(WRITE)
    async def write(self, req: WriteReq, ctx: CallContext) -> WriteRsp:
        payload = ctx.payload
        if req.offset < 0 or req.length != len(payload):
            raise InvalidArgument(f"write length {req.length} != payload {len(payload)} or bad offset")
        self._check_bounds(req.offset + req.length, req.chunk_size)
        if ctx.payload_crc != req.data_crc:  # the framing layer verified payload_crc already
            raise StatusError(Status.CHECKSUM_MISMATCH, "write payload does not match data_crc")
        self.check_writable()
        if req.forwarded or req.sync or req.full_replace or req.rollback or req.from_target or req.update_ver:
            chain_peers_only(ctx.identity, "write")
        inodes = [req.chunk.inode if req.chunk else 0]
        if not ctx.identity.privileged and not self.tenant_check.check(ctx.identity, inodes, "write"):
            await self.tenant_check.check_slow(ctx.identity, inodes, "write")
        self.grant_check.check(ctx.identity, req.grant, inodes)
        if req.sync:
            return await self._sync_write(req, payload)
        with self.foreground.busy():
            if req.forwarded:
                return await self._update(req, payload)
            slot = dedupe_slot(req.tag, "write", inodes[0], req.chunk.index if req.chunk else 0)
            return await self.tags.run(slot, lambda: self._update(req, payload))

    @handles(TRUNCATE)
    async def truncate(self, req: TruncateReq, ctx: CallContext) -> WriteRsp:
        self._check_bounds(req.length, req.chunk_size)
        self.check_writable()
        if req.forwarded or req.update_ver:
            chain_peers_only(ctx.identity, "truncate")
        inodes = [req.chunk.inode if req.chunk else 0]
        if not ctx.identity.privileged:
            await self.tenant_check.check_slow(ctx.identity, inodes, "truncate")
        self.grant_check.check(ctx.identity, req.grant, inodes)
        with self.foreground.busy():
            if req.forwarded:
                return await self._update(req, _EMPTY)
            slot = dedupe_slot(req.tag, "truncate", inodes[0], req.chunk.index if req.chunk else 0)
            return await self.tags.run(slot, lambda: self._update(req, _EMPTY))

    async def _sync_write(self, req: WriteReq, payload: memoryview) -> WriteRsp:
        """A resync copy at the syncing target: make the chunk exactly the sender's version.
        Fenced: the current chain version, this target SYNCING, the sender its predecessor in
        the write chain, and never older than what is committed here."""
        key = chunk_key(req.chunk)
        target, pos, routing = await self._locate(req.chain_id, req.chain_version, for_update=True)
        self._check_sync_sender(target, pos, routing, req.chain_version, req.from_target)
        with target.disk_errors():
            return await self._sync_write_at(target, key, req, payload)

    async def _sync_write_at(self, target: StorageTarget, key: ChunkKey, req: WriteReq,
                             payload: memoryview) -> WriteRsp:
        engine = target.engine
        async with target.locks.hold(key):
            target.check_in_service()
            st = engine.get(key)
            if st is not None and not st.has_pending and (st.commit_ver, st.length, st.crc) == (
                    req.update_ver, req.length, req.data_crc):
                self.replacing.discard((target.target_id, key))  # whole: an earlier try committed it
                return write_rsp(st)
            if st is not None and st.commit_ver > req.update_ver and not planted.on("unfenced_resync"):
                if not req.rollback:
                    raise StatusError(Status.VERSION_MISMATCH,
                                      f"resync copy of {key} v{req.update_ver} is older than committed v{st.commit_ver}")
                logger.error("chunk %s on target %d: committed v%d replaced by the chain's older v%d (the "
                             "serving replicas lost the newer versions)", key, target.target_id, st.commit_ver,
                             req.update_ver)
            self._check_space(target, req.length - (st.length if st else 0))
            if st is not None:
                self.replacing.add((target.target_id, key))
                await engine.remove_range(key.inode, key.index, key.index + 1)
            try:
                engine.stage_write(key, req.update_ver, 0, payload, data_crc=req.data_crc, full_replace=True,
                                   tags=unpack_tags(req.tags))
                st = await self._commit(target, key, req.update_ver)
            except BaseException:
                # a failed copy (ENOSPC, a disk error) must not leave the chunk refused for good:
                # this target is SYNCING (fenced above), serves no reads until its resync is
                # done, and the resync copies the chunk again (sim seed 150943: the mark outlived
                # the failed copy and every later read, scrub and resync of the chunk got EAGAIN)
                self.replacing.discard((target.target_id, key))
                raise
            self._sync_copies.setdefault(target.target_id, set()).add(key)
            return write_rsp(st)

    @handles(SYNC_FLUSH)
    async def sync_flush(self, req: SyncFlushReq, ctx: CallContext) -> Empty:
        """Make every resync copy received here durable (data, directory, index row), before
        the predecessor reports the resync done. Fenced like the copies themselves."""
        chain_peers_only(ctx.identity, "sync flush")
        self.check_writable()
        target, pos, routing = await self._locate(req.chain_id, req.chain_version, for_update=True)
        self._check_sync_sender(target, pos, routing, req.chain_version, req.from_target)
        keys = sorted(self._sync_copies.pop(target.target_id, set()))
        try:
            with target.disk_errors():
                for i in range(0, len(keys), SYNC_FLUSH_BATCH):  # one group commit per batch
                    await asyncio.gather(*(target.engine.make_durable(k) for k in keys[i:i + SYNC_FLUSH_BATCH]))
        except BaseException:
            self._sync_copies.setdefault(target.target_id, set()).update(keys)
            raise
        return Empty()

    @handles(QUERY_CHUNKS)
    async def query_chunks(self, req: QueryChunksReq, ctx: CallContext) -> QueryChunksRsp:
        if not ctx.identity.privileged:  # a client lists one inode's chunks, of its own tenant
            if not req.inode:
                raise StatusError(Status.EACCES, "listing every chunk of a target needs ADMIN")
            await self.tenant_check.check_slow(ctx.identity, (req.inode,), "chunk listing")
        target = self.targets.get(req.target_id) if req.target_id else next(iter(self.targets.values()), None)
        if target is None:
            raise StatusError(Status.UNKNOWN_TARGET, f"target {req.target_id} is not on this node")
        target.check_in_service()
        limit = max(0, min(req.limit, 100_000))
        after = ChunkKey(req.after.inode, req.after.index) if req.after is not None and not req.inode else None
        states = target.engine.list_chunks(req.inode, req.index_begin, req.index_end, limit + 1, after=after)
        # a client (which needs no read grant here) learns which chunks exist, their lengths and
        # versions (a writer's fenced trim), not their CRC32C (a checksum of bytes it may not
        # read) nor their writers' client ids (security hunt 16); services and admins see all
        full = ctx.identity.privileged
        metas = [
            ChunkMeta(chunk=ChunkId(inode=s.key.inode, index=s.key.index), commit_ver=s.commit_ver,
                      update_ver=s.pending_ver, length=s.length, crc=s.crc if full else 0,
                      tags=pack_tags(s.tags) if full else [])
            for s in states[:limit]
        ]
        return QueryChunksRsp(chunks=metas, more=len(states) > limit)

    @handles(STORAGE_PING)
    async def ping(self, req: Empty, ctx: CallContext) -> Empty:
        return Empty()

    # ---- reporting --------------------------------------------------------------------
    def target_infos(self, node_id: int) -> list[TargetInfo]:
        out = []
        for t in self.targets.values():
            u = t.engine.usage()
            scrub = self.scrub_stats(t.target_id) if self.scrub_stats is not None else ScrubStats()
            # a failed target says so (mgmtd takes it out of its chain at once)
            state = TargetState.OFFLINE if t.failed else TargetState.SERVING
            out.append(TargetInfo(target_id=t.target_id, node_id=node_id, path=t.path, used_bytes=u.used_bytes,
                                  capacity_bytes=u.capacity_bytes, chunk_count=u.chunk_count, disk_id=t.disk_id,
                                  scrub=scrub, state=state, verified=t.engine.verified))
        return out

    def __repr__(self) -> str:
        return (f"StorageService(targets={sorted(self.targets)} forwards={self.forwards_total} "
                f"reforwards={self.reforwards_total} {self.tags!r})")
