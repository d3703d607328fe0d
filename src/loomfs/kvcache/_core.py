"""``AsyncKVCache``: put/get of KV blocks on the async client core.

Layout under ``prefix``: ``index/<entry name>`` one small inline file per key (``_entry``),
``seg/<writer>-<seq>`` append-only segment files, one writer per cache object
(``_segments``), ``evictor`` the eviction lease. A put appends the values to this writer's
segment, waits until storage acked them, then writes the entries (PUT_MANY: one meta round
trip per batch), so an entry never names bytes that were not stored. A get reads the entries
(READ_MANY, one request per ``META_GROUP_KEYS`` keys, all in flight) and then each value with one chunk read straight
into the caller's buffer, checked against the entry's CRC32C: bytes that do not match (a
segment compacted away under a reader, a torn write) are a miss, never returned. Concurrent
writers in other processes need no coordination: each appends to its own segments and the
last entry written for a key wins. Eviction and compaction: ``_evict``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import random
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import crc32c

from loomfs.client.layout import split_range
from loomfs.errors import InvalidArgument, LoomError
from loomfs.kvcache import _entry as E
from loomfs.kvcache._crccat import tiled_crc
from loomfs.kvcache._icache import IndexCache
from loomfs.kvcache._index import read_entries
from loomfs.kvcache._reads import Run, plan_reads
from loomfs.kvcache._scatter import SCATTER_RUNS, ScatterPlan, scatter_plan
from loomfs.kvcache._segments import SegmentWriter
from loomfs.kvcache._values import Target, as_bytes, rebuild, value_info
from loomfs.wire.types import Layout

if TYPE_CHECKING:
    from loomfs.client.core import AsyncClient

logger = logging.getLogger(__name__)

READS_INFLIGHT = 64  # value reads in flight per get_many
# whole-chunk runs (scratch buffers of a chunk, 16 MiB by default) in flight per get_many: 8 x 16 MiB
# stays within the buffer pool's bound (256 MiB), so their scratch is reused memory, not fresh
# pages (3-5 us per 4 KiB here); still 8 big reads at once over the storage servers
BIG_RUNS_INFLIGHT = 8
BIG_RUN_BYTES = 4 << 20
# keys asked of meta per READ_MANY within one get_many: meta answers the next group while this
# process reads the values of the one before (0: one request for all). The bench's
# kv_get_16k_b256 (entries from meta, values from the disk), 2 pairs, load 2-5: 23.8k / 23.5k
# values/s vs 16.6k / 21.2k with one request (hot values from meta: no gain through the noise,
# docs/kvcache.md); LOOMFS_KV_META_GROUP for A/B
META_GROUP_KEYS = int(os.environ.get("LOOMFS_KV_META_GROUP", "128"))
TOUCHES_PENDING_MAX = 65536
ENTRY_OVERHEAD_BYTES_MAX = 8192 + E.KEY_BYTES_MAX  # header, chains, key, descriptor, names


def _decode_or_error(data: memoryview) -> E.Entry | E.EntryError:
    """An index entry from meta's reply, or why its bytes are none (a miss, logged)."""
    try:
        return E.decode(data)
    except E.EntryError as exc:
        return exc


def _target(into: Any) -> Any:
    """A caller's ``into=`` item: None, an allocator (called with the value's ``ValueInfo``
    once its entry is known, returning the buffer), or a buffer, array or tensor."""
    if into is None:
        return None
    if type(into) is bytearray:
        return Target(into)
    if callable(into) and not hasattr(into, "untyped_storage") and not hasattr(into, "__array_interface__"):
        return into
    return Target(into)


@dataclasses.dataclass
class KVStats:
    hits: int = 0
    misses: int = 0
    expired: int = 0
    corrupt: int = 0  # values whose bytes failed their CRC (returned as misses)
    read_errors: int = 0  # value reads that failed after retries (returned as misses)
    puts: int = 0
    put_bytes: int = 0
    get_bytes: int = 0
    touches_written: int = 0
    evicted: int = 0
    segments_removed: int = 0
    values_moved: int = 0


