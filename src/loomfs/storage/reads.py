"""Chunk reads on a storage replica (CRAQ): serving members answer committed versions; a tail
holding a leftover commits it first; a chunk being repaired is refused (EAGAIN); a partial read
checks block CRCs; repair reads of an exact version serve other replicas whatever their state;
clients report chunks that failed their CRC."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from typing import Any

import crc32c

from loomfs.errors import InvalidArgument, StatusError
from loomfs.net.rpc import CallContext, Reply, handles
from loomfs.net.sendfile import FileRegion
from loomfs.storage import chain, planted
from loomfs.storage.engine.blocks import crc_join_blocks
from loomfs.storage.engine.types import BLOCK_BYTES, ChunkKey, ChunkState
from loomfs.storage.fencing import Fencing, chain_peers_only
from loomfs.storage.foreground import ForegroundGate
from loomfs.storage.grantcheck import ReadGrantCheck
from loomfs.storage.hotchunks import SENDFILE_MIN_BYTES, HotChunks, Plan, open_region
from loomfs.storage.target import StorageTarget
from loomfs.storage.tenantcheck import TenantCheck
from loomfs.storage.updates import CHUNK_SIZE_ANY, ChunkUpdates, chunk_key, versions_of
from loomfs.wire.message import Empty
from loomfs.wire.status import Status
from loomfs.wire.storage import READ, REPORT_CORRUPT, ReadReq, ReadRsp, ReportCorruptReq
from loomfs.wire.types import TargetState

logger = logging.getLogger(__name__)

# a partial read at least this big has its payload CRC computed on the executor (crc32c releases
# the GIL): the frame encoder would otherwise hash it on the event loop (as the client does for
# big writes; whole-chunk reads send the stored CRC and hash nothing)
CRC_OFF_LOOP_BYTES = 1 << 20


def aligned_blocks(offset: int, length: int) -> tuple[int, int] | None:
    """Blocks ``[first, last)`` when ``[offset, offset + length)`` is exactly whole blocks
    (their stored CRCs joined are the range's CRC), else None."""
    if length <= 0 or offset % BLOCK_BYTES or length % BLOCK_BYTES:
        return None
    return offset // BLOCK_BYTES, (offset + length) // BLOCK_BYTES


class ChunkReads(ChunkUpdates, Fencing):
    corrupt_reports_total: int
    foreground: ForegroundGate
    tenant_check: TenantCheck
    read_grants: ReadGrantCheck

    @handles(READ)
    async def read(self, req: ReadReq, ctx: CallContext) -> Reply:
        ident = ctx.identity
        if req.exact_ver:  # a repair read may return a version the tail never committed
            chain_peers_only(ident, "repair read (exact_ver)")
        if not ident.privileged:  # a client: only chunks of its tenant's inodes (storage/tenantcheck.py)
            inodes = (req.chunk.inode if req.chunk else 0,)
            if not self.tenant_check.check(ident, inodes, "read"):
                await self.tenant_check.check_slow(ident, inodes, "read")
            # ... and of inodes meta let it read (POSIX r): a read grant (storage/grantcheck.py)
            self.read_grants.check(ident, req.grant, inodes[0])
        with self.foreground.busy():
            return await self._read(req)

    async def _read(self, req: ReadReq) -> Reply:
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
        whole = req.offset == 0 and want == st.length
        span = None if whole else aligned_blocks(req.offset, want)
        if want >= SENDFILE_MIN_BYTES and (whole or span is not None):
            hot = await self._read_hot(target, key, st, req.offset, want, span, rsp_base)
            if hot is not None:
                return hot
        # an aligned part: the engine checks each block it reads against its stored CRC, so the
        # reply's CRC is those CRCs joined (no second pass over the bytes); taken in the same loop
        # step as the read starts (one version), used only if no commit came during the read
        stored = self._span_crcs(engine, key, st, span) if span is not None else None
        buf = self.pool.acquire(want)
        try:
            n = await engine.aread(key, req.offset, memoryview(buf)[:want])
        except asyncio.CancelledError:
            raise  # a read thread may still be filling buf: it must not go back to the pool
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
        crc: int | None = st.crc if whole else None
        if crc is None and stored is not None and n == want and self._same_version(engine, key, st):
            crc = crc_join_blocks(0, stored)
            self.joined_crc_reads_total += 1
        if crc is None and n >= CRC_OFF_LOOP_BYTES:
            try:
                crc = await asyncio.get_running_loop().run_in_executor(None, crc32c.crc32c, memoryview(buf)[:n])
            except BaseException:
                self.pool.release(buf)
                raise
        return Reply(rsp, payload=memoryview(buf)[:n], payload_crc=crc, on_sent=lambda: self.pool.release(buf))

    joined_crc_reads_total = 0  # aligned partial reads whose reply CRC was joined from block CRCs

    @staticmethod
    def _same_version(engine: Any, key: ChunkKey, st: ChunkState) -> bool:
        now = engine.get(key)
        return now is not None and now.commit_ver == st.commit_ver and now.crc == st.crc

    def _span_crcs(self, engine: Any, key: ChunkKey, st: ChunkState, span: tuple[int, int]) -> list[int] | None:
        """The stored CRCs of blocks ``span`` of ``st``'s version (None: not that version now)."""
        if not self._same_version(engine, key, st):
            return None
        crcs: list[int] = engine.block_crcs(key)
        first, last = span
        return crcs[first:last] if last <= len(crcs) else None

    @property
    def hot_chunks(self) -> HotChunks:
        """Recently read chunk ranges, served from the page cache (``storage.hotchunks``)."""
        hot: HotChunks | None = self.__dict__.get("_hot_chunks")
        if hot is None:
            hot = self.__dict__["_hot_chunks"] = HotChunks()
        return hot

    async def _read_hot(self, target: StorageTarget, key: ChunkKey, st: ChunkState, offset: int, want: int,
                        span: tuple[int, int] | None, rsp: ReadRsp) -> Reply | None:
        """A read of a range read recently (the whole chunk, or whole blocks of it: ``span``)
        from the page cache: ``os.sendfile`` of the committed file when the range is resident,
        else a buffered read that fills the page cache; None: read it as usual (first reads, or
        an engine without files). The bytes are not hashed here: the frame carries the stored
        CRC (the chunk's, or the blocks' stored CRCs joined) and the client checks the bytes
        against it, end to end (docs/datapath.md)."""
        engine = target.engine
        region = open_region(engine, key)
        if region is None:
            return None
        fd, length, crc = region
        if length != st.length or crc != st.crc:  # not the version st names: read as usual
            os.close(fd)
            return None
        if span is not None:  # same loop step as open_region: the same version's block CRCs
            try:
                stored = self._span_crcs(engine, key, st, span)
            except BaseException:
                os.close(fd)
                raise
            if stored is None:
                os.close(fd)
                return None
            crc = crc_join_blocks(0, stored)
        plan = self.hot_chunks.plan((target.target_id, key, offset, want), fd, want, offset)
        if plan is Plan.DIRECT:
            os.close(fd)
            return None
        file = FileRegion(fd, offset, want)
        if plan is Plan.SENDFILE:
            payload: Any = file  # a FileRegion: the transport sends it with os.sendfile
            return Reply(rsp, payload=payload, payload_crc=crc, on_sent=file.close)
        buf = self.pool.acquire(want)

        def fill() -> int:
            try:
                return file.read_into(memoryview(buf))
            finally:
                file.close()

        try:
            n = await asyncio.get_running_loop().run_in_executor(None, fill)
        except asyncio.CancelledError:
            raise  # the thread may still be filling buf: it must not go back to the pool
        except BaseException:
            self.pool.release(buf)
            raise
        if n != want:
            self.pool.release(buf)
            raise StatusError(Status.CHECKSUM_MISMATCH, f"chunk {key}: {n} of {want} bytes at {offset} in its file")
        return Reply(rsp, payload=memoryview(buf)[:n], payload_crc=crc, on_sent=lambda: self.pool.release(buf))

    async def _read_exact(self, req: ReadReq, key: ChunkKey) -> Reply:
        """A repair read: version ``exact_ver`` of the chunk, committed or still pending, from a
        replica in any state (a waiting or syncing one may hold the only good copy). Safe without
        the lease: the reader installs it only if its length and CRC are those it recorded.
        ``length`` 0 (or the whole version) reads all of it; else [offset, offset+length) of it."""
        target = self.targets.get(req.target_id)
        if target is None:
            raise StatusError(Status.UNKNOWN_TARGET, f"target {req.target_id} is not on this node")
        target.check_in_service()
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
        # the whole version (a repair), or a range of it (a block rebuild: a committed range is
        # checked against its block CRCs by the engine; the reader checks each block anyway)
        start, end = (0, length) if not req.length else (min(req.offset, length), min(length, req.offset + req.length))
        whole = (start, end) == (0, length)
        buf = self.pool.acquire(max(1, end - start))
        try:
            mv = memoryview(buf)[: end - start]
            if pending:
                n = target.engine.read(key, start, mv, pending=True)
            else:
                n = await target.engine.aread(key, start, mv)
        except asyncio.CancelledError:
            raise  # a read thread may still be filling buf: it must not go back to the pool
        except BaseException:
            self.pool.release(buf)
            raise
        if n != end - start:
            self.pool.release(buf)
            raise StatusError(Status.CHECKSUM_MISMATCH, f"chunk {key} v{req.exact_ver}: {n} of {end - start} bytes")
        rsp = ReadRsp(commit_ver=req.exact_ver, length=n, chunk_length=length)
        return Reply(rsp, payload=memoryview(buf)[:n], payload_crc=crc if whole else None,
                     on_sent=lambda: self.pool.release(buf))

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
        if not ctx.identity.privileged:
            await self.tenant_check.check_slow(ctx.identity, (req.chunk.inode if req.chunk else 0,), "corruption report")
        target = self.targets.get(req.target_id)
        if target is None:
            raise StatusError(Status.UNKNOWN_TARGET, f"target {req.target_id} is not on this node")
        key = chunk_key(req.chunk)
        self.corrupt_reports_total += 1
        logger.warning("target %d chunk %s: a client read it with a bad CRC: checking it now", target.target_id, key)
        if self.on_corrupt is not None:
            self.on_corrupt(target, key)
        return Empty()
