"""Background scrubber: recompute every chunk's CRC32C at a bounded rate; repair bad ones.

Each pass walks every target's committed chunks (under the chunk lock, so it never races a
write), reads the chunk, and compares its CRC32C with the one recorded at commit. A chunk
that does not match (bit rot, a torn or tampered file) is logged, counted, and replaced by
the same version read from another serving replica of its chain (the transport checks that
copy's CRC end to end). A chunk whose replicas moved on meanwhile is left for the next pass.
"""

from __future__ import annotations

import asyncio
import logging

import crc32c

from loomfs.common.routing import Routing
from loomfs.errors import LoomError
from loomfs.storage.blockrepair import patched_pending, rebuild_from_blocks
from loomfs.storage.dedupe import unpack_tags
from loomfs.storage.engine.types import ChunkKey, ChunkState, ChunkTag
from loomfs.storage.install import KeptPending, install_copy
from loomfs.storage.target import StorageTarget
from loomfs.wire.storage import QUERY_CHUNKS, READ, ChunkId, QueryChunksReq, ReadReq
from loomfs.wire.types import ScrubStats, TargetState

logger = logging.getLogger(__name__)

BAD_KEPT_MAX = 1000


PAGE_CHUNKS = 10_000
URGENT_MAX = 1024
BACKGROUND_WAIT_S = 0.1  # a pass waits at most this long per chunk for clients' I/O