@dataclasses.dataclass(frozen=True)
class KVConfig:
    capacity_bytes: int = 1 << 40
    ttl_s: float = 0.0  # 0 = no expiry
    inline_value_max_bytes: int = 0  # values up to this size live in their index entry (meta)
    segment_bytes: int = 256 << 20
    # chunk size of the segments (0, or a prefix whose layout has another chunk size than the
    # default: the prefix's layout): a whole-chunk run of 8 x 2 MiB values is
    # one request instead of four (per GiB of hot 2 MiB gets: client + storage 0.95-1.05 CPU-s vs
    # 1.18-1.24 with 4 MiB chunks, docs/kvcache.md); smaller values are read in runs of <= 1 MiB
    segment_chunk_bytes: int = 16 << 20
    segment_roll_s: float = 60.0
    background_interval_s: float = 2.0  # 0 = no background task (call maintain() yourself)
    evict: bool = True  # this cache object may run eviction and compaction (under the lease)
    evict_interval_s: float = 30.0  # at most one eviction/compaction pass (an index scan) this often
    low_water: float = 0.9  # eviction stops at this fraction of capacity
    compact_live_ratio: float = 0.5  # sealed segments with less live data are compacted
    # a hit rewrites its entry's time (LRU, and the TTL starts again) once the entry is this old
    # (or half the TTL, if shorter): recency at this granularity, one meta write per key at most
    touch_after_s: float = 30.0
    segment_abandon_s: float = 600.0  # an unsealed (.open) segment this old: its writer is gone
    index_cache_s: float = 0.0  # reuse an index entry seen here for this long (0 = ask meta every get)

    def check(self) -> None:
        if self.capacity_bytes <= 0 or self.ttl_s < 0 or self.segment_bytes <= 0 or self.segment_roll_s <= 0:
            raise InvalidArgument("kvcache: capacity_bytes and segment sizes must be > 0, ttl_s >= 0")
        cs = self.segment_chunk_bytes
        if cs < 0 or (cs and (cs & (cs - 1) or not 64 << 10 <= cs <= 64 << 20)):
            raise InvalidArgument("kvcache: segment_chunk_bytes is 0 or a power of two from 64 KiB to 64 MiB")
        if self.segment_abandon_s <= self.segment_roll_s:
            raise InvalidArgument("kvcache: segment_abandon_s must exceed segment_roll_s (a live writer's "
                                  "open segment would look abandoned)")
        if not 0 < self.low_water <= 1 or not 0 <= self.compact_live_ratio <= 1:
            raise InvalidArgument("kvcache: low_water in (0, 1], compact_live_ratio in [0, 1]")


