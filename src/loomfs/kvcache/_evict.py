"""Eviction and compaction: one pass, run by the cache object holding the eviction lease.

A pass scans the index (a READDIR page, then READ_MANY of its entries), drops entries that
are malformed or past their TTL, and, while the live bytes exceed ``capacity_bytes``, the
least recently touched ones (hits and ``touch`` rewrite an entry's time), down to
``low_water`` of capacity. An entry is removed only if it still holds what was scanned (a put
of the key since then wins). Then sealed segments (renamed without ``.open`` by their writer
once every put into them wrote its entries; or still ``.open`` but older than
``segment_abandon_s``: a writer that died) with no live value are unlinked, and those
whose live bytes are below ``compact_live_ratio`` of their size are compacted: their live
values are read (CRC checked), appended to this writer's segment, and their entries rewritten
where they still point at the old place, each only if unchanged since read (``_rewrite``: a
conditional rename; a put, delete or touch meanwhile wins); then the old segment is unlinked
unless an entry still names it (the next pass tries again). A reader holding
an old entry reads the old bytes until meta's GC removes them, and after that bytes that fail
the CRC: a miss, never wrong data.

The lease is ``<prefix>/evictor`` (writer id, expiry: three pass intervals); the holder renews
it at each pass, others take it once it expired, so one process evicts at a time (two at once
only waste work).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import struct
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from loomfs.kvcache import _entry as E
from loomfs.kvcache import _rewrite
from loomfs.kvcache._jobs import run_all
from loomfs.kvcache._segments import OPEN_SUFFIX

if TYPE_CHECKING:
    from loomfs.kvcache._core import AsyncKVCache

logger = logging.getLogger(__name__)

_LEASE = struct.Struct("<Qd")
MOVE_BATCH_BYTES = 64 << 20
MOVE_READS_INFLIGHT = 16


def lease_s(cache: AsyncKVCache) -> float:
    cfg = cache.config
    return max(3 * max(cfg.background_interval_s, cfg.evict_interval_s), 5.0)


async def take_lease(cache: AsyncKVCache) -> bool:
    """Take or renew the eviction lease; True when this cache object holds it now."""
    c = cache.client
    now = time.time()

    async def holder() -> tuple[int, float]:
        try:
            data = await c.cat(cache.lease_path)
        except FileNotFoundError:
            return 0, 0.0
        if len(data) != _LEASE.size:
            return 0, 0.0
        writer, expires = _LEASE.unpack(data)
        return int(writer), float(expires)

    writer, expires = await holder()
    if writer not in (0, cache.writer_id) and expires > now:
        return False
    await c.pipe(cache.lease_path, _LEASE.pack(cache.writer_id, now + lease_s(cache)))
    writer, _ = await holder()  # two takers at once: the last write won
    return writer == cache.writer_id


@dataclasses.dataclass
class EvictionPlan:
    drop: list[str]  # entry names to remove
    live: list[tuple[str, E.Entry]]  # what stays
    expired: int = 0
    evicted: int = 0
    garbage: int = 0
    live_bytes: int = 0


def plan_eviction(scanned: Sequence[tuple[str, E.Entry | None]], *, now_s: float, ttl_s: float,
                  capacity_bytes: int, low_water: float) -> EvictionPlan:
    """Which entries go (pure): malformed, expired, then least recently touched over capacity."""
    plan = EvictionPlan(drop=[], live=[])
    for name, e in scanned:
        if e is None:
            plan.drop.append(name)
            plan.garbage += 1
        elif ttl_s and e.touched_s + ttl_s < now_s:
            plan.drop.append(name)
            plan.expired += 1
        else:
            plan.live.append((name, e))
    total = sum(e.value_bytes for _, e in plan.live)
    if total > capacity_bytes:
        goal = int(capacity_bytes * low_water)
        by_age = sorted(plan.live, key=lambda ne: ne[1].touched_s)
        keep_from = 0
        while total > goal and keep_from < len(by_age):
            name, e = by_age[keep_from]
            total -= e.value_bytes
            plan.drop.append(name)
            keep_from += 1
        plan.evicted = keep_from
        gone = {n for n, _ in by_age[:keep_from]}
        plan.live = [(n, e) for n, e in plan.live if n not in gone]
    plan.live_bytes = total
    return plan


@dataclasses.dataclass(frozen=True)
class SegmentInfo:
    name: str  # without the .open suffix (what entries name)
    size_bytes: int
    age_s: float
    sealed: bool = True  # False: still named .open (being appended to, or its writer died)

    @property
    def file_name(self) -> str:
        return self.name if self.sealed else self.name + OPEN_SUFFIX


def plan_segments(segments: Sequence[SegmentInfo], live: Sequence[E.Entry], *, open_names: set[str],
                  abandon_s: float, compact_live_ratio: float) -> tuple[list[SegmentInfo], list[SegmentInfo]]:
    """(segments to unlink, segments to compact) (pure): only sealed ones, and unsealed ones
    older than ``abandon_s`` (a writer that died), never one named in ``open_names``."""
    live_bytes: dict[str, int] = defaultdict(int)
    end: dict[str, int] = defaultdict(int)
    for e in live:
        if e.inline is None:
            live_bytes[e.seg_name] += e.value_bytes
            end[e.seg_name] = max(end[e.seg_name], e.seg_offset + e.value_bytes)
    remove: list[SegmentInfo] = []
    compact: list[SegmentInfo] = []
    for s in segments:
        if s.name in open_names or (not s.sealed and s.age_s < abandon_s):
            continue
        physical = max(s.size_bytes, end[s.name])
        if live_bytes[s.name] == 0:
            remove.append(s)
        elif live_bytes[s.name] < compact_live_ratio * physical:
            compact.append(s)
    return remove, compact


async def scan_index(cache: AsyncKVCache) -> list[tuple[str, E.Entry | None]]:
    """Every entry of the index (None: not a well-formed entry, or bytes that cannot be
    read as one: a ChecksumError, a stray directory; dropped by the pass as garbage, so one
    bad item never stops eviction). ``cache.stats.unreadable`` counts those."""
    c = cache.client
    out: list[tuple[str, E.Entry | None]] = []
    async for page in c.readdir_pages(cache.index_dir):
        names = [d.name for d in page]
        raw = await c.read_many([f"{cache.index_dir}/{n}" for n in names])
        for n, r in zip(names, raw, strict=True):
            if isinstance(r, FileNotFoundError):
                continue
            if isinstance(r, OSError):
                cache.stats.unreadable += 1
                logger.warning("kvcache %s: index item %s cannot be read (dropped): %s", cache.prefix, n, r)
                out.append((n, None))
                continue
            try:
                out.append((n, E.decode(r)))
            except E.EntryError:
                out.append((n, None))
    return out


async def _current(cache: AsyncKVCache, names: Sequence[str]) -> list[E.Entry | None]:
    """The entries at ``names`` now (None: gone or malformed)."""
    raw = await cache.client.read_many([f"{cache.index_dir}/{n}" for n in names])
    out: list[E.Entry | None] = []
    for r in raw:
        try:
            out.append(None if isinstance(r, OSError) else E.decode(r))
        except E.EntryError:
            out.append(None)
    return out


async def _unchanged(cache: AsyncKVCache, items: Sequence[tuple[str, E.Entry | None]]) -> list[str]:
    """The names among ``items`` whose entry still holds what was scanned."""
    now = await _current(cache, [n for n, _ in items])
    return [n for (n, was), cur in zip(items, now, strict=True) if (cur is not None and cur == was)
            or (cur is None and was is None)]


async def _remove_entries(cache: AsyncKVCache, items: Sequence[tuple[str, E.Entry | None]]) -> int:
    if not items:
        return 0
    names = await _unchanged(cache, items)
    for _, e in items:
        if e is not None:
            cache.icache.forget(e.key)
    errors = await cache.client.rm_many([f"{cache.index_dir}/{n}" for n in names])
    return sum(err is None for err in errors)


async def _move(cache: AsyncKVCache, entries: Sequence[tuple[str, E.Entry]]) -> tuple[int, int, int]:
    """Move the values of ``entries`` to this writer's segment: (moved, dropped as bad, left:
    entries that still name the old place, their rewrite having lost to a change each time).
    Each entry is rewritten only if unchanged since read (``_rewrite``): a put, delete or
    touch made meanwhile wins, and the new place is then named by no entry."""
    bufs = [bytearray(e.value_bytes) for _, e in entries]
    slots = asyncio.Semaphore(MOVE_READS_INFLIGHT)

    async def read(e: E.Entry, buf: bytearray) -> bool:
        async with slots:
            return await cache.read_value_into(e, memoryview(buf))

    ok = await run_all([read(e, b) for (_, e), b in zip(entries, bufs, strict=True)])
    good = [(n, e, b) for (n, e), b, fine in zip(entries, bufs, ok, strict=True) if fine]
    bad: list[tuple[str, E.Entry | None]] = [(n, e) for (n, e), fine in zip(entries, ok, strict=True) if not fine]
    dropped = await _remove_entries(cache, bad)
    if not good:
        return 0, dropped, 0
    async with cache.writer.append([memoryview(b) for _, _, b in good]) as placed:
        was = {e.key: (e, p) for (_, e, _), p in zip(good, placed, strict=True)}

        def decide(cur: E.Entry | None) -> E.Entry | None:
            if cur is None or cur.key not in was:
                return None
            e, p = was[cur.key]
            if not cur.same_place(e):
                return None  # put, deleted or moved since the scan: the newer entry stays
            # from the entry now: keeps a touch made meanwhile
            return dataclasses.replace(cur, seg_name=p.seg_name, seg_inode=p.seg_inode, seg_offset=p.offset,
                                       chunk_size=p.chunk_size, chains=p.chains)

        written, seen = await _rewrite.rewrite(cache, list(was), decide)
    left = sum(w is None and s is not None and s.same_place(was[s.key][0]) for w, s in zip(written, seen, strict=True))
    return sum(w is not None for w in written), dropped, left


async def evict_once(cache: AsyncKVCache) -> dict[str, int]:
    """One eviction and compaction pass; returns what it did."""
    cfg = cache.config
    c = cache.client
    # segments first: every entry of a segment sealed by now was written before this listing,
    # so the index scan that follows sees it (scanned the other way round, a segment sealed in
    # between would look empty and be removed under its entries)
    now_wall = time.time()
    segments = []
    async for page in c.readdir_pages(cache.seg_dir, with_attrs=True):
        for d in page:
            if d.attr is not None:
                sealed = not d.name.endswith(OPEN_SUFFIX)
                segments.append(SegmentInfo(d.name if sealed else d.name[: -len(OPEN_SUFFIX)], d.attr.size,
                                            now_wall - d.attr.ctime_ns / 1e9, sealed))
    scanned = await scan_index(cache)
    plan = plan_eviction(scanned, now_s=cache.clock(), ttl_s=cfg.ttl_s, capacity_bytes=cfg.capacity_bytes,
                         low_water=cfg.low_water)
    by_name = dict(scanned)
    removed = await _remove_entries(cache, [(n, by_name[n]) for n in plan.drop])
    cache.stats.evicted += removed

    current = cache.writer.current
    remove, compact = plan_segments(segments, [e for _, e in plan.live], open_names={current} if current else set(),
                                    abandon_s=cfg.segment_abandon_s, compact_live_ratio=cfg.compact_live_ratio)
    moved = dropped = left = 0
    for seg in compact:
        left_before = left
        todo = sorted(((n, e) for n, e in plan.live if e.inline is None and e.seg_name == seg.name),
                      key=lambda ne: ne[1].seg_offset)
        start = 0
        while start < len(todo):
            stop, size = start, 0
            while stop < len(todo) and (stop == start or size < MOVE_BATCH_BYTES):
                size += todo[stop][1].value_bytes
                stop += 1
            m, bad_n, left_n = await _move(cache, todo[start:stop])
            moved, dropped, left = moved + m, dropped + bad_n, left + left_n
            start = stop
        if left == left_before:  # else entries still name it: the next pass compacts it again
            remove.append(seg)
    unlinked = 0
    for seg in remove:
        try:
            await c.unlink(f"{cache.seg_dir}/{seg.file_name}")
            unlinked += 1
        except FileNotFoundError:
            pass
    tmp_removed = await _rewrite.sweep_tmp(cache, cfg.segment_abandon_s)
    cache.stats.segments_removed += unlinked
    cache.stats.values_moved += moved
    result = {"entries": len(scanned), "removed": removed, "expired": plan.expired, "evicted": plan.evicted,
              "garbage": plan.garbage, "live_bytes": plan.live_bytes, "segments_removed": unlinked,
              "segments_compacted": len(compact), "values_moved": moved, "moved_dropped": dropped,
              "moved_left": left, "tmp_removed": tmp_removed}
    logger.debug("kvcache %s: eviction pass %s", cache.prefix, result)
    return result
