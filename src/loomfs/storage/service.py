"""Storage service: RPC handlers that run the CRAQ decisions (storage.chain) on engines.

The service takes a routing *source* (``RoutingClient`` in production; ``StaticRouting`` in
tests) and an ``RpcClient`` for forwarding to successors, so it needs no mgmtd to run.
Forwarding lives in ``storage.forward``, the update path (stage locally, forward, commit;
leftover pending versions) in ``storage.updates``, retry dedupe in ``storage.dedupe``; this
module is the RPC surface: routing checks and leases, writes, resync copies, removals, reads.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Awaitable, Callable, Iterator

from loomfs.common.clock import SYSTEM_CLOCK, Clock
from loomfs.common.routing import Routing
from loomfs.errors import InvalidArgument, StatusError
from loomfs.net.buffers import DEFAULT_POOL, BufferPool
from loomfs.net.rpc import CallContext, Reply, RpcClient, handles
from loomfs.storage import chain, planted
from loomfs.storage.dedupe import TagCache, pack_tags, unpack_tags
from loomfs.storage.engine.types import ChunkKey, ChunkState
from loomfs.storage.routing import RoutingSource, StaticRouting, write_chain
from loomfs.storage.target import StorageTarget
from loomfs.storage.updates import CHUNK_SIZE_ANY, ChunkUpdates, chunk_key, versions_of, write_rsp
from loomfs.wire.message import Empty
from loomfs.wire.status import Status
from loomfs.wire.storage import (
    QUERY_CHUNKS,
    READ,
    REMOVE_CHUNKS,
    REPORT_CORRUPT,
    STORAGE_PING,
    TRUNCATE,
    WRITE,
    ChunkId,
    ChunkMeta,
    QueryChunksReq,
    QueryChunksRsp,
    ReadReq,
    ReadRsp,
    RemoveChunksReq,
    RemoveChunksRsp,
    ReportCorruptReq,
    TruncateReq,
    WriteReq,
    WriteRsp,
)
from loomfs.wire.types import ScrubStats, TargetInfo, TargetState

logger = logging.getLogger(__name__)

__all__ = ["StaticRouting", "StorageService", "pack_tags", "write_chain"]

_EMPTY = memoryview(b"")
REMOVE_PAGE = 1024
READ_LEASE_FRACTION = 0.8


def _chunks_of(target: StorageTarget, req: RemoveChunksReq) -> Iterator[ChunkState]:
    """The target's chunks in the request's range, listed a page at a time (a huge file is
    never listed whole; each page is listed after the previous one was handled)."""
    after: ChunkKey | None = None
    while True:
        page = target.engine.list_chunks(req.inode, req.index_begin, req.index_end, REMOVE_PAGE, after=after)
        yield from page
        if len(page) < REMOVE_PAGE:
            return
        after = page[-1].key


class StorageService(ChunkUpdates):
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
        self._removing: list[tuple[int, int, int, int]] = []  # (target, inode, begin, end) under way
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
        self.replacing: set[tuple[int, ChunkKey]] = set()

    # ---- routing ----------------------------------------------------------------------
    def check_writable(self) -> None:
        self.check_ready()
        if self.clock.monotonic() > self.writable_until_s:
            raise StatusError(Status.TARGET_NOT_SERVING, "storage node lost mgmtd for half a lease: not writable")

    def check_readable(self) -> None:
        """Reads stop once the lease lapsed: mgmtd may have given the chain a new tail that
        commits versions this replica never sees."""
        self.check_ready()
        if self.clock.monotonic() > self.readable_until_s and not planted.on("reads_ignore_lease"):
            raise StatusError(Status.TARGET_NOT_SERVING, "storage node's lease lapsed: not readable")

    def check_ready(self) -> None:
        if not self.ready and not planted.on("reads_ignore_lease"):
            raise StatusError(Status.TARGET_NOT_SERVING, "storage node has not registered with mgmtd yet")

    def lease_granted(self, sent_s: float, lease_s: float) -> None:
        """mgmtd answered a registration/heartbeat sent at ``sent_s``: writes are allowed for
        half the lease, reads for ``READ_LEASE_FRACTION`` of it (mgmtd counts from later)."""
        self.writable_until_s = sent_s + lease_s / 2
        self.readable_until_s = sent_s + lease_s * READ_LEASE_FRACTION

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
        if req.sync:
            return await self._sync_write(req, payload)
        if req.forwarded:
            return await self._update(req, payload)
        return await self.tags.run(req.tag, lambda: self._update(req, payload))

    @handles(TRUNCATE)
    async def truncate(self, req: TruncateReq, ctx: CallContext) -> WriteRsp:
        self._check_bounds(req.length, req.chunk_size)
        self.check_writable()
        if req.forwarded:
            return await self._update(req, _EMPTY)
        return await self.tags.run(req.tag, lambda: self._update(req, _EMPTY))

    async def _sync_write(self, req: WriteReq, payload: memoryview) -> WriteRsp:
        """A resync copy at the syncing target: make the chunk exactly the sender's version.
        Fenced: the current chain version, this target SYNCING, the sender its predecessor in
        the write chain, and never older than what is committed here."""
        key = chunk_key(req.chunk)
        target, pos, routing = await self._locate(req.chain_id, req.chain_version, for_update=True)
        self._check_sync_sender(target, pos, routing, req.chain_version, req.from_target)
        engine = target.engine
        async with target.locks.hold(key):
            st = engine.get(key)
            if st is not None and not st.has_pending and (st.commit_ver, st.length, st.crc) == (
                    req.update_ver, req.length, req.data_crc):
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
            engine.stage_write(key, req.update_ver, 0, payload, data_crc=req.data_crc, full_replace=True,
                               tags=unpack_tags(req.tags))
            return write_rsp(await self._commit(target, key, req.update_ver))

    def _check_sync_sender(self, target: StorageTarget, pos: chain.Position | None, routing: Routing,
                           chain_version: int, sender: int) -> None:
        if planted.on("unfenced_resync"):
            return
        if pos is None or chain_version != pos.chain_version:
            raise StatusError(Status.STALE_CHAIN_VERSION,
                              f"resync copy for chain v{chain_version}, target {target.target_id} is at "
                              f"v{pos.chain_version if pos else '-'}")
        ti = routing.targets.get(target.target_id)
        if ti is None or ti.state != TargetState.SYNCING:
            raise StatusError(Status.TARGET_NOT_SERVING, f"target {target.target_id} is not syncing")
        if pos.predecessor != sender:
            raise StatusError(Status.TARGET_NOT_SERVING,
                              f"resync copy from target {sender}, the predecessor is {pos.predecessor}")

    @handles(REMOVE_CHUNKS)
    async def remove_chunks(self, req: RemoveChunksReq, ctx: CallContext) -> RemoveChunksRsp:
        if req.forwarded:
            return await self._remove(req)
        return await self.tags.run(req.tag, lambda: self._remove(req))

    async def _remove(self, req: RemoveChunksReq) -> RemoveChunksRsp:
        """Remove a range of chunks: forwarded first, then removed here (the tail removes
        first, as commits flow), each chunk under its lock so no update interleaves."""
        if req.index_begin < 0 or req.index_end < req.index_begin:
            raise InvalidArgument(f"bad index range [{req.index_begin}, {req.index_end})")
        self.check_writable()
        if req.keep_versions:
            return await self._trim(req)
        target, pos, routing = await self._locate(req.chain_id, req.chain_version, for_update=True)
        if req.sync:
            self._check_sync_sender(target, pos, routing, req.chain_version, req.from_target)
        action = chain.on_remove(pos, chain.UpdateIn(req.chain_version, req.forwarded))[0]
        if isinstance(action, chain.Refuse):
            raise StatusError(action.status, action.reason)
        assert isinstance(action, chain.Apply) and pos is not None
        span = (target.target_id, req.inode, req.index_begin, req.index_end)
        self._removing.append(span)  # a resync copy of these chunks from now on removes instead
        try:
            if action.successor is not None:
                # a resync copy already under way finishes before the removal goes down the
                # chain (else it could land on a syncing successor after the removal did)
                for st in _chunks_of(target, req):
                    async with target.locks.hold(st.key):
                        pass
                status, _ = await self._forward_chain(pos, REMOVE_CHUNKS, req, None, None)
                outcome = chain.on_successor_result(0, status)
                if isinstance(outcome, chain.Refuse):
                    raise StatusError(outcome.status, outcome.reason)
            removed = 0
            for st in _chunks_of(target, req):
                async with target.locks.hold(st.key):
                    removed += await target.engine.remove_range(st.key.inode, st.key.index, st.key.index + 1)
                    left = self._leftovers.get(target.target_id)
                    if left is not None:
                        left.discard(st.key)
        finally:
            self._removing.remove(span)
        return RemoveChunksRsp(removed=removed)

    def being_removed(self, target_id: int, key: ChunkKey) -> bool:
        """Whether a REMOVE_CHUNKS covering ``key`` is under way on ``target_id``: a resync
        treats the chunk as gone (it is, or will be, on every member)."""
        return any(t == target_id and inode == key.inode and begin <= key.index < end
                   for t, inode, begin, end in self._removing)

    async def _trim(self, req: RemoveChunksReq) -> RemoveChunksRsp:
        """A trim of a live file at the head: every chunk of the range that still holds bytes
        (or a pending version) becomes an empty new version, a truncate to 0 run through the
        chain like any update. Chunks are not removed: after a remove their version numbers
        would start again at 1 when the file grows back, and a replica that missed the remove
        (offline, fenced, being resynced) would hold other bytes under the same numbers."""
        if req.forwarded:
            raise InvalidArgument("a trim (keep_versions) is only sent to the head")
        target, pos, _ = await self._locate(req.chain_id, req.chain_version, for_update=True)
        action = chain.on_remove(pos, chain.UpdateIn(req.chain_version))[0]
        if isinstance(action, chain.Refuse):
            raise StatusError(action.status, action.reason)
        if len(req.expect_vers) % 2 or any(v < 0 for v in req.expect_vers):
            raise InvalidArgument(f"trim expects (index, version) pairs of non-negative numbers, got "
                                  f"{len(req.expect_vers)} numbers")
        expect = dict(zip(req.expect_vers[::2], req.expect_vers[1::2], strict=True)) if req.fenced else {}
        trimmed = 0
        refused: list[int] = []
        for st in _chunks_of(target, req):
            if st.length or st.has_pending:
                cut = TruncateReq(chain_id=req.chain_id, chain_version=req.chain_version,
                                  chunk=ChunkId(inode=st.key.inode, index=st.key.index), length=0,
                                  chunk_size=CHUNK_SIZE_ANY,
                                  if_ver_le=expect.get(st.key.index, 0) if req.fenced else -1)
                try:
                    await self._update(cut, _EMPTY)
                except StatusError as exc:
                    if exc.status is not Status.VERSION_MISMATCH or not req.fenced:
                        raise
                    refused.append(st.key.index)
                    continue
                trimmed += 1
        if refused:
            raise StatusError(Status.VERSION_MISMATCH, f"trim of inode {req.inode}: chunks {refused[:8]} were "
                              "written since the trimmer looked (look again)")
        return RemoveChunksRsp(removed=trimmed)

    # ---- reads ------------------------------------------------------------------------
    @handles(READ)
    async def read(self, req: ReadReq, ctx: CallContext) -> Reply:
        key = chunk_key(req.chunk)
        if req.offset < 0 or req.length < 0 or req.offset + req.length > self.max_chunk_size_bytes:
            raise InvalidArgument(f"bad read range offset={req.offset} length={req.length}")
        if req.exact_ver:
            if req.exact_ver < 0:
                raise InvalidArgument(f"exact_ver {req.exact_ver}")
            return await self._read_exact(req, key)
        self.check_readable()
        target, pos, _ = await self._locate(req.chain_id, req.chain_version, req.target_id)
        if (target.target_id, key) in self.replacing:
            raise StatusError(Status.EAGAIN, f"chunk {key} on target {target.target_id} is being replaced (repair)")
        engine = target.engine
        st = engine.get(key)
        action = chain.on_read(pos, versions_of(st), chain.ReadIn(req.chain_version))
        if isinstance(action, chain.Settle):
            st, action = await self._settle_for_read(target, key, req)
        if isinstance(action, chain.Refuse):
            raise StatusError(action.status, action.reason)
        if st is None or st.commit_ver == 0:
            return Reply(ReadRsp(exists=False, length=0, chunk_length=0))
        want = max(0, min(req.length, st.length - req.offset))
        rsp_base = ReadRsp(commit_ver=st.commit_ver, length=want, chunk_length=st.length)
        if want == 0:
            return Reply(rsp_base)
        buf = self.pool.acquire(want)
        try:
            n = await engine.aread(key, req.offset, memoryview(buf)[:want])
        except BaseException as exc:
            self.pool.release(buf)
            if isinstance(exc, StatusError) and exc.status is Status.CHECKSUM_MISMATCH:
                self.corrupt_reads_total += 1
                logger.error("read of chunk %s on target %d: %s", key, target.target_id, exc)
                if self.on_corrupt is not None:
                    self.on_corrupt(target, key)  # the client reads another replica; we repair
            raise
        whole = req.offset == 0 and n == st.length
        rsp = rsp_base if n == want else dataclasses.replace(rsp_base, length=n)
        return Reply(rsp, payload=memoryview(buf)[:n], payload_crc=st.crc if whole else None,
                     on_sent=lambda: self.pool.release(buf))

    async def _read_exact(self, req: ReadReq, key: ChunkKey) -> Reply:
        """A repair read: version ``exact_ver`` of the chunk, committed or still pending, from a
        replica in any state (a waiting or syncing one may hold the only good copy). Safe without
        the lease: the reader installs it only if its length and CRC are those it recorded."""
        target = self.targets.get(req.target_id)
        if target is None:
            raise StatusError(Status.UNKNOWN_TARGET, f"target {req.target_id} is not on this node")
        if (target.target_id, key) in self.replacing:
            raise StatusError(Status.EAGAIN, f"chunk {key} on target {target.target_id} is being replaced (repair)")
        routing = await self.routing.get()
        info = routing.chains.get(req.chain_id)
        if info is None or target.target_id not in info.targets:
            raise StatusError(Status.UNKNOWN_TARGET, f"target {target.target_id} is not in chain {req.chain_id}")
        me = routing.targets.get(target.target_id)
        serving = me is not None and me.state == TargetState.SERVING
        st = target.engine.get(key)
        if st is not None and st.commit_ver == req.exact_ver:
            pending, length, crc = False, st.length, st.crc
        elif st is not None and st.has_pending and st.pending_ver == req.exact_ver and not serving:
            # a member out of service may hold the only copy of a version the old tail
            # committed; a serving one settles its leftovers itself (and never hands them out)
            pending, length, crc = True, st.pending_length, st.pending_crc
        else:
            raise StatusError(Status.VERSION_MISMATCH,
                              f"target {target.target_id} has no v{req.exact_ver} of chunk {key}")
        buf = self.pool.acquire(max(1, length))
        try:
            mv = memoryview(buf)[:length]
            n = target.engine.read(key, 0, mv, pending=True) if pending else await target.engine.aread(key, 0, mv)
        except BaseException:
            self.pool.release(buf)
            raise
        if n != length:
            self.pool.release(buf)
            raise StatusError(Status.CHECKSUM_MISMATCH, f"chunk {key} v{req.exact_ver}: {n} of {length} bytes")
        rsp = ReadRsp(commit_ver=req.exact_ver, length=n, chunk_length=length)
        return Reply(rsp, payload=memoryview(buf)[:n], payload_crc=crc, on_sent=lambda: self.pool.release(buf))

    async def _settle_for_read(self, target: StorageTarget, key: ChunkKey,
                               req: ReadReq) -> tuple[ChunkState | None, chain.Action]:
        """The tail holds a pending version: wait for the update in flight (the chunk lock),
        then commit what is still pending — a leftover the old tail may have served."""
        async with target.locks.hold(key):
            _, pos, _ = await self._locate(req.chain_id, req.chain_version, req.target_id)
            st = target.engine.get(key)
            action = chain.on_read(pos, versions_of(st), chain.ReadIn(req.chain_version))
            if isinstance(action, chain.Settle):
                if planted.on("tail_ignores_leftover"):
                    return st, chain.Serve()
                logger.info("chunk %s on target %d: committing leftover v%d before a read at the tail", key,
                            target.target_id, action.pending_ver)
                # a syncing target may follow us on the write path: it gets the version first
                # (the resync may have passed this chunk already)
                _, wpos, _ = await self._locate(req.chain_id, req.chain_version, req.target_id, for_update=True)
                if wpos is None:
                    raise StatusError(Status.TARGET_NOT_SERVING, f"target {target.target_id} left the chain")
                await self._reforward(target, wpos, key, chain.Reforward(action.pending_ver, wpos.successor),
                                      CHUNK_SIZE_ANY)
                st = target.engine.get(key)
                action = chain.Serve()
            return st, action

    @handles(REPORT_CORRUPT)
    async def report_corrupt(self, req: ReportCorruptReq, ctx: CallContext) -> Empty:
        """A client found this target's copy of a chunk failing its CRC: check it now (the check
        reads the chunk itself, so a false report costs one read; checks are deduplicated)."""
        target = self.targets.get(req.target_id)
        if target is None:
            raise StatusError(Status.UNKNOWN_TARGET, f"target {req.target_id} is not on this node")
        key = chunk_key(req.chunk)
        self.corrupt_reports_total += 1
        logger.warning("target %d chunk %s: a client read it with a bad CRC: checking it now", target.target_id, key)
        if self.on_corrupt is not None:
            self.on_corrupt(target, key)
        return Empty()

    @handles(QUERY_CHUNKS)
    async def query_chunks(self, req: QueryChunksReq, ctx: CallContext) -> QueryChunksRsp:
        target = self.targets.get(req.target_id) if req.target_id else next(iter(self.targets.values()), None)
        if target is None:
            raise StatusError(Status.UNKNOWN_TARGET, f"target {req.target_id} is not on this node")
        limit = max(0, min(req.limit, 100_000))
        after = ChunkKey(req.after.inode, req.after.index) if req.after is not None and not req.inode else None
        states = target.engine.list_chunks(req.inode, req.index_begin, req.index_end, limit + 1, after=after)
        metas = [
            ChunkMeta(chunk=ChunkId(inode=s.key.inode, index=s.key.index), commit_ver=s.commit_ver,
                      update_ver=s.pending_ver, length=s.length, crc=s.crc, tags=pack_tags(s.tags))
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
            out.append(TargetInfo(target_id=t.target_id, node_id=node_id, path=t.path, used_bytes=u.used_bytes,
                                  capacity_bytes=u.capacity_bytes, chunk_count=u.chunk_count, disk_id=t.disk_id,
                                  scrub=scrub))
        return out

    def __repr__(self) -> str:
        return (f"StorageService(targets={sorted(self.targets)} forwards={self.forwards_total} "
                f"reforwards={self.reforwards_total} {self.tags!r})")