class AsyncKVCache:
    def __init__(self, client: AsyncClient, prefix: str, config: KVConfig | None = None, *,
                 clock: Callable[[], float] = time.time, writer_id: int | None = None):
        self.client = client
        self.prefix = prefix.rstrip("/") or "/"
        self.config = config or KVConfig()
        self.config.check()
        cap = client.config.inline_put_max_bytes - ENTRY_OVERHEAD_BYTES_MAX
        if self.config.inline_value_max_bytes > max(cap, 0):
            raise InvalidArgument(f"kvcache: inline_value_max_bytes > {max(cap, 0)} (the client's "
                                  "inline_put_max_bytes less the entry's own bytes)")
        self.index_dir = f"{self.prefix}/index"
        self.seg_dir = f"{self.prefix}/seg"
        self.lease_path = f"{self.prefix}/evictor"
        self.clock = clock
        self.writer_id = writer_id or random.getrandbits(63) or 1
        self.writer = SegmentWriter(client, self.seg_dir, self.writer_id, segment_bytes=self.config.segment_bytes,
                                    roll_s=self.config.segment_roll_s)
        self.stats = KVStats()
        self._touches: dict[str, E.Entry] = {}
        self.icache = IndexCache(self.config.index_cache_s)
        self._task: asyncio.Task[None] | None = None
        self._last_pass_s = -float("inf")  # monotonic time of the last eviction pass here
        self.closed = False

    async def open(self) -> AsyncKVCache:
        """Make the directories (entries inline in meta, segments always in chunks) and start
        the background task."""
        c = self.client
        await c.makedirs(self.index_dir, exist_ok=True)
        await c.makedirs(self.seg_dir, exist_ok=True)
        want = self.config.inline_value_max_bytes + ENTRY_OVERHEAD_BYTES_MAX
        for path, inline_max in ((self.index_dir, want), (self.seg_dir, 0)):
            cur = await c.get_layout(path) or Layout()
            # a prefix whose chunk size was set away from the default keeps it for its segments
            default = cur.chunk_size == Layout().chunk_size
            chunk = self.config.segment_chunk_bytes if path == self.seg_dir and default else 0
            if (cur.inline_max_bytes < inline_max or (inline_max == 0 and cur.inline_max_bytes != 0)
                    or (chunk and cur.chunk_size != chunk)):
                await c.set_layout(path, dataclasses.replace(cur, chains=[], inline_max_bytes=inline_max,
                                                             chunk_size=chunk or cur.chunk_size))
        if self.config.background_interval_s > 0:
            self._task = asyncio.get_running_loop().create_task(self._background(), name="loomfs-kvcache")
        return self

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(LoomError, OSError):
            await self.flush_touches()
        await self.writer.close()

    def _path(self, key: bytes) -> str:
        return f"{self.index_dir}/{E.entry_name(key)}"

    # --- put ----------------------------------------------------------------------------

    async def put(self, key: bytes, value: Any) -> None:
        await self.put_many([(key, value)])

    async def put_many(self, items: Iterable[tuple[bytes, Any]] | dict[bytes, Any]) -> None:
        """Store many values (a key named twice keeps its last value). Values go to this
        writer's segment first; their entries are written once storage acked them. Raises
        the first error (entries of the other items may have been written)."""
        pairs = list(items.items()) if isinstance(items, dict) else list(items)
        last: dict[bytes, tuple[memoryview, int, str]] = {}
        for key, value in pairs:
            last[E.check_key(key)] = as_bytes(value)
        if not last:
            return
        now = self.clock()
        inline_max = self.config.inline_value_max_bytes
        big = [(k, v) for k, v in last.items() if len(v[0]) > inline_max]
        entries: list[E.Entry] = []
        for k, (view, kind, desc) in last.items():
            if len(view) <= inline_max:
                data = bytes(view)
                entries.append(E.Entry(key=k, touched_s=now, value_bytes=len(data), value_crc=crc32c.crc32c(data),
                                       kind=kind, desc=desc, inline=data))
        if not big:
            await self._write_entries(entries)
        else:
            async with self.writer.append([v[0] for _, v in big]) as placed:
                for (k, (view, kind, desc)), p in zip(big, placed, strict=True):
                    entries.append(E.Entry(key=k, touched_s=now, value_bytes=len(view),
                                           value_crc=crc32c.crc32c(view), kind=kind, desc=desc, seg_name=p.seg_name,
                                           seg_inode=p.seg_inode, seg_offset=p.offset, chunk_size=p.chunk_size,
                                           chains=p.chains))
                await self._write_entries(entries)
        self.stats.puts += len(last)
        self.stats.put_bytes += sum(len(v[0]) for v in last.values())

    async def _write_entries(self, entries: Sequence[E.Entry]) -> None:
        """Write index entries (one PUT_MANY per batch); this process's index cache learns them."""
        if not entries:
            return
        errors = await self.client.put_many([(self._path(e.key), E.encode(e)) for e in entries])
        for e, err in zip(entries, errors, strict=True):
            if err is None:
                self.icache.learn(e)
            else:
                self.icache.forget(e.key)
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first

    # --- get ----------------------------------------------------------------------------

    async def get(self, key: bytes, into: Any = None) -> Any:
        return (await self.get_many([key], None if into is None else [into]))[0]

    async def get_many(self, keys: Sequence[bytes], into: Sequence[Any] | None = None) -> list[Any]:
        """Values of ``keys`` (None for a miss), aligned with ``keys``; ``into[i]`` (a
        writable buffer, ndarray or tensor, or None) receives value i without a copy."""
        ks = [E.check_key(k) for k in keys]
        if into is not None and len(into) != len(ks):
            raise InvalidArgument(f"get_many: {len(ks)} keys but {len(into)} into= buffers")
        targets: list[Any] = [None] * len(ks) if into is None else [_target(x) for x in into]
        cached = [self.icache.get(k) for k in ks] if self.icache.ttl_s > 0 else [None] * len(ks)
        now = self.clock()
        cached = [e if e is not None and not self._expired(e, now) else None for e in cached]
        ask = [i for i, e in enumerate(cached) if e is None]
        out = await self._read_values(cached, targets)  # the cached ones (none when off)
        # a cached entry whose bytes failed: ask meta about it too
        ask += [i for i, e in enumerate(cached) if e is not None and out[i] is None]
        if ask:
            ask.sort()
            slots, big = asyncio.Semaphore(READS_INFLIGHT), asyncio.Semaphore(BIG_RUNS_INFLIGHT)

            async def group(part: list[int]) -> None:
                fresh = await self._entries([ks[i] for i in part])
                got = await self._read_values(fresh, [targets[i] for i in part], slots, big)
                for i, g in zip(part, got, strict=True):
                    out[i] = g

            step = META_GROUP_KEYS if META_GROUP_KEYS > 0 else len(ask)
            parts = [ask[j : j + step] for j in range(0, len(ask), step)]
            if len(parts) == 1:
                await group(parts[0])
            else:  # meta answers one group while the values of the one before are read
                await asyncio.gather(*(group(p) for p in parts))
        hits = sum(r is not None for r in out)
        self.stats.hits += hits
        self.stats.misses += len(ks) - hits
        return out

    def _expired(self, e: E.Entry, now_s: float) -> bool:
        return bool(self.config.ttl_s) and e.touched_s + self.config.ttl_s < now_s

    async def _read_values(self, entries: Sequence[E.Entry | None], targets: Sequence[Any],
                           slots: asyncio.Semaphore | None = None, big: asyncio.Semaphore | None = None) -> list[Any]:
        """The values ``entries`` name (None: no entry, or bytes failing the CRC); ``slots``
        and ``big`` bound reads in flight (shared by the groups of one get)."""
        out: list[Any] = [None] * len(entries)
        targets = [_target(t(value_info(e.value_bytes, e.kind, e.desc))) if e is not None and callable(t)
                   and not isinstance(t, Target) else t for t, e in zip(targets, entries, strict=True)]
        slots = asyncio.Semaphore(READS_INFLIGHT) if slots is None else slots
        alone, runs = plan_reads(entries)

        async def one(i: int) -> None:
            e = entries[i]
            assert e is not None
            async with slots:
                try:
                    out[i] = await self._value(e, targets[i])
                except InvalidArgument:
                    raise  # the caller's buffer does not fit
                except OSError as exc:
                    self._read_failed(exc)

        big = asyncio.Semaphore(BIG_RUNS_INFLIGHT) if big is None else big

        async def run(r: Run) -> None:
            async with slots, (big if r.end - r.start >= BIG_RUN_BYTES else contextlib.nullcontext()):
                try:
                    await self._read_run(r, entries, targets, out)
                except InvalidArgument:
                    raise
                except OSError as exc:
                    self._read_failed(exc)

        jobs = [one(i) for i, e in enumerate(entries) if e is not None and e.inline is not None]
        jobs += [one(i) for i in alone] + [run(r) for r in runs]
        if len(jobs) == 1:
            await jobs[0]
        elif jobs:
            await asyncio.gather(*jobs)
        return out

    async def _entries(self, keys: Sequence[bytes]) -> list[E.Entry | None]:
        """The live (present, well-formed, unexpired) entries of ``keys``."""
        raw = await read_entries(self.client, [self._path(k) for k in keys], _decode_or_error)
        now = self.clock()
        out: list[E.Entry | None] = []
        for k, r in zip(keys, raw, strict=True):
            if isinstance(r, E.Entry):
                if r.key != k:
                    out.append(None)  # another key with the same hash name
                elif self._expired(r, now):
                    self.stats.expired += 1
                    out.append(None)
                else:
                    self.icache.learn(r)
                    out.append(r)
            elif isinstance(r, E.EntryError):
                logger.warning("kvcache %s: bad entry for %s: %s", self.prefix, k.hex()[:32], r)
                self.stats.corrupt += 1
                out.append(None)
            elif isinstance(r, FileNotFoundError):
                self.icache.forget(k)
                out.append(None)
            else:
                raise r
        return out

    async def read_value_into(self, e: E.Entry, view: memoryview) -> bool:
        """Read ``e``'s bytes into ``view`` (its exact size); False when they fail the CRC."""
        if e.inline is not None:
            view[:] = e.inline
        elif e.value_bytes:
            layout = Layout(chunk_size=e.chunk_size, chains=list(e.chains))
            pieces = list(split_range(layout, e.seg_offset, e.value_bytes))
            store = self.client.storage
            with_crc = getattr(store, "read_chunk_crc", None)
            if len(pieces) == 1 and with_crc is not None:
                p = pieces[0]
                _, wire_crc = await with_crc(layout, e.seg_inode, p.index, p.offset, p.length, view)
                if wire_crc == e.value_crc:
                    return True  # the reply's CRC, checked on arrival, is the value's: no second pass
            else:
                reads = [store.read_chunk(layout, e.seg_inode, p.index, p.offset, p.length,
                                          view[p.buffer_offset : p.buffer_offset + p.length])
                         for p in pieces]
                if len(reads) == 1:
                    await reads[0]
                else:
                    await asyncio.gather(*reads)
        if crc32c.crc32c(view) != e.value_crc:
            self.stats.corrupt += 1
            logger.info("kvcache %s: value of %s fails its CRC (moved or torn): a miss",
                        self.prefix, e.key.hex()[:32])
            return False
        return True

    async def _value(self, e: E.Entry, target: Target | None) -> Any:
        if target is not None:
            if not await self.read_value_into(e, target.fit(e.value_bytes)):
                return None
            self._hit(e)
            return target.result(e.value_bytes)
        if e.inline is not None and e.kind == E.KIND_BYTES:
            if crc32c.crc32c(e.inline) != e.value_crc:
                self.stats.corrupt += 1
                return None
            self._hit(e)
            return e.inline
        buf = bytearray(e.value_bytes)
        if not await self.read_value_into(e, memoryview(buf)):
            return None
        value = self._rebuild(e, buf)
        if value is not None:
            self._hit(e)
        return value

    async def _read_run(self, r: Run, entries: Sequence[E.Entry | None], targets: Sequence[Target | None],
                        out: list[Any]) -> None:
        """Values close together in one chunk: one read, then each checked and handed out."""
        first = entries[r.members[0]]
        assert first is not None
        layout = Layout(chunk_size=first.chunk_size, chains=list(first.chains))
        store = self.client.storage
        with_crc = getattr(store, "read_chunk_crc", None)
        if SCATTER_RUNS and with_crc is not None:
            plan = scatter_plan(r, entries, targets, self._rebuild)
            if plan is not None:
                _, run_crc = await with_crc(layout, r.seg_inode, r.chunk_index, r.start, r.end - r.start,
                                            plan.scatter)
                self._hand_out_scattered(r, entries, plan, run_crc, out)
                return
        pool = self.client.pool  # reused scratch: fresh memory costs 3-5 us per 4 KiB page here
        held = pool.acquire(r.end - r.start)
        try:  # the scratch goes back to the pool: every value handed out is copied out of it
            scratch = memoryview(held)[: r.end - r.start]
            wire_crc: int | None = None
            if with_crc is not None:
                _, wire_crc = await with_crc(layout, r.seg_inode, r.chunk_index, r.start, len(scratch), scratch)
            else:
                await store.read_chunk(layout, r.seg_inode, r.chunk_index, r.start, len(scratch), scratch)
            # the values tile the range and their CRCs combine to the one checked on arrival:
            # every value is intact, none is hashed again
            checked = wire_crc is not None and tiled_crc(r, entries) == wire_crc
            self._hand_out_run(r, entries, targets, out, scratch, checked)
        finally:
            pool.release(held)

    def _hand_out_scattered(self, r: Run, entries: Sequence[E.Entry | None], plan: ScatterPlan,
                            wire_crc: int | None, out: list[Any]) -> None:
        """A run of big values read straight into their destinations (no scratch, no copy):
        the chunk CRC is checked on arrival and the values' CRCs combine to it, else each value
        is hashed and one failing its CRC is a miss (its destination holds torn bytes)."""
        checked = wire_crc is not None and tiled_crc(r, entries) == wire_crc
        for i, view, result in plan.values:
            e = entries[i]
            assert e is not None
            if not checked and crc32c.crc32c(view) != e.value_crc:
                self.stats.corrupt += 1
                continue
            value = result()
            if value is None:
                continue
            out[i] = value
            self._hit(e)

    def _hand_out_run(self, r: Run, entries: Sequence[E.Entry | None], targets: Sequence[Target | None],
                      out: list[Any], scratch: memoryview, checked: bool) -> None:
        for i in r.members:
            e = entries[i]
            assert e is not None
            at = e.seg_offset % e.chunk_size - r.start
            view = scratch[at : at + e.value_bytes]
            if not checked and crc32c.crc32c(view) != e.value_crc:
                self.stats.corrupt += 1
                continue
            t = targets[i]
            if t is not None:
                t.fit(e.value_bytes)[:] = view
                out[i] = t.result(e.value_bytes)
            else:
                out[i] = bytearray(view) if e.kind == E.KIND_BYTES else self._rebuild(e, bytearray(view))
                if out[i] is None:
                    continue
            self._hit(e)

    def _read_failed(self, exc: OSError) -> None:
        """A value read that failed after the storage client's retries (its chain had no
        replica answering within the call timeout): a miss, so the caller recomputes."""
        self.stats.read_errors += 1
        logger.warning("kvcache %s: value read failed (a miss): %s", self.prefix, exc)

    def _rebuild(self, e: E.Entry, buf: bytearray | memoryview) -> Any:
        """The stored kind over ``buf``; None (a miss) when the entry's descriptor does not fit
        its bytes (an entry not written by this code)."""
        try:
            return rebuild(e.kind, e.desc, buf)
        except (ValueError, TypeError, RuntimeError) as exc:
            self.stats.corrupt += 1
            logger.warning("kvcache %s: entry of %s: descriptor %r does not fit its value: %s",
                           self.prefix, e.key.hex()[:32], e.desc, exc)
            return None

    def _hit(self, e: E.Entry) -> None:
        self.stats.get_bytes += e.value_bytes
        after_s = self.config.touch_after_s
        if self.config.ttl_s:
            after_s = min(after_s, self.config.ttl_s / 2)
        if self.clock() - e.touched_s >= after_s and len(self._touches) < TOUCHES_PENDING_MAX:
            self._touches[E.entry_name(e.key)] = e

    # --- the rest of the API ----------------------------------------------------------------

    async def contains_many(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether each key has a live entry (one meta round trip per batch, no value reads)."""
        return [e is not None for e in await self._entries([E.check_key(k) for k in keys])]

    async def delete(self, key: bytes) -> bool:
        """Remove ``key``; False when it was not there. Its bytes go at compaction."""
        return (await self.delete_many([key]))[0]

    async def delete_many(self, keys: Sequence[bytes]) -> list[bool]:
        ks = [E.check_key(k) for k in keys]
        for k in ks:
            self.icache.forget(k)
        errors = await self.client.rm_many([self._path(k) for k in ks])
        for err in errors:
            if err is not None and not isinstance(err, FileNotFoundError):
                raise err
        return [err is None for err in errors]

    async def touch(self, key: bytes) -> bool:
        """Mark ``key`` used now (its TTL starts again; LRU keeps it longer); False on a miss."""
        return (await self.touch_many([key]))[0]

    async def touch_many(self, keys: Sequence[bytes]) -> list[bool]:
        ks = [E.check_key(k) for k in keys]
        entries = await self._entries(ks)
        now = self.clock()
        await self._write_entries([e.touched(now) for e in entries if e is not None])
        return [e is not None for e in entries]

    async def flush_touches(self) -> int:
        """Write the pending LRU touches of recent hits (the background task does this)."""
        if not self._touches:
            return 0
        pending, self._touches = self._touches, {}
        now = self.clock()
        await self._write_entries([e.touched(now) for e in pending.values()])
        self.stats.touches_written += len(pending)
        return len(pending)

    async def maintain(self) -> dict[str, int]:
        """One round of background work: touches, sealing an old segment, eviction and
        compaction when this object holds the eviction lease."""
        from loomfs.kvcache import _evict

        await self.flush_touches()
        await self.writer.roll_if_old()
        now = time.monotonic()
        if not self.config.evict or now - self._last_pass_s < self.config.evict_interval_s:
            return {}
        if not await _evict.take_lease(self):
            return {}
        self._last_pass_s = now
        return await _evict.evict_once(self)

    async def _background(self) -> None:
        interval = self.config.background_interval_s
        while not self.closed:
            await asyncio.sleep(interval * (0.75 + random.random() / 2))
            try:
                await self.maintain()
            except Exception as exc:  # the next round tries again; the task must not die
                logger.warning("kvcache %s: background round failed: %r", self.prefix, exc)

    def __repr__(self) -> str:
        s = self.stats
        return (f"AsyncKVCache({self.prefix} writer={self.writer_id:#x} hits={s.hits} misses={s.misses} "
                f"puts={s.puts} evicted={s.evicted} corrupt={s.corrupt})")
