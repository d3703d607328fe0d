"""Storage service: RPC handlers that run the CRAQ decisions (storage.chain) on engines.

The service takes a routing *source* (``RoutingClient`` in production; ``StaticRouting`` in
tests) and an ``RpcClient`` for forwarding to successors, so it needs no mgmtd to run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from loomfs.common.clock import SYSTEM_CLOCK, Clock
from loomfs.common.routing import Routing
from loomfs.errors import InvalidArgument, LoomError, NoSpace, StatusError
from loomfs.net.buffers import DEFAULT_POOL, BufferPool
from loomfs.net.rpc import CallContext, Reply, RpcClient, handles
from loomfs.storage import chain
from loomfs.storage.engine.base import ChunkKey, ChunkState
from loomfs.storage.target import StorageTarget
from loomfs.wire.message import Empty, Message, Method
from loomfs.wire.status import Status
from loomfs.wire.storage import (
    QUERY_CHUNKS,
    READ,
    REMOVE_CHUNKS,
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
    RequestTag,
    TruncateReq,
    WriteReq,
    WriteRsp,
)
from loomfs.wire.types import RoutingInfo, TargetInfo, TargetState

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)
_EMPTY = memoryview(b"")


def write_chain(routing: Routing, chain_id: int) -> list[int]:
    """The members writes flow through: serving ones (head first), then the syncing one (the
    write tail: it gets every update while its predecessor copies the rest)."""
    info = routing.chain(chain_id)
    out = []
    for t in info.targets:
        ti = routing.targets.get(t)
        if ti is not None and ti.state in (TargetState.SERVING, TargetState.SYNCING):
            out.append(t)
    return out


class RoutingSource(Protocol):
    async def get(self) -> Routing: ...

    async def refresh(self, min_version: int = 0) -> Routing: ...


class StaticRouting:
    """A routing source tests set by hand."""

    def __init__(self, info: RoutingInfo):
        self.routing = Routing(info)

    def set(self, info: RoutingInfo) -> None:
        self.routing = Routing(info)

    async def get(self) -> Routing:
        return self.routing

    async def refresh(self, min_version: int = 0) -> Routing:
        return self.routing

    def __repr__(self) -> str:
        return f"StaticRouting(v{self.routing.version})"


class TagCache:
    """Bounded LRU of (client_id, request_id) -> result future, for write dedupe at the head.
    Failed requests are forgotten so a retry applies them; in-progress ones are awaited."""

    def __init__(self, max_entries: int = 8192):
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[int, int], asyncio.Future[Message]] = OrderedDict()
        self.hits = 0

    async def run(self, tag: RequestTag | None, fn: Callable[[], Awaitable[M]]) -> M:
        if tag is None or (tag.client_id == 0 and tag.request_id == 0):
            return await fn()
        k = (tag.client_id, tag.request_id)
        known = self._entries.get(k)
        if known is not None:
            self.hits += 1
            self._entries.move_to_end(k)
            return await asyncio.shield(known)  # type: ignore[arg-type]
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._entries[k] = fut
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        try:
            result = await fn()
        except BaseException as exc:
            if self._entries.get(k) is fut:
                del self._entries[k]
            if isinstance(exc, asyncio.CancelledError):
                fut.cancel()
            else:
                fut.set_exception(exc)
                fut.exception()  # waiters get it; nobody else needs to
            raise
        fut.set_result(result)
        return result

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"TagCache({len(self._entries)}/{self.max_entries} hits={self.hits})"


def _key(chunk: ChunkId | None) -> ChunkKey:
    if chunk is None:
        raise InvalidArgument("request names no chunk")
    return ChunkKey(chunk.inode, chunk.index)


def _write_rsp(st: ChunkState | None) -> WriteRsp:
    if st is None:
        return WriteRsp()
    return WriteRsp(commit_ver=st.commit_ver, chunk_length=st.length, chunk_crc=st.crc)


def _log_failure(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.warning("unreachability report failed: %s", task.exception())


class StorageService:
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
        self._reported: set[tuple[int, int, int]] = set()  # (chain, version, successor) already reported
        # writes are refused once mgmtd has not been reached for half a lease (the node may be
        # cut off and already replaced); the node's heartbeat loop pushes this forward
        self.writable_until_s = math.inf

    # ---- routing ----------------------------------------------------------------------
    async def _locate(
        self, chain_id: int, chain_version: int, target_id: int = 0, *, for_update: bool = False
    ) -> tuple[StorageTarget, chain.Position | None, Routing]:
        routing = await self.routing.get()
        known = routing.chains.get(chain_id)
        if known is None or chain_version > known.version:
            routing = await self.routing.refresh(routing.version)  # the caller knows newer routing
        info = routing.chain(chain_id)
        if target_id:
            target = self.targets.get(target_id)
            if target is None:
                raise StatusError(Status.UNKNOWN_TARGET, f"target {target_id} is not on this node")
        else:
            found = next((self.targets[t] for t in info.targets if t in self.targets), None)
            if found is None:
                raise StatusError(Status.UNKNOWN_TARGET, f"no target of chain {chain_id} on this node")
            target = found
        members = write_chain(routing, chain_id) if for_update else routing.serving_targets(chain_id)
        return target, chain.position_of(chain_id, info.version, members, target.target_id), routing

    def check_writable(self) -> None:
        if self.clock.monotonic() > self.writable_until_s:
            raise StatusError(Status.TARGET_NOT_SERVING, "storage node lost mgmtd for half a lease: not writable")

    async def _forward(self, routing: Routing, successor: int, m: Method, req: Message,
                       payload: memoryview | None = None, payload_crc: int | None = None) -> Status:
        status, _ = await self._forward2(routing, successor, m, req, payload, payload_crc)
        return status

    async def _forward2(self, routing: Routing, successor: int, m: Method, req: Message,
                        payload: memoryview | None = None, payload_crc: int | None = None) -> tuple[Status, bool]:
        """(status, unreachable): ``unreachable`` when the successor itself did not answer."""
        self.forwards_total += 1
        try:
            address = routing.address_of(successor)
            await self.rpc.call(address, m, req, payload=payload, payload_crc=payload_crc,
                                timeout_s=self.forward_timeout_s, retry=True)  # bounded retries
        except LoomError as exc:
            logger.warning("forward %s to target %d failed: %s", m.name, successor, exc)
            if exc.status is None:
                return Status.CHAIN_UNAVAILABLE, True
            return exc.status, exc.status in (Status.DEADLINE_EXCEEDED, Status.SHUTTING_DOWN)
        return Status.OK, False

    async def _changed_position(self, pos: chain.Position, wait_s: float) -> chain.Position | None:
        """Wait up to ``wait_s`` for routing with a newer version of ``pos``'s chain; return
        this target's new write position (None: it is no longer a member, or nothing changed)."""
        end = self.clock.monotonic() + wait_s
        while True:
            routing = await self.routing.get()
            info = routing.chains.get(pos.chain_id)
            if info is not None and info.version > pos.chain_version:
                return chain.position_of(pos.chain_id, info.version, write_chain(routing, pos.chain_id),
                                         pos.target_id)
            if self.clock.monotonic() >= end:
                return None
            await asyncio.sleep(0.05)

    async def _forward_chain(
        self, pos: chain.Position, m: Method, req: WriteReq | TruncateReq | RemoveChunksReq,
        payload: memoryview | None, crc: int | None,
        replace: Callable[[chain.Position], Awaitable[Status]] | None = None,
    ) -> tuple[Status, chain.Position]:
        """Forward ``req`` to the successor; when it fails or hangs and the chain is
        reconfigured meanwhile, forward again (with the new chain version) to the new
        successor, or commit as the new tail. A successor that misses versions (a syncing
        target) gets the whole chunk instead (``replace``). Returns the final status and the
        position it was reached under."""
        deadline = self.clock.monotonic() + self.forward_timeout_s
        while True:
            succ = pos.successor
            if succ is None:
                return Status.OK, pos  # we became the tail
            routing = await self.routing.get()
            fwd = dataclasses.replace(req, forwarded=True, chain_version=pos.chain_version)
            call = asyncio.ensure_future(self._forward2(routing, succ, m, fwd, payload, crc))
            new_pos: chain.Position | None = None
            started_s = self.clock.monotonic()
            done, _ = await asyncio.wait({call}, timeout=self.reconfig_wait_s)
            while not done:  # slow successor (hung? cut off?): watch for a chain change meanwhile
                new_pos = await self._changed_position(pos, 0.0)
                if new_pos is not None or self.clock.monotonic() > deadline:
                    call.cancel()
                    break
                if self.clock.monotonic() - started_s > self.suspect_after_s:
                    self.suspect(pos, succ, f"{m.name} unanswered for {self.clock.monotonic() - started_s:.1f}s")
                done, _ = await asyncio.wait({call}, timeout=0.05)
            status, unreachable = (Status.CHAIN_UNAVAILABLE, True) if call.cancelled() or not done \
                else call.result()
            if status is Status.VERSION_MISMATCH and replace is not None:
                self.replaces_total += 1
                status = await replace(pos)
            if status is Status.OK:
                return status, pos
            if new_pos is None and unreachable:  # our successor is gone or cut off: mgmtd will drop it
                self.suspect(pos, succ, f"{m.name} failed: {status.name}")
                left = deadline - self.clock.monotonic()
                new_pos = await self._changed_position(pos, max(0.0, min(left, self.reconfig_wait_s * 5)))
            if new_pos is None:
                return status, pos
            logger.info("chain %d v%d -> v%d while forwarding to target %d (%s): forwarding again",
                        pos.chain_id, pos.chain_version, new_pos.chain_version, succ, status.name)
            self.reforwards_total += 1
            pos = new_pos

    def suspect(self, pos: chain.Position, successor: int, why: str) -> None:
        """Tell mgmtd (once per chain version) that ``successor`` does not answer. If it is
        dead, its lease lapses anyway; if it still heartbeats (a cut between us), only this
        report gets it out of the chain."""
        key = (pos.chain_id, pos.chain_version, successor)
        if self.report_unreachable is None or key in self._reported:
            return
        if len(self._reported) > 4096:
            self._reported.clear()
        self._reported.add(key)
        self.unreachable_reports_total += 1
        logger.warning("chain %d v%d: successor target %d unreachable (%s): reporting to mgmtd",
                       pos.chain_id, pos.chain_version, successor, why)
        task = asyncio.ensure_future(self.report_unreachable(pos, successor, why))
        task.add_done_callback(_log_failure)

    # ---- writes -----------------------------------------------------------------------
    def _check_bounds(self, end: int, chunk_size: int) -> None:
        if not 0 <= end <= chunk_size <= self.max_chunk_size_bytes:
            raise InvalidArgument(
                f"range end {end} / chunk size {chunk_size} out of bounds (max {self.max_chunk_size_bytes})"
            )

    def _check_space(self, target: StorageTarget, grow_bytes: int) -> None:
        if grow_bytes <= 0 or not self.target_capacity_bytes:
            return
        used = target.engine.usage().used_bytes
        if used + grow_bytes > self.target_capacity_bytes:
            raise NoSpace(f"target {target.target_id} is full: {used} of {self.target_capacity_bytes} bytes used, "
                          f"write needs {grow_bytes} more")

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

    async def _update(self, req: WriteReq | TruncateReq, payload: memoryview) -> WriteRsp:
        key = _key(req.chunk)
        target, pos, routing = await self._locate(req.chain_id, req.chain_version, for_update=True)
        engine = target.engine
        async with target.locks.hold(key):
            st = engine.get(key)
            local = chain.Versions(st.commit_ver, st.pending_ver) if st else chain.Versions()
            full = isinstance(req, WriteReq) and req.full_replace
            ev = chain.UpdateIn(req.chain_version, req.forwarded, req.update_ver, full)
            for action in chain.on_update(pos, local, ev):
                assert pos is not None or isinstance(action, chain.Refuse)
                if isinstance(action, chain.Refuse):
                    raise StatusError(action.status, action.reason)
                if isinstance(action, chain.AckCommitted):
                    return _write_rsp(engine.get(key))
                if isinstance(action, chain.Reforward):
                    pos = await self._reforward(target, pos, key, action, req.chunk_size)  # type: ignore[arg-type]
                elif isinstance(action, chain.Apply):
                    if pos is not None and pos.successor is None:
                        action = chain.Apply(action.update_ver, None)  # became the tail meanwhile
                    return await self._apply(target, pos, key, req, payload, action)  # type: ignore[arg-type]
        raise StatusError(Status.INTERNAL, "chain decision ended without a reply")

    def _growth(self, st: ChunkState | None, req: WriteReq | TruncateReq) -> int:
        old = st.length if st else 0
        if isinstance(req, TruncateReq):
            return req.length - old
        if req.full_replace:
            return req.length - old
        return max(old, req.offset + req.length) - old

    async def _apply(
        self,
        target: StorageTarget,
        pos: chain.Position,
        key: ChunkKey,
        req: WriteReq | TruncateReq,
        payload: memoryview,
        action: chain.Apply,
    ) -> WriteRsp:
        engine, ver = target.engine, action.update_ver
        self._check_space(target, self._growth(engine.get(key), req))  # before anything is forwarded

        def stage() -> None:
            try:
                if isinstance(req, WriteReq):
                    engine.stage_write(key, ver, req.offset, payload, data_crc=req.data_crc,
                                       full_replace=req.full_replace)
                else:
                    engine.stage_truncate(key, ver, req.length)
            except OSError as exc:
                if exc.errno == errno.ENOSPC and not isinstance(exc, NoSpace):
                    engine.abort(key)
                    raise NoSpace(f"target {target.target_id}: disk full ({exc})") from exc
                raise

        if action.successor is None:
            stage()
            return _write_rsp(await engine.commit(key, ver))
        m = WRITE if isinstance(req, WriteReq) else TRUNCATE
        crc = req.data_crc if isinstance(req, WriteReq) else None
        fwd = dataclasses.replace(req, update_ver=ver)

        async def whole(p: chain.Position) -> Status:
            return await self._send_whole(target, p, key, ver, req.chunk_size)

        task = asyncio.ensure_future(self._forward_chain(pos, m, fwd, payload or None, crc, whole))
        await asyncio.sleep(0)  # the forward is on the wire before the local write starts
        try:
            stage()
        except BaseException:
            task.cancel()
            logger.error("chunk %s v%d: local stage failed after forwarding", key, ver)
            raise
        status, _ = await task
        outcome = chain.on_successor_result(ver, status)
        if isinstance(outcome, chain.Refuse):
            raise StatusError(outcome.status, outcome.reason)
        return _write_rsp(await engine.commit(key, ver))

    async def _send_whole(self, target: StorageTarget, pos: chain.Position, key: ChunkKey, ver: int,
                          chunk_size: int) -> Status:
        """Forward the staged update ``ver`` as a whole-chunk replace (under the chunk lock)."""
        engine = target.engine
        st = engine.get(key)
        if st is None or st.pending_ver != ver or pos.successor is None:
            return Status.VERSION_MISMATCH
        buf = self.pool.acquire(max(1, st.pending_length))
        try:
            mv = memoryview(buf)[: st.pending_length]
            engine.read(key, 0, mv, pending=True)
            fwd = WriteReq(
                chain_id=pos.chain_id, chain_version=pos.chain_version, chunk=ChunkId(inode=key.inode, index=key.index),
                offset=0, length=st.pending_length, chunk_size=max(chunk_size, st.pending_length),
                data_crc=st.pending_crc, forwarded=True, update_ver=ver, full_replace=True,
            )
            routing = await self.routing.get()
            return await self._forward(routing, pos.successor, WRITE, fwd, mv, st.pending_crc)
        finally:
            self.pool.release(buf)

    async def _reforward(
        self, target: StorageTarget, pos: chain.Position, key: ChunkKey,
        action: chain.Reforward, chunk_size: int,
    ) -> chain.Position:
        engine = target.engine
        st = engine.get(key)
        assert st is not None and st.pending_ver == action.update_ver
        self.reforwards_total += 1
        buf = self.pool.acquire(max(1, st.pending_length))
        try:
            mv = memoryview(buf)[: st.pending_length]
            engine.read(key, 0, mv, pending=True)
            fwd = WriteReq(
                chain_id=pos.chain_id, chain_version=pos.chain_version, chunk=ChunkId(inode=key.inode, index=key.index),
                offset=0, length=st.pending_length, chunk_size=max(chunk_size, st.pending_length),
                data_crc=st.pending_crc, forwarded=True, update_ver=action.update_ver, full_replace=True,
            )
            status, pos = await self._forward_chain(pos, WRITE, fwd, mv, st.pending_crc)
        finally:
            self.pool.release(buf)
        outcome = chain.on_successor_result(action.update_ver, status)
        if isinstance(outcome, chain.Refuse):
            raise StatusError(outcome.status, outcome.reason)
        await engine.commit(key, action.update_ver)
        return pos

    async def _sync_write(self, req: WriteReq, payload: memoryview) -> WriteRsp:
        """A resync copy at the syncing target: make the chunk exactly the sender's version."""
        key = _key(req.chunk)
        target, pos, _ = await self._locate(req.chain_id, req.chain_version, for_update=True)
        if pos is None or pos.is_head:
            raise StatusError(Status.TARGET_NOT_SERVING, f"target {target.target_id} is not a sync target")
        engine = target.engine
        async with target.locks.hold(key):
            st = engine.get(key)
            if st is not None and not st.has_pending and (st.commit_ver, st.length, st.crc) == (
                    req.update_ver, req.length, req.data_crc):
                return _write_rsp(st)
            self._check_space(target, req.length - (st.length if st else 0))
            if st is not None:
                await engine.remove_range(key.inode, key.index, key.index + 1)
            engine.stage_write(key, req.update_ver, 0, payload, data_crc=req.data_crc, full_replace=True)
            return _write_rsp(await engine.commit(key, req.update_ver))

    @handles(REMOVE_CHUNKS)
    async def remove_chunks(self, req: RemoveChunksReq, ctx: CallContext) -> RemoveChunksRsp:
        if req.forwarded:
            return await self._remove(req)
        return await self.tags.run(req.tag, lambda: self._remove(req))

    async def _remove(self, req: RemoveChunksReq) -> RemoveChunksRsp:
        if req.index_begin < 0 or req.index_end < req.index_begin:
            raise InvalidArgument(f"bad index range [{req.index_begin}, {req.index_end})")
        target, pos, routing = await self._locate(req.chain_id, req.chain_version, for_update=True)
        action = chain.on_remove(pos, chain.UpdateIn(req.chain_version, req.forwarded))[0]
        if isinstance(action, chain.Refuse):
            raise StatusError(action.status, action.reason)
        assert isinstance(action, chain.Apply) and pos is not None
        if action.successor is not None:
            status, _ = await self._forward_chain(pos, REMOVE_CHUNKS, req, None, None)
            outcome = chain.on_successor_result(0, status)
            if isinstance(outcome, chain.Refuse):
                raise StatusError(outcome.status, outcome.reason)
        removed = await target.engine.remove_range(req.inode, req.index_begin, req.index_end)
        return RemoveChunksRsp(removed=removed)

    # ---- reads ------------------------------------------------------------------------
    @handles(READ)
    async def read(self, req: ReadReq, ctx: CallContext) -> Reply:
        key = _key(req.chunk)
        if req.offset < 0 or req.length < 0 or req.offset + req.length > self.max_chunk_size_bytes:
            raise InvalidArgument(f"bad read range offset={req.offset} length={req.length}")
        target, pos, _ = await self._locate(req.chain_id, req.chain_version, req.target_id)
        engine = target.engine
        st = engine.get(key)
        local = chain.Versions(st.commit_ver, st.pending_ver) if st else chain.Versions()
        action = chain.on_read(pos, local, chain.ReadIn(req.chain_version))
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
                      update_ver=s.pending_ver, length=s.length, crc=s.crc)
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
            out.append(TargetInfo(target_id=t.target_id, node_id=node_id, path=t.path, used_bytes=u.used_bytes,
                                  capacity_bytes=u.capacity_bytes, chunk_count=u.chunk_count))
        return out

    def __repr__(self) -> str:
        return (f"StorageService(targets={sorted(self.targets)} forwards={self.forwards_total} "
                f"reforwards={self.reforwards_total} {self.tags!r})")
