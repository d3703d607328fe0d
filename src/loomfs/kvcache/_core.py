"""``AsyncKVCache``: put/get of KV blocks on the async client core.

Layout under ``prefix``: ``index/<entry name>`` one small inline file per key (``_entry``),
``seg/<writer>-<seq>`` append-only segment files, one writer per cache object
(``_segments``), ``evictor`` the eviction lease, ``tmp/`` entries being rewritten
conditionally (touches, compaction: ``_rewrite``). A put appends the values to this writer's
segment, waits until storage acked them, then writes the entries (PUT_MANY: one meta round
trip per batch), so an entry never names bytes that were not stored. A get reads the entries
(READ_MANY, one request per ``META_GROUP_KEYS`` keys, all in flight) and then each value with one chunk read straight
into the caller's buffer, checked against the entry's CRC32C: bytes that do not match (a
segment compacted away under a reader, a torn write) are a miss, never returned. Concurrent
writers in other processes need no coordination: each appends to its own segments and the
last entry written for a key wins. The get path: ``_get`` (the entries) and ``_fetch`` (the
values' bytes); options and counters: ``_config``; eviction and compaction: ``_evict``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import crc32c

from loomfs.errors import InvalidArgument, LoomError
from loomfs.kvcache import _entry as E
from loomfs.kvcache import _rewrite
from loomfs.kvcache._config import KVConfig, KVStats
from loomfs.kvcache._get import GetPath
from loomfs.kvcache._icache import IndexCache
from loomfs.kvcache._segments import SegmentWriter
from loomfs.kvcache._values import as_bytes
from loomfs.wire.types import Layout

if TYPE_CHECKING:
    from loomfs.client.core import AsyncClient

logger = logging.getLogger(__name__)

ENTRY_OVERHEAD_BYTES_MAX = 8192 + E.KEY_BYTES_MAX  # header, chains, key, descriptor, names


class AsyncKVCache(GetPath):
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
        self.tmp_dir = f"{self.prefix}/tmp"
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
        await c.makedirs(self.tmp_dir, exist_ok=True)
        want = self.config.inline_value_max_bytes + ENTRY_OVERHEAD_BYTES_MAX
        for path, inline_max in ((self.index_dir, want), (self.tmp_dir, want), (self.seg_dir, 0)):
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
        if self._touches:  # a touch queued before this put must not write the old entry back
            for k in last:
                self._touches.pop(E.entry_name(k), None)
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
        try:
            errors = await self.client.put_many([(self._path(e.key), E.encode(e)) for e in entries])
        finally:  # a get in flight since before this write must not cache what it read
            for e in entries:
                self.icache.changed(e.key)
        for e, err in zip(entries, errors, strict=True):
            if err is None:
                self.icache.learn(e)
            else:
                self.icache.forget(e.key)
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first

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
            if self._touches:
                self._touches.pop(E.entry_name(k), None)
        try:
            errors = await self.client.rm_many([self._path(k) for k in ks])
        finally:  # a get in flight since before this delete must not cache what it read
            for k in ks:
                self.icache.changed(k)
                self.icache.forget(k)
        for err in errors:
            if err is not None and not isinstance(err, FileNotFoundError):
                raise err
        return [err is None for err in errors]

    async def touch(self, key: bytes) -> bool:
        """Mark ``key`` used now (its TTL starts again; LRU keeps it longer); False on a miss."""
        return (await self.touch_many([key]))[0]

    async def touch_many(self, keys: Sequence[bytes]) -> list[bool]:
        """Per key whether it had a live entry; each is rewritten with the time now, unless
        a put, delete or move changed it meanwhile (``_rewrite``)."""
        ks = list(dict.fromkeys(E.check_key(k) for k in keys))
        now = self.clock()

        def decide(cur: E.Entry | None) -> E.Entry | None:
            if cur is None or self._expired(cur, now):
                return None
            return cur.touched(max(now, cur.touched_s))

        written, seen = await _rewrite.rewrite(self, ks, decide)
        live = {k: w is not None or (s is not None and not self._expired(s, now))
                for k, w, s in zip(ks, written, seen, strict=True)}
        return [live[E.check_key(k)] for k in keys]

    async def flush_touches(self) -> int:
        """Write the pending LRU touches of recent hits (the background task does this). A
        touch is written only while the key still holds the value that was hit (same bytes;
        after a compaction move, at their new place); one whose key was put, deleted or
        changed since is dropped. Returns the touches written."""
        if not self._touches:
            return 0
        pending, self._touches = self._touches, {}
        hit = {e.key: e for e in pending.values()}
        now = self.clock()

        def decide(cur: E.Entry | None) -> E.Entry | None:
            was = hit.get(cur.key) if cur is not None else None
            if cur is None or was is None or not cur.same_value(was):
                return None
            return cur.touched(max(now, cur.touched_s))

        written, _ = await _rewrite.rewrite(self, list(hit), decide)
        n = sum(w is not None for w in written)
        self.stats.touches_written += n
        self.stats.touches_dropped += len(hit) - n
        return n

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
