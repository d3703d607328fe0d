"""Chunk removals on a storage replica: deleted files' chunks (REMOVE_CHUNKS, forwarded down
the chain, the tail removing first) and trims of live files (each chunk an empty new version,
fenced by the versions meta's trimmer saw). A removal under way turns resync copies of its
chunks into removals, so no copy lands on a syncing target after the removal did."""

from __future__ import annotations

from collections.abc import Iterator

from loomfs.common.identity import Right
from loomfs.errors import InvalidArgument, StatusError
from loomfs.net.rpc import CallContext, handles
from loomfs.storage import chain
from loomfs.storage.dedupe import TagCache
from loomfs.storage.engine.types import ChunkKey, ChunkState
from loomfs.storage.fencing import Fencing
from loomfs.storage.foreground import ForegroundGate
from loomfs.storage.grantcheck import GrantCheck, dedupe_slot
from loomfs.storage.target import StorageTarget
from loomfs.storage.tenantcheck import TenantCheck
from loomfs.storage.updates import CHUNK_SIZE_ANY, ChunkUpdates
from loomfs.wire.status import Status
from loomfs.wire.storage import (
    REMOVE_CHUNKS,
    ChunkId,
    RemoveChunksReq,
    RemoveChunksRsp,
    TruncateReq,
)

_EMPTY = memoryview(b"")
REMOVE_PAGE = 1024
BACKGROUND_WAIT_S = 0.05  # a removal waits at most this long per chunk for clients' I/O
BACKGROUND_BUDGET_S = 1.0  # ... and this long in all (well inside the request's deadline)


MORE_INODES_MAX = 4096  # inodes one removal may name besides ``inode``


def _inodes_of(req: RemoveChunksReq) -> list[int]:
    return [req.inode, *req.more_inodes]


def _chunks_of(target: StorageTarget, req: RemoveChunksReq) -> Iterator[ChunkState]:
    """The target's chunks in the request's range (of each inode it names), listed a page at
    a time (a huge file is never listed whole; each page is listed after the previous one was
    handled)."""
    for inode in _inodes_of(req):
        after: ChunkKey | None = None
        while True:
            page = target.engine.list_chunks(inode, req.index_begin, req.index_end, REMOVE_PAGE, after=after)
            yield from page
            if len(page) < REMOVE_PAGE:
                break
            after = page[-1].key


class ChunkRemovals(ChunkUpdates, Fencing):
    grant_check: GrantCheck
    tenant_check: TenantCheck
    tags: TagCache
    foreground: ForegroundGate

    @handles(REMOVE_CHUNKS)
    async def remove_chunks(self, req: RemoveChunksReq, ctx: CallContext) -> RemoveChunksRsp:
        if (req.forwarded or req.sync or req.from_target) and not ctx.identity.can(Right.SERVICE):
            raise StatusError(Status.EPERM, "a forwarded or resync chunk removal is for chain peers only "
                              f"(token {ctx.identity.token_id or ctx.identity.uid})")
        inodes = [req.inode, *req.more_inodes]
        if not ctx.identity.privileged:
            await self.tenant_check.check_slow(ctx.identity, inodes, "chunk removal")
        self.grant_check.check(ctx.identity, req.grant, inodes)
        if req.forwarded:
            return await self._remove(req)
        return await self.tags.run(dedupe_slot(req.tag, "remove", req.inode, req.index_begin),
                                   lambda: self._remove(req))

    async def _remove(self, req: RemoveChunksReq) -> RemoveChunksRsp:
        """Remove a range of chunks: forwarded first, then removed here (the tail removes
        first, as commits flow), each chunk under its lock so no update interleaves."""
        if req.index_begin < 0 or req.index_end < req.index_begin:
            raise InvalidArgument(f"bad index range [{req.index_begin}, {req.index_end})")
        if req.more_inodes and (req.keep_versions or req.sync or len(req.more_inodes) > MORE_INODES_MAX):
            raise InvalidArgument(f"more_inodes ({len(req.more_inodes)}) only in a plain removal of at most "
                                  f"{MORE_INODES_MAX}")
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
        spans = [(target.target_id, inode) for inode in _inodes_of(req)]
        for span in spans:  # a resync copy of these chunks from now on removes instead
            self._removing.setdefault(span, []).append((req.index_begin, req.index_end))
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
            yield_until_s = self.clock.monotonic() + BACKGROUND_BUDGET_S
            for st in _chunks_of(target, req):
                if self.clock.monotonic() < yield_until_s:  # deleted files' chunks: background work
                    await self.foreground.quiet(BACKGROUND_WAIT_S)
                async with target.locks.hold(st.key):
                    removed += await target.engine.remove_range(st.key.inode, st.key.index, st.key.index + 1)
                    left = self._leftovers.get(target.target_id)
                    if left is not None:
                        left.discard(st.key)
        finally:
            for span in spans:
                ranges = self._removing[span]
                ranges.remove((req.index_begin, req.index_end))
                if not ranges:
                    del self._removing[span]
        return RemoveChunksRsp(removed=removed)

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