class Scrubber:
    def __init__(self, service: object, *, bytes_per_s: int, interval_s: float, first_pass_after_s: float = 0.0):
        from loomfs.storage.service import StorageService

        assert isinstance(service, StorageService)
        self.service = service
        self.bytes_per_s = bytes_per_s
        self.interval_s = interval_s
        self.first_pass_after_s = first_pass_after_s if first_pass_after_s else min(interval_s, 60.0)
        self.passes = 0
        self.chunks_checked = 0
        self.bad_found = 0
        self.repaired = 0
        self._per_target: dict[int, list[int]] = {}  # target -> [checked, bad, repaired, rebuilt]
        self._last_pass_end_s: float | None = None
        self._next_pass_at_s: float | None = None  # None while a pass runs (or scrubbing is off)
        self.bad: list[tuple[int, ChunkKey]] = []  # (target, chunk) found bad, newest last (bounded)
        self._task: asyncio.Task[None] | None = None
        self._urgent: set[tuple[int, ChunkKey]] = set()  # chunks a read found corrupt, being repaired
        # a repair read of a whole chunk: long enough for a big chunk, short enough that a hung
        # peer does not hold the repair up (the next candidate is tried)
        self.fetch_timeout_s = max(5.0, 4 * service.forward_timeout_s)

    async def run(self) -> None:
        if self.bytes_per_s <= 0:
            return
        self._task = asyncio.current_task()
        self._next_pass_at_s = self.service.clock.monotonic() + self.first_pass_after_s
        await asyncio.sleep(self.first_pass_after_s)
        while True:
            self._next_pass_at_s = None
            started = self.service.clock.monotonic()
            for target in list(self.service.targets.values()):
                if target.failed:
                    continue  # out of service: verified when its process restarts (engine.diskfail)
                try:
                    await self.scrub_target(target)
                except Exception as exc:  # a failing disk (or a bug) must not end scrubbing
                    logger.error("scrub of target %d failed (next pass retries): %s", target.target_id, exc)
            self.passes += 1
            logger.info("scrub pass %d: %d chunks checked, %d bad, %d repaired in %.1fs", self.passes,
                        self.chunks_checked, self.bad_found, self.repaired, self.service.clock.monotonic() - started)
            self._last_pass_end_s = self.service.clock.monotonic()
            self._next_pass_at_s = self._last_pass_end_s + self.interval_s
            await asyncio.sleep(self.interval_s)

    async def scrub_target(self, target: StorageTarget) -> int:
        """One pass over ``target``; returns how many bad chunks it found."""
        bad = 0
        after: ChunkKey | None = None
        while True:  # paged, so a target with millions of chunks is never listed whole
            page = target.engine.list_chunks(0, limit=PAGE_CHUNKS, after=after)
            for st in page:
                if not st.commit_ver:
                    continue
                await self.service.foreground.quiet(BACKGROUND_WAIT_S)  # clients' I/O first
                ok, n = await self.check_chunk(target, st.key)
                bad += not ok
                if self.bytes_per_s > 0:
                    await asyncio.sleep(max(n, 4096) / self.bytes_per_s)
            if len(page) < PAGE_CHUNKS:
                return bad
            after = page[-1].key

    def check_soon(self, target: StorageTarget, key: ChunkKey) -> None:
        """A read found ``key`` corrupt: check and repair it now, not at the next pass."""
        if (target.target_id, key) in self._urgent or len(self._urgent) >= URGENT_MAX:
            return
        self._urgent.add((target.target_id, key))

        async def go() -> None:
            try:
                await self.check_chunk(target, key)
            except Exception as exc:  # noqa: BLE001 - the next pass tries again
                logger.warning("scrub: urgent check of %s failed: %s", key, exc)
            finally:
                self._urgent.discard((target.target_id, key))

        asyncio.ensure_future(go())

    async def check_chunk(self, target: StorageTarget, key: ChunkKey) -> tuple[bool, int]:
        """(good, bytes read). A bad chunk is repaired from another replica when possible.

        The chunk lock is held to read and check the chunk and again to install a good copy,
        not while the copy is fetched: a hung peer must not hold up writes to the chunk."""
        svc = self.service
        async with target.locks.hold(key):
            st = target.engine.get(key)
            if st is None or not st.commit_ver:
                return True, 0
            buf = svc.pool.acquire(max(1, st.length))
            try:
                mv = memoryview(buf)[: st.length]
                try:
                    n = await target.engine.aread(key, 0, mv)  # off the event loop (file engine)
                    crc = crc32c.crc32c(mv[:n])
                except OSError as exc:
                    logger.error("scrub: target %d chunk %s unreadable: %s", target.target_id, key, exc)
                    n, crc = 0, -1
            finally:
                svc.pool.release(buf)
            self.chunks_checked += 1
            counts = self._counts(target.target_id)
            counts[0] += 1
            if n == st.length and crc == st.crc:
                return True, n
            self.bad_found += 1
            counts[1] += 1
            self.bad.append((target.target_id, key))
            del self.bad[:-BAD_KEPT_MAX]
            logger.error("scrub: target %d chunk %s v%d is corrupt (crc %08x, recorded %08x): repairing",
                         target.target_id, key, st.commit_ver, crc & 0xFFFFFFFF, st.crc)
        if await self._repair(target, key, st):
            self.repaired += 1
            self._counts(target.target_id)[2] += 1
        return False, n

    def _counts(self, target_id: int) -> list[int]:
        return self._per_target.setdefault(target_id, [0, 0, 0, 0])

    def target_stats(self, target_id: int) -> ScrubStats:
        """What the scrubber did for ``target_id`` (for ``loomfs admin targets``)."""
        clock = self.service.clock
        now_s = clock.monotonic()
        wall_s = clock.now_ns() / 1e9

        def unix(at_s: float | None) -> float:
            return float(round(wall_s + at_s - now_s)) if at_s is not None else 0.0

        checked, bad, repaired, rebuilt = self._counts(target_id)
        on = self.bytes_per_s > 0
        return ScrubStats(
            interval_s=self.interval_s if on else 0.0, passes=self.passes, checked=checked, bad=bad,
            repaired=repaired, last_pass_end_unix_s=unix(self._last_pass_end_s),
            next_pass_unix_s=unix(self._next_pass_at_s) if on else 0.0, rebuilt=rebuilt,
        )

    async def _repair(self, target: StorageTarget, key: ChunkKey, st: ChunkState) -> bool:
        """Install a good copy from another replica. Serving replicas first, the tail first
        (commits happen there first): the same version, or a newer one when this replica is
        behind (a head whose rotten bytes were carried into its pending version cannot push
        that version, while the tail committed the good one), never an older one, and never
        one that would drop a newer pending version of ours. Then any other member of the chain
        whatever its state (waiting, syncing, offline but reachable), for exactly our version,
        committed or pending there: when this replica is the only serving one, that is where
        the good copy is."""
        svc = self.service
        try:
            routing = await svc.routing.get()
            chain_id = routing.targets[target.target_id].chain_id
            info = routing.chain(chain_id)
        except (KeyError, LoomError) as exc:
            logger.warning("scrub: no chain for target %d: %s", target.target_id, exc)
            return False
        others = [t for t in reversed(info.targets) if t != target.target_id and t in routing.targets]
        serving = [t for t in others if routing.targets[t].state == TargetState.SERVING]
        rest = [t for t in others if t not in serving]
        # last resort: a newer committed version from a member out of service, the syncing one
        # (the chain's write tail: it takes every new update) first
        newer = sorted(rest, key=lambda t: routing.targets[t].state != TargetState.SYNCING)
        # our version rebuilt block by block from any version the others hold (rot in a whole
        # block an append carried into a version only this replica has): the last resort, but
        # ahead of another member's newer version when it keeps our pending one (which may be
        # newer still, and served), never when it would drop it
        tries = [(t, "serving") for t in serving] + [(t, "exact") for t in rest]
        tries += [(0, "rebuild-keeping-pending")] if st.has_pending else []
        tries += [(t, "newer") for t in newer] + [(0, "rebuild")]
        rebuilt: bytearray | None = None
        rebuild_tried = False  # the blocks are fetched once: a second try reuses them
        for other, how in tries:
            if how.startswith("rebuild"):
                if not rebuild_tried:
                    rebuild_tried = True
                    rebuilt = await rebuild_from_blocks(svc, target, key, st, routing, chain_id, others,
                                                        self.fetch_timeout_s)
                if rebuilt is not None and await self._install(
                        target, key, st, st.commit_ver, memoryview(rebuilt), st.tags, "other members' blocks",
                        pending_kept=how == "rebuild-keeping-pending"):
                    self._counts(target.target_id)[3] += 1
                    return True
                continue
            if how == "exact":
                got = await self._fetch_exact(routing, chain_id, info.version, other, key, st)
            elif how == "newer":
                got = await self._fetch_newer(routing, chain_id, info.version, other, target, key, st)
            else:
                got = await self._fetch(routing, chain_id, info.version, other, target, key, st)
            if got is not None:
                ver, data, tags = got
                return await self._install(target, key, st, ver, data, tags, f"target {other} (v{ver})")
        return False

    async def _install(self, target: StorageTarget, key: ChunkKey, st: ChunkState, ver: int, data: memoryview,
                       tags: tuple[ChunkTag, ...], source: str, *, pending_kept: bool = False) -> bool:
        """Install the good copy, unless the chunk changed while it was fetched (or, with
        ``pending_kept``, unless our pending version can be kept on top of it)."""
        async with target.locks.hold(key):
            now = target.engine.get(key)
            if now is None or (now.commit_ver, now.crc, now.length, now.pending_ver) != (
                    st.commit_ver, st.crc, st.length, st.pending_ver):
                logger.info("scrub: target %d chunk %s changed while a good copy was fetched: next pass",
                            target.target_id, key)
                return False
            # a pending version on top of the same version stays (it may be the only copy
            # of a version the old tail committed and served); one that carries the rot
            # (an append staged from rotten bytes) has its rotten blocks taken from the good
            # copy where they match its own block CRCs, else it is dropped: it can never be
            # pushed intact
            keep = None
            if now.has_pending and ver == now.commit_ver:
                keep = self._pending_intact(target, key, now) or patched_pending(target, key, now, data)
            if now.has_pending and keep is None and pending_kept:
                return False
            if now.has_pending and keep is None:
                logger.error("scrub: target %d chunk %s: pending v%d dropped with the rotten copy",
                             target.target_id, key, now.pending_ver)
            await install_copy(self.service, target, key, ver, data, tags, keep=keep)
        logger.info("scrub: target %d chunk %s v%d repaired from %s", target.target_id, key, st.commit_ver, source)
        return True

    async def _fetch_exact(self, routing: Routing, chain_id: int, chain_version: int, other: int, key: ChunkKey,
                           st: ChunkState) -> tuple[int, memoryview, tuple[ChunkTag, ...]] | None:
        """``other``'s copy of exactly our committed version, if its length and CRC are ours."""
        svc = self.service
        req = ReadReq(chain_id=chain_id, chain_version=chain_version, chunk=ChunkId(inode=key.inode, index=key.index),
                      offset=0, length=st.length, target_id=other, exact_ver=st.commit_ver)
        try:
            rsp = await svc.rpc.call(routing.address_of(other), READ, req, timeout_s=self.fetch_timeout_s)
        except (LoomError, OSError) as exc:
            logger.warning("scrub: reading chunk %s v%d from target %d failed: %s", key, st.commit_ver, other, exc)
            return None
        data = rsp.payload
        if rsp.body.commit_ver != st.commit_ver or len(data) != st.length or crc32c.crc32c(data) != st.crc:
            return None
        return st.commit_ver, data, st.tags

    async def _fetch_newer(self, routing: Routing, chain_id: int, chain_version: int, other: int,
                           target: StorageTarget, key: ChunkKey,
                           st: ChunkState) -> tuple[int, memoryview, tuple[ChunkTag, ...]] | None:
        """``other``'s committed version when it is newer than ours, whatever ``other``'s state:
        the last resort for a copy no member holds intact at our version (sim seed 173070: the
        last serving replica's failed disk lost the chunk's pages, and the old tail, back as
        syncing, had committed the next version). Version numbers are not reused (a head that
        restarted and kept serving leaves one unused), so it moves this replica forward; never
        past a newer intact pending version of ours (it may be all that is left of it)."""
        svc = self.service
        address = routing.address_of(other)
        q = QueryChunksReq(target_id=other, inode=key.inode, index_begin=key.index, index_end=key.index + 1, limit=1)
        try:
            metas = (await svc.rpc.call(address, QUERY_CHUNKS, q, timeout_s=self.fetch_timeout_s)).body.chunks
        except (LoomError, OSError) as exc:
            logger.warning("scrub: chunk %s metadata from target %d failed: %s", key, other, exc)
            return None
        m = metas[0] if metas and metas[0].chunk is not None and metas[0].chunk.index == key.index else None
        if m is None or m.commit_ver <= st.commit_ver:
            return None
        if st.has_pending and st.pending_ver > m.commit_ver and self._pending_intact(target, key, st) is not None:
            return None
        req = ReadReq(chain_id=chain_id, chain_version=chain_version, chunk=ChunkId(inode=key.inode, index=key.index),
                      offset=0, length=m.length, target_id=other, exact_ver=m.commit_ver)
        try:
            rsp = await svc.rpc.call(address, READ, req, timeout_s=self.fetch_timeout_s)
        except (LoomError, OSError) as exc:
            logger.warning("scrub: reading chunk %s v%d from target %d failed: %s", key, m.commit_ver, other, exc)
            return None
        data = rsp.payload
        if rsp.body.commit_ver != m.commit_ver or len(data) != m.length or crc32c.crc32c(data) != m.crc:
            return None
        logger.warning("scrub: target %d chunk %s: no intact v%d anywhere; taking v%d committed on target %d",
                       target.target_id, key, st.commit_ver, m.commit_ver, other)
        return m.commit_ver, data, unpack_tags(m.tags)

    async def _fetch(self, routing: Routing, chain_id: int, chain_version: int, other: int,
                     target: StorageTarget, key: ChunkKey, st: ChunkState) -> tuple[int, memoryview, tuple[ChunkTag, ...]] | None:
        """(version, bytes, request tags) of ``other``'s committed copy, if it may replace ours."""
        svc = self.service
        address = routing.address_of(other)
        req = ReadReq(chain_id=chain_id, chain_version=chain_version, chunk=ChunkId(inode=key.inode, index=key.index),
                      offset=0, length=svc.max_chunk_size_bytes, target_id=other)
        try:
            rsp = await svc.rpc.call(address, READ, req, timeout_s=self.fetch_timeout_s)  # whole chunk: CRC-checked
        except (LoomError, OSError) as exc:
            logger.warning("scrub: reading chunk %s from target %d failed: %s", key, other, exc)
            return None
        ver, data = rsp.body.commit_ver, rsp.payload
        if st.has_pending and st.pending_ver > ver:
            if self._pending_intact(target, key, st) is not None and ver != st.commit_ver:
                logger.warning("scrub: target %d has chunk %s v%d, ours holds pending v%d: retry next pass", other,
                               key, ver, st.pending_ver)
                return None  # installing would drop a newer pending version (it may be all that is left)
            # staged from the rotten bytes (an append carries them along): pushed down as it is it
            # would never be intact, and nobody committed it (the tail, asked first, does not have
            # it); ``_install`` patches its rotten blocks from the good copy, or drops it
            logger.error("scrub: target %d chunk %s: pending v%d carries the rot too", target.target_id, key,
                         st.pending_ver)
        if ver == st.commit_ver and len(data) == st.length and crc32c.crc32c(data) == st.crc:
            return ver, data, st.tags
        if ver <= st.commit_ver:
            logger.warning("scrub: target %d has chunk %s v%d (ours v%d, pending v%d): retry next pass", other, key,
                           ver, st.commit_ver, st.pending_ver)
            return None
        q = QueryChunksReq(target_id=other, inode=key.inode, index_begin=key.index, index_end=key.index + 1, limit=1)
        try:
            metas = (await svc.rpc.call(address, QUERY_CHUNKS, q, timeout_s=self.fetch_timeout_s)).body.chunks
        except (LoomError, OSError) as exc:
            logger.warning("scrub: chunk %s metadata from target %d failed: %s", key, other, exc)
            return None
        if not metas or metas[0].commit_ver != ver or metas[0].crc != crc32c.crc32c(data):
            return None  # it changed meanwhile: next pass
        return ver, data, unpack_tags(metas[0].tags)

    def _pending_intact(self, target: StorageTarget, key: ChunkKey, st: ChunkState) -> KeptPending | None:
        """The chunk's pending version, if its bytes match its CRC (else None: the rot was
        carried into it)."""
        svc = self.service
        buf = svc.pool.acquire(max(1, st.pending_length))
        try:
            mv = memoryview(buf)[: st.pending_length]
            n = target.engine.read(key, 0, mv, pending=True)
            if n == st.pending_length and crc32c.crc32c(mv[:n]) == st.pending_crc:
                return KeptPending(st.pending_ver, bytes(mv[:n]), st.pending_tags)
            return None
        except OSError:
            return None
        finally:
            svc.pool.release(buf)

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def __repr__(self) -> str:
        return (f"Scrubber(passes={self.passes} checked={self.chunks_checked} bad={self.bad_found} "
                f"repaired={self.repaired})")
