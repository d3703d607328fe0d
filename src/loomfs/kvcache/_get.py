"""The get path of ``AsyncKVCache``: a get reads the entries (READ_MANY, one request per
``META_GROUP_KEYS`` keys, all in flight; or this process's index cache) and then the values
they name (``_fetch``), reads in flight bounded. ``GetPath`` is a mixin of ``AsyncKVCache``
(``_core``), which sets the attributes it declares."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence
from typing import Any

from loomfs.errors import InvalidArgument
from loomfs.kvcache import _entry as E
from loomfs.kvcache._fetch import ValueFetch
from loomfs.kvcache._icache import IndexCache
from loomfs.kvcache._index import read_entries
from loomfs.kvcache._jobs import run_all
from loomfs.kvcache._reads import Run, plan_reads
from loomfs.kvcache._values import Target, value_info

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


class GetPath(ValueFetch):
    """get/get_many and the index lookups behind them (``_entries``, also used by
    ``contains_many`` and ``touch_many``)."""

    index_dir: str
    icache: IndexCache

    def _path(self, key: bytes) -> str:
        return f"{self.index_dir}/{E.entry_name(key)}"

    async def get(self, key: bytes, into: Any = None) -> Any:
        return (await self.get_many([key], None if into is None else [into]))[0]

    async def get_many(self, keys: Sequence[bytes], into: Sequence[Any] | None = None) -> list[Any]:
        """Values of ``keys`` (None for a miss), aligned with ``keys``; ``into[i]`` (a
        writable buffer, ndarray or tensor, or None) receives value i without a copy.

        Raises ``InvalidArgument`` when an ``into=`` buffer is smaller than its value. Every
        buffer of one meta group (``META_GROUP_KEYS`` keys) is checked before any of the
        group's values is read; once get_many has raised, no read it started is running and
        none writes into a buffer later. Buffers of another group (or of index-cache hits)
        read before the error may hold their values."""
        ks = [E.check_key(k) for k in keys]
        if into is not None and len(into) != len(ks):
            raise InvalidArgument(f"get_many: {len(ks)} keys but {len(into)} into= buffers")
        targets: list[Any] = [None] * len(ks) if into is None else [_target(x) for x in into]
        since = self.icache.gen  # puts and deletes made here from now on win over what meta answers
        cached = [self.icache.get(k) for k in ks] if self.icache.ttl_s > 0 else [None] * len(ks)
        now = self.clock()
        cached = [e if e is not None and not self._expired(e, now) else None for e in cached]
        ask = [i for i, e in enumerate(cached) if e is None]
        if len(ask) < len(ks):
            out = await self._read_values(cached, targets)  # the cached ones
            # a cached entry whose bytes failed: ask meta about it too
            ask += [i for i, e in enumerate(cached) if e is not None and out[i] is None]
        else:
            out = [None] * len(ks)
        if ask:
            ask.sort()
            slots, big = asyncio.Semaphore(READS_INFLIGHT), asyncio.Semaphore(BIG_RUNS_INFLIGHT)

            async def group(part: list[int]) -> None:
                fresh = await self._entries([ks[i] for i in part], since)
                got = await self._read_values(fresh, [targets[i] for i in part], slots, big)
                for i, g in zip(part, got, strict=True):
                    out[i] = g

            step = META_GROUP_KEYS if META_GROUP_KEYS > 0 else len(ask)
            parts = [ask[j : j + step] for j in range(0, len(ask), step)]
            # meta answers one group while the values of the one before are read; a group that
            # fails (a buffer too small) cancels the others' reads and waits for them to end
            await run_all([group(p) for p in parts])
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
        for t, e in zip(targets, entries, strict=True):  # before any read is issued
            if e is not None and isinstance(t, Target) and len(t.view) < e.value_bytes:
                t.fit(e.value_bytes)  # raises: the buffer is too small
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
        # an error cancels the sibling reads and waits for them: none writes into a caller's
        # buffer after get_many has raised
        await run_all(jobs)
        return out

    async def _entries(self, keys: Sequence[bytes], since: int | None = None) -> list[E.Entry | None]:
        """The live (present, well-formed, unexpired) entries of ``keys``; the index cache
        learns them unless this process put or deleted the key since ``since``
        (``IndexCache.gen``; None: now)."""
        if since is None:
            since = self.icache.gen
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
                    self.icache.learn(r, since)
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
