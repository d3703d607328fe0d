"""The update path of a storage replica: stage locally, forward, commit (DESIGN.md §4).

``ChunkUpdates`` runs the decisions of ``storage.chain`` for writes and truncates on an engine:
the head stages an update before forwarding it (a failed stage forwards nothing), forwards
carry the staged length and CRC (a successor refuses a diverged result), and a pending version
whose forward failed stays a *leftover*: pushed down the chain again before the next update
of its chunk, committed by a replica that is now the tail, and settled proactively after every
chain change (``settle_leftovers``). ``StorageService`` extends it with the RPC handlers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
from collections.abc import Callable

from loomfs.common.routing import Routing
from loomfs.errors import InvalidArgument, LoomError, NoSpace, StatusError
from loomfs.net.buffers import BufferPool
from loomfs.storage import chain, planted
from loomfs.storage.dedupe import applied_version, next_tags, pack_tags, tag_seen, unpack_tags
from loomfs.storage.engine.types import ChunkKey, ChunkState, ChunkTag
from loomfs.storage.forward import ChainForwarder
from loomfs.storage.routing import write_chain
from loomfs.storage.target import StorageTarget
from loomfs.wire.status import Status
from loomfs.wire.storage import TRUNCATE, WRITE, ChunkId, TruncateReq, WriteReq, WriteRsp
from loomfs.wire.types import TargetState

logger = logging.getLogger(__name__)

CHUNK_SIZE_ANY = 0  # a whole-chunk replace sized by its own length


def chunk_key(chunk: ChunkId | None) -> ChunkKey:
    if chunk is None:
        raise InvalidArgument("request names no chunk")
    return ChunkKey(chunk.inode, chunk.index)


def write_rsp(st: ChunkState | None, applied_ver: int | None = None) -> WriteRsp:
    """The reply to an update: the chunk as committed now; ``commit_ver`` is the version the
    update made when known (``applied_ver``: a retry answered from the chunk's tags, so the
    client's fence on that version — an EC repair's exact cut — never covers a later write)."""
    if st is None:
        return WriteRsp()
    ver = st.commit_ver if applied_ver is None else applied_ver
    return WriteRsp(commit_ver=ver, chunk_length=st.length, chunk_crc=st.crc)


def versions_of(st: ChunkState | None) -> chain.Versions:
    if st is None:
        return chain.Versions()
    return chain.Versions(st.commit_ver, st.pending_ver, st.length, st.crc)


class ChunkUpdates(ChainForwarder):
    """Writes and truncates of chunks on this node's targets (StorageService extends it)."""

    targets: dict[int, StorageTarget]
    pool: BufferPool
    max_chunk_size_bytes: int
    target_capacity_bytes: int
    dedupes_total: int
    repairs_total: int
    corrupt_reads_total: int
    on_corrupt: Callable[[StorageTarget, ChunkKey], None] | None
    _leftovers: dict[int, set[ChunkKey]]
    # targets that restarted and kept serving without a resync -> chunks updated since (the
    # first update of each other chunk as head leaves one version number unused)
    _gapped: dict[int, set[ChunkKey]]
    # updates in flight per (target, chain, the chain version that placed them); set when one
    # such count drops to zero (``updates_drained``)
    _located: dict[tuple[int, int, int], int]
    _drained: asyncio.Event
    # (target, chunk) whose committed copy was dropped to be replaced (a repair, a resync copy):
    # reads refuse it until the replacement is committed, rather than find no chunk
    replacing: set[tuple[int, ChunkKey]]
    revoked: set[int]  # targets mgmtd is taking out of their chains: nothing is served from them
    _removing: dict[tuple[int, int], list[tuple[int, int]]]  # (target, inode) -> removals under way

    async def _locate(
        self, chain_id: int, chain_version: int, target_id: int = 0, *, for_update: bool = False
    ) -> tuple[StorageTarget, chain.Position | None, Routing]:
        """This node's target of the chain (``target_id``, or the chain's member here) and its
        position in the write chain (``for_update``) or among the serving members."""
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
        if target.target_id in self.revoked and not planted.on("reads_ignore_lease"):
            raise StatusError(Status.TARGET_NOT_SERVING, f"target {target.target_id} is leaving its chain (mgmtd)")
        target.check_in_service()
        members = write_chain(routing, chain_id) if for_update else routing.serving_targets(chain_id)
        return target, chain.position_of(chain_id, info.version, members, target.target_id), routing

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

    async def _update(self, req: WriteReq | TruncateReq, payload: memoryview) -> WriteRsp:
        key = chunk_key(req.chunk)
        if req.if_ver_le < -1:
            raise InvalidArgument(f"if_ver_le {req.if_ver_le}: a version (>= 0) or -1 (any)")
        target, pos, _ = await self._locate(req.chain_id, req.chain_version, for_update=True)
        # counted by the chain version it was placed by: a resync waits for the older ones
        # (``updates_drained``), which reach only the members of that version
        slot = (target.target_id, req.chain_id, pos.chain_version if pos is not None else 0)
        located = self._located
        located[slot] = located.get(slot, 0) + 1
        try:
            with target.disk_errors():
                return await self._update_at(target, pos, key, req, payload)
        finally:
            located[slot] -= 1
            if not located[slot]:
                del located[slot]
                self._drained.set()

    def being_removed(self, target_id: int, key: ChunkKey) -> bool:
        """Whether a REMOVE_CHUNKS covering ``key`` is under way on ``target_id``: nothing may
        re-create the chunk meanwhile (an update, a leftover's push, a resync copy: it is, or
        will be, gone from every member)."""
        return any(begin <= key.index < end for begin, end in self._removing.get((target_id, key.inode), ()))

    async def updates_drained(self, target_id: int, chain_id: int, chain_version: int) -> None:
        """Wait until no update of ``chain_id`` on ``target_id`` placed by a chain version older
        than ``chain_version`` is in flight. Such an update has no way to the members that
        version lacks (a syncing target at the write tail): a resync must list the chunks only
        after it committed them here, or a new chunk committed meanwhile is never copied (the
        returning target then serves "no chunk", read as zeros, for an acknowledged write).
        Updates cannot be placed by an older version once this node knows the newer one."""
        while any(t == target_id and c == chain_id and v < chain_version for t, c, v in self._located):
            self._drained.clear()
            await self._drained.wait()

    async def _update_at(self, target: StorageTarget, pos: chain.Position | None, key: ChunkKey,
                         req: WriteReq | TruncateReq, payload: memoryview) -> WriteRsp:
        engine = target.engine
        async with target.locks.hold(key):
            target.check_in_service()  # it may have failed while this waited for the lock
            if self.being_removed(target.target_id, key):
                # a removal goes down the chain first and removes here last: an update let in
                # meanwhile would re-create the chunk on the members that already removed it,
                # then this one removes it too (replicas that disagree for good). Retried.
                raise StatusError(Status.EAGAIN, f"chunk {key} on target {target.target_id} is being removed")
            st = engine.get(key)
            full = isinstance(req, WriteReq) and req.full_replace
            expect_length = -1 if planted.on("no_content_check") else req.expect_length
            ev = chain.UpdateIn(req.chain_version, req.forwarded, req.update_ver, full, expect_length,
                                req.expect_crc, chain.TagSeen.NO if req.forwarded else tag_seen(st, req.tag))
            local = versions_of(st)
            gapped = self._gapped.get(target.target_id)
            if gapped is not None and not req.forwarded and key not in gapped:
                local = dataclasses.replace(local, gap=1)
            for action in chain.on_update(pos, local, ev):
                assert pos is not None or isinstance(action, chain.Refuse)
                if isinstance(action, chain.Refuse):
                    raise StatusError(action.status, action.reason)
                if isinstance(action, chain.AckCommitted):
                    if ev.seen is not chain.TagSeen.NO:
                        self.dedupes_total += 1
                    if isinstance(req, WriteReq | TruncateReq) and req.durable:
                        await engine.make_durable(key)  # a retry of a durable write: acked only on disk
                    now = engine.get(key)
                    return write_rsp(now, applied_version(now, req.tag) if ev.seen is not chain.TagSeen.NO else None)
                if isinstance(action, chain.Reforward):
                    pos = await self._reforward(target, pos, key, action, req.chunk_size)  # type: ignore[arg-type]
                elif isinstance(action, chain.Apply):
                    if req.if_ver_le >= 0 and not req.forwarded:
                        _check_fence(engine.get(key), key, req.if_ver_le)
                    rsp = await self._apply(target, pos, key, req, payload, action)  # type: ignore[arg-type]
                    if gapped is not None:
                        gapped.add(key)  # one unused number per chunk is enough
                    return rsp
        raise StatusError(Status.INTERNAL, "chain decision ended without a reply")

    def _growth(self, st: ChunkState | None, req: WriteReq | TruncateReq) -> int:
        old = st.length if st else 0
        if isinstance(req, TruncateReq):
            return req.length - old
        if req.full_replace:
            return req.length - old
        return max(old, req.offset + req.length) - old

    async def _stage(self, target: StorageTarget, key: ChunkKey, req: WriteReq | TruncateReq, payload: memoryview,
                     action: chain.Apply) -> ChunkState:
        """Stage ``req`` as version ``action.update_ver``; a repair first drops the committed
        version it replaces. Fails (nothing staged) on a full disk or an engine error. A big
        write's disk I/O runs off the event loop (``astage_write``); a durable one starts
        flushing its data at once, while it is forwarded (its commit waits for the flush)."""
        engine, ver = target.engine, action.update_ver
        st = engine.get(key)
        tags: tuple[ChunkTag, ...] | None
        if isinstance(req, WriteReq) and req.full_replace:
            tags = unpack_tags(req.tags)
        else:
            tags = next_tags(st, req.tag, ver)
        try:
            if planted.on("stage_fails") and not (isinstance(req, WriteReq) and req.full_replace):
                raise OSError(errno.EIO, "planted: stage fails")
            if isinstance(req, WriteReq):
                return await engine.astage_write(key, ver, req.offset, payload, data_crc=req.data_crc,
                                                 full_replace=req.full_replace, tags=tags, sync=req.durable)
            return engine.stage_truncate(key, ver, req.length, tags=tags)
        except StatusError as exc:
            engine.abort(key)
            if exc.status is Status.CHECKSUM_MISMATCH:  # the update would keep rotten bytes
                self.corrupt_reads_total += 1
                logger.error("update of chunk %s on target %d refused: %s", key, target.target_id, exc)
                if self.on_corrupt is not None:
                    self.on_corrupt(target, key)  # repaired from another replica; the client retries
            raise
        except OSError as exc:
            engine.abort(key)
            if exc.errno == errno.ENOSPC and not isinstance(exc, NoSpace):
                raise NoSpace(f"target {target.target_id}: disk full ({exc})") from exc
            raise

    async def _apply(
        self,
        target: StorageTarget,
        pos: chain.Position,
        key: ChunkKey,
        req: WriteReq | TruncateReq,
        payload: memoryview,
        action: chain.Apply,
    ) -> WriteRsp:
        """Stage locally first, then forward (with the staged length and CRC, so a successor
        can tell a diverged copy), then commit once the successor acked. A failed forward
        keeps the pending version: it is a leftover, pushed down again before the next
        update or on the next chain change (``settle_leftovers``)."""
        engine, ver = target.engine, action.update_ver
        self._check_space(target, self._growth(engine.get(key), req))  # before anything is forwarded
        if action.repair:
            logger.error("chunk %s on target %d: committed v%d differs from the predecessor's: replacing it",
                         key, target.target_id, ver)
            self.repairs_total += 1
            self.replacing.add((target.target_id, key))  # not served until the new copy commits
            await engine.remove_range(key.inode, key.index, key.index + 1)
        if planted.on("forward_before_stage") and pos.successor is not None and not req.forwarded:
            return await self._apply_forward_first(target, pos, key, req, payload, action)
        cur = engine.get(key)
        if req.forwarded and cur is not None and cur.has_pending and cur.pending_ver == ver and \
                req.expect_length >= 0 and (cur.pending_length, cur.pending_crc) == (req.expect_length, req.expect_crc):
            staged = cur  # the same version pushed again (a leftover): keep it, never risk losing it to a restage
        else:
            staged = await self._stage(target, key, req, payload, action)
        if req.forwarded and req.expect_length >= 0 and (staged.pending_length, staged.pending_crc) != (
                req.expect_length, req.expect_crc) and not planted.on("no_content_check"):
            engine.abort(key)
            raise StatusError(Status.VERSION_MISMATCH,
                              f"chunk {key} v{ver}: staged {staged.pending_length} bytes crc {staged.pending_crc:08x}, "
                              f"sender has {req.expect_length} bytes crc {req.expect_crc:08x}")
        if not req.forwarded and self.being_removed(target.target_id, key):
            # a removal began while this staged (an await: the file engine writes a whole chunk
            # on an I/O thread); its wait for updates in flight could not list a chunk that did
            # not exist yet, so it may be down the chain already: forwarded now, this would
            # re-create the chunk behind it (review of 161d9fc). Retried, as at the lock.
            engine.abort(key)
            raise StatusError(Status.EAGAIN, f"chunk {key} on target {target.target_id} is being removed")
        if pos.successor is None:
            return write_rsp(await engine.commit(key, ver, durable=req.durable))
        m = WRITE if isinstance(req, WriteReq) else TRUNCATE
        crc = req.data_crc if isinstance(req, WriteReq) else None
        fwd = dataclasses.replace(req, update_ver=ver, expect_length=staged.pending_length,
                                  expect_crc=staged.pending_crc)

        async def whole(p: chain.Position) -> Status:
            return await self._send_whole(target, p, key, ver, req.chunk_size, durable=req.durable)

        self._leftovers.setdefault(target.target_id, set()).add(key)
        status, pos = await self._forward_chain(pos, m, fwd, payload or None, crc, whole)
        outcome = chain.on_successor_result(ver, status)
        if isinstance(outcome, chain.Refuse):
            raise StatusError(outcome.status, outcome.reason)
        return write_rsp(await self._commit(target, key, ver, durable=req.durable))

    async def _apply_forward_first(self, target: StorageTarget, pos: chain.Position, key: ChunkKey,
                                   req: WriteReq | TruncateReq, payload: memoryview,
                                   action: chain.Apply) -> WriteRsp:
        """Planted bug (defect 1 of issue 8): forward before staging, and on a failed local
        stage give the version up although the successors have it."""
        ver = action.update_ver
        m = WRITE if isinstance(req, WriteReq) else TRUNCATE
        crc = req.data_crc if isinstance(req, WriteReq) else None
        fwd = dataclasses.replace(req, update_ver=ver)
        task = asyncio.ensure_future(self._forward_chain(pos, m, fwd, payload or None, crc))
        await asyncio.sleep(0)
        try:
            await self._stage(target, key, req, payload, action)
        except BaseException:
            task.cancel()
            raise
        status, _ = await task
        outcome = chain.on_successor_result(ver, status)
        if isinstance(outcome, chain.Refuse):
            raise StatusError(outcome.status, outcome.reason)
        return write_rsp(await self._commit(target, key, ver, durable=req.durable))

    async def _commit(self, target: StorageTarget, key: ChunkKey, ver: int, *, durable: bool = False) -> ChunkState:
        """Commit ``ver``; a commit once started runs to its end even if the request is
        cancelled meanwhile (its deadline passed): the file engine writes the index row on a
        helper thread, and memory and disk must not disagree. The chunk lock stays held until
        it has."""
        task = asyncio.ensure_future(target.engine.commit(key, ver, durable=durable))
        try:
            st = await asyncio.shield(task)
        except asyncio.CancelledError:
            await asyncio.wait({task})
            if not task.cancelled() and task.exception() is None:
                self._committed(target, key)
            raise
        self._committed(target, key)
        return st

    def _committed(self, target: StorageTarget, key: ChunkKey) -> None:
        self.replacing.discard((target.target_id, key))
        left = self._leftovers.get(target.target_id)
        if left is not None:
            left.discard(key)

    def _whole_req(self, pos: chain.Position, key: ChunkKey, st: ChunkState, ver: int, chunk_size: int,
                   durable: bool = False) -> WriteReq:
        return WriteReq(durable=durable,
            chain_id=pos.chain_id, chain_version=pos.chain_version, chunk=ChunkId(inode=key.inode, index=key.index),
            offset=0, length=st.pending_length, chunk_size=max(chunk_size, st.pending_length),
            data_crc=st.pending_crc, forwarded=True, update_ver=ver, full_replace=True,
            expect_length=st.pending_length, expect_crc=st.pending_crc, tags=pack_tags(st.pending_tags),
        )

    async def _send_whole(self, target: StorageTarget, pos: chain.Position, key: ChunkKey, ver: int,
                          chunk_size: int, *, durable: bool = False) -> Status:
        """Forward the staged update ``ver`` as a whole-chunk replace (under the chunk lock)."""
        engine = target.engine
        st = engine.get(key)
        if st is None or st.pending_ver != ver or pos.successor is None:
            return Status.VERSION_MISMATCH
        buf = self.pool.acquire(max(1, st.pending_length))
        try:
            mv = memoryview(buf)[: st.pending_length]
            engine.read(key, 0, mv, pending=True)
            routing = await self.routing.get()
            return await self._forward(routing, pos.successor, WRITE, self._whole_req(pos, key, st, ver, chunk_size,
                                                                                  durable or engine.pending_durable(key)),
                                       mv, st.pending_crc)
        finally:
            self.pool.release(buf)

    async def _reforward(
        self, target: StorageTarget, pos: chain.Position, key: ChunkKey,
        action: chain.Reforward, chunk_size: int,
    ) -> chain.Position:
        """Push a leftover pending version down the chain (whole chunk), then commit it; as
        the tail (no successor) commit it at once."""
        engine = target.engine
        st = engine.get(key)
        assert st is not None and st.pending_ver == action.update_ver
        durable = engine.pending_durable(key)  # staged for a durable write: committed durably everywhere
        self.reforwards_total += 1
        if pos.successor is not None:
            buf = self.pool.acquire(max(1, st.pending_length))
            try:
                mv = memoryview(buf)[: st.pending_length]
                engine.read(key, 0, mv, pending=True)
                fwd = self._whole_req(pos, key, st, action.update_ver, chunk_size, engine.pending_durable(key))
                status, pos = await self._forward_chain(pos, WRITE, fwd, mv, st.pending_crc)
            finally:
                self.pool.release(buf)
            outcome = chain.on_successor_result(action.update_ver, status)
            if isinstance(outcome, chain.Refuse):
                raise StatusError(outcome.status, outcome.reason)
        else:
            logger.info("chunk %s on target %d: committing leftover v%d as the tail", key, target.target_id,
                        action.update_ver)
        await self._commit(target, key, action.update_ver, durable=durable)
        return pos

    @property
    def has_leftovers(self) -> bool:
        return any(self._leftovers.values())

    async def settle_leftovers(self) -> int:
        """After a chain change: push every leftover pending version down its chain (or commit
        it where this target is now the tail), so write-once chunks that never see another
        write still end committed everywhere. Returns how many were settled; failures stay
        leftovers for the next call."""
        settled = 0
        if planted.on("tail_ignores_leftover"):
            return 0
        for target_id, keys in list(self._leftovers.items()):
            target = self.targets[target_id]
            if target.failed:
                continue  # out of service: its chain went on without it
            for key in sorted(keys):
                try:
                    settled += await self._settle_one(target, key)
                except (LoomError, OSError) as exc:
                    logger.info("chunk %s on target %d: leftover not settled yet: %s", key, target_id, exc)
        return settled

    async def _settle_one(self, target: StorageTarget, key: ChunkKey) -> int:
        async with target.locks.hold(key):
            st = target.engine.get(key)
            if st is None or not st.has_pending:
                self._leftovers.get(target.target_id, set()).discard(key)
                return 0
            if self.being_removed(target.target_id, key):
                return 0  # the removal drops it (pushed now, it would re-create the chunk behind it)
            routing = await self.routing.get()
            chain_id = self._chain_of(routing, target.target_id)
            if chain_id is None:
                return 0
            info = routing.chain(chain_id)
            me = routing.targets.get(target.target_id)
            if me is not None and me.state == TargetState.SYNCING and not planted.on("syncing_commits_leftover"):
                # left the chain and came back: the pending version is from before, and the
                # chain may have given its number to other bytes since, so it is neither
                # committed nor pushed (it is no leftover any more). It is kept though, unserved:
                # it may be the only intact copy of a version the old tail committed and then
                # lost to a torn write (sim seed 151227), which the scrubber fetches by exact
                # version and checks against the CRC it recorded; the resync's copy of the chunk
                # (or the chain's next update of it) replaces it before this target serves.
                if not planted.on("syncing_drops_leftover"):
                    logger.info("chunk %s on target %d: pending v%d is from before the resync: kept unserved "
                                "until the resync replaces it", key, target.target_id, st.pending_ver)
                else:
                    logger.info("chunk %s on target %d: dropping pending v%d from before the resync", key,
                                target.target_id, st.pending_ver)
                    target.engine.abort(key)
                self._leftovers.get(target.target_id, set()).discard(key)
                return 0
            pos = chain.position_of(chain_id, info.version, write_chain(routing, chain_id), target.target_id)
            if pos is None or me is None or me.state != TargetState.SERVING:
                return 0  # not a member now: resync will make this copy right
            await self._reforward(target, pos, key, chain.Reforward(st.pending_ver, pos.successor), CHUNK_SIZE_ANY)
            return 1

    @staticmethod
    def _chain_of(routing: Routing, target_id: int) -> int | None:
        return next((c.chain_id for c in routing.chains.values() if target_id in c.targets), None)


def _check_fence(st: ChunkState | None, key: ChunkKey, if_ver_le: int) -> None:
    """A fenced trim (or fenced write) applies only to a chunk no newer than its sender saw it."""
    newest = max(st.commit_ver, st.pending_ver if st.has_pending else 0) if st is not None else 0
    if newest > if_ver_le:
        raise StatusError(Status.VERSION_MISMATCH, f"chunk {key} is at v{newest}, the trim saw v{if_ver_le}: "
                          "written since (look again)")
