"""Storage service: RPC handlers that run the CRAQ decisions (storage.chain) on engines.

The service takes a routing *source* (``RoutingClient`` in production; ``StaticRouting`` in
tests) and an ``RpcClient`` for forwarding to successors, so it needs no mgmtd to run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from loomfs.common.routing import Routing
from loomfs.errors import InvalidArgument, LoomError, StatusError
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
from loomfs.wire.types import RoutingInfo, TargetInfo

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)
_EMPTY = memoryview(b"")


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
    ):
        self.targets = {t.target_id: t for t in targets}
        self.routing = routing
        self.rpc = rpc
        self.max_chunk_size_bytes = max_chunk_size_bytes
        self.forward_timeout_s = forward_timeout_s
        self.pool = pool
        self.tags = TagCache(dedupe_max)
        self.forwards_total = 0
        self.reforwards_total = 0

    # ---- routing ----------------------------------------------------------------------
    async def _locate(
        self, chain_id: int, chain_version: int, target_id: int = 0
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
        serving = routing.serving_targets(chain_id)
        return target, chain.position_of(chain_id, info.version, serving, target.target_id), routing

    async def _forward(self, routing: Routing, successor: int, m: Method, req: Message,
                       payload: memoryview | None = None, payload_crc: int | None = None) -> Status:
        self.forwards_total += 1
        try:
            address = routing.address_of(successor)
            await self.rpc.call(address, m, req, payload=payload, payload_crc=payload_crc,
                                timeout_s=self.forward_timeout_s, retry=True)  # bounded retries
        except LoomError as exc:
            logger.warning("forward %s to target %d failed: %s", m.name, successor, exc)
            return exc.status if exc.status is not None else Status.CHAIN_UNAVAILABLE
        return Status.OK

    # ---- writes -----------------------------------------------------------------------
    def _check_bounds(self, end: int, chunk_size: int) -> None:
        if not 0 <= end <= chunk_size <= self.max_chunk_size_bytes:
            raise InvalidArgument(
                f"range end {end} / chunk size {chunk_size} out of bounds (max {self.max_chunk_size_bytes})"
            )

    @handles(WRITE)
    async def write(self, req: WriteReq, ctx: CallContext) -> WriteRsp:
        payload = ctx.payload
        if req.offset < 0 or req.length != len(payload):
            raise InvalidArgument(f"write length {req.length} != payload {len(payload)} or bad offset")
        self._check_bounds(req.offset + req.length, req.chunk_size)
        if ctx.payload_crc != req.data_crc:  # the framing layer verified payload_crc already
            raise StatusError(Status.CHECKSUM_MISMATCH, "write payload does not match data_crc")
        if req.forwarded:
            return await self._update(req, payload)
        return await self.tags.run(req.tag, lambda: self._update(req, payload))

    @handles(TRUNCATE)
    async def truncate(self, req: TruncateReq, ctx: CallContext) -> WriteRsp:
        self._check_bounds(req.length, req.chunk_size)
        if req.forwarded:
            return await self._update(req, _EMPTY)
        return await self.tags.run(req.tag, lambda: self._update(req, _EMPTY))

    async def _update(self, req: WriteReq | TruncateReq, payload: memoryview) -> WriteRsp:
        key = _key(req.chunk)
        target, pos, routing = await self._locate(req.chain_id, req.chain_version)
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
                    await self._reforward(target, pos, routing, key, action, req.chunk_size)  # type: ignore[arg-type]
                elif isinstance(action, chain.Apply):
                    return await self._apply(target, pos, routing, key, req, payload, action)  # type: ignore[arg-type]
        raise StatusError(Status.INTERNAL, "chain decision ended without a reply")

    async def _apply(
        self,
        target: StorageTarget,
        pos: chain.Position,
        routing: Routing,
        key: ChunkKey,
        req: WriteReq | TruncateReq,
        payload: memoryview,
        action: chain.Apply,
    ) -> WriteRsp:
        engine, ver = target.engine, action.update_ver

        async def stage() -> None:
            if isinstance(req, WriteReq):
                await engine.astage_write(key, ver, req.offset, payload, data_crc=req.data_crc,
                                          full_replace=req.full_replace)
            else:
                engine.stage_truncate(key, ver, req.length)

        if action.successor is None:
            await stage()
            return _write_rsp(await engine.commit(key, ver))
        fwd = dataclasses.replace(req, forwarded=True, update_ver=ver, chain_version=pos.chain_version)
        m = WRITE if isinstance(req, WriteReq) else TRUNCATE
        crc = req.data_crc if isinstance(req, WriteReq) else None
        task = asyncio.ensure_future(self._forward(routing, action.successor, m, fwd, payload or None, crc))
        await asyncio.sleep(0)  # the forward is on the wire before the local write starts
        try:
            await stage()
        except BaseException:
            status = await task
            logger.error("chunk %s v%d: local stage failed after forwarding (successor: %s)", key, ver, status.name)
            raise
        outcome = chain.on_successor_result(ver, await task)
        if isinstance(outcome, chain.Refuse):
            raise StatusError(outcome.status, outcome.reason)
        return _write_rsp(await engine.commit(key, ver))

    async def _reforward(
        self, target: StorageTarget, pos: chain.Position, routing: Routing, key: ChunkKey,
        action: chain.Reforward, chunk_size: int,
    ) -> None:
        engine = target.engine
        st = engine.get(key)
        assert st is not None and st.pending_ver == action.update_ver
        self.reforwards_total += 1
        buf = self.pool.acquire(st.pending_length)
        try:
            mv = memoryview(buf)[: st.pending_length]
            engine.read(key, 0, mv, pending=True)
            fwd = WriteReq(
                chain_id=pos.chain_id, chain_version=pos.chain_version, chunk=ChunkId(inode=key.inode, index=key.index),
                offset=0, length=st.pending_length, chunk_size=max(chunk_size, st.pending_length),
                data_crc=st.pending_crc, forwarded=True, update_ver=action.update_ver, full_replace=True,
            )
            status = await self._forward(routing, action.successor, WRITE, fwd, mv, st.pending_crc)
        finally:
            self.pool.release(buf)
        outcome = chain.on_successor_result(action.update_ver, status)
        if isinstance(outcome, chain.Refuse):
            raise StatusError(outcome.status, outcome.reason)
        await engine.commit(key, action.update_ver)

    @handles(REMOVE_CHUNKS)
    async def remove_chunks(self, req: RemoveChunksReq, ctx: CallContext) -> RemoveChunksRsp:
        if req.forwarded:
            return await self._remove(req)
        return await self.tags.run(req.tag, lambda: self._remove(req))

    async def _remove(self, req: RemoveChunksReq) -> RemoveChunksRsp:
        if req.index_begin < 0 or req.index_end < req.index_begin:
            raise InvalidArgument(f"bad index range [{req.index_begin}, {req.index_end})")
        target, pos, routing = await self._locate(req.chain_id, req.chain_version)
        action = chain.on_remove(pos, chain.UpdateIn(req.chain_version, req.forwarded))[0]
        if isinstance(action, chain.Refuse):
            raise StatusError(action.status, action.reason)
        assert isinstance(action, chain.Apply) and pos is not None
        if action.successor is not None:
            fwd = dataclasses.replace(req, forwarded=True, chain_version=pos.chain_version)
            outcome = chain.on_successor_result(0, await self._forward(routing, action.successor, REMOVE_CHUNKS, fwd))
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
        except BaseException:
            self.pool.release(buf)
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
        states = target.engine.list_chunks(req.inode, req.index_begin, req.index_end, limit + 1)
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
