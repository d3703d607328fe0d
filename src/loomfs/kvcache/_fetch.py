"""The value half of ``AsyncKVCache``'s get path: a value's bytes read from its segment (or
its entry, inline) into the caller's buffer or a fresh one, checked against the entry's
CRC32C (bytes that fail it are a miss, never returned), runs of values close together in
one chunk read at once (``_reads``) or scattered straight into their destinations
(``_scatter``), and the hits' LRU touches queued. ``ValueFetch`` is a mixin of
``AsyncKVCache`` (``_core``), which sets the attributes it declares."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import crc32c

from loomfs.client.layout import split_range
from loomfs.kvcache import _entry as E
from loomfs.kvcache._crccat import tiled_crc
from loomfs.kvcache._jobs import run_all
from loomfs.kvcache._reads import Run
from loomfs.kvcache._scatter import SCATTER_RUNS, ScatterPlan, scatter_plan
from loomfs.kvcache._values import Target, rebuild
from loomfs.wire.types import Layout

if TYPE_CHECKING:
    from loomfs.client.core import AsyncClient
    from loomfs.kvcache._config import KVConfig, KVStats

logger = logging.getLogger(__name__)

TOUCHES_PENDING_MAX = 65536


class ValueFetch:
    """Reading the values that entries name, and the bookkeeping of a hit."""

    client: AsyncClient
    config: KVConfig
    stats: KVStats
    prefix: str
    clock: Callable[[], float]
    _touches: dict[str, E.Entry]

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
                # a piece that fails cancels the others and waits for them: none writes into
                # ``view`` (a caller's buffer) once this has raised
                await run_all([store.read_chunk(layout, e.seg_inode, p.index, p.offset, p.length,
                                                view[p.buffer_offset : p.buffer_offset + p.length])
                               for p in pieces])
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
        """Each value of a run read into ``scratch``: checked (hashed unless ``checked``),
        copied into its target or a fresh buffer, handed out. The per-value work is kept lean
        (a 1 MiB run of 16 KiB values is 64 of these per request): the entry's fields read
        once, one CRC, one copy, the hits' bookkeeping once per run (``_hits``)."""
        crc = crc32c.crc32c
        start = r.start
        hits: list[E.Entry] = []
        for i in r.members:
            e = entries[i]
            assert e is not None
            n = e.value_bytes
            at = e.seg_offset % e.chunk_size - start
            view = scratch[at : at + n]
            if not checked and crc(view) != e.value_crc:
                self.stats.corrupt += 1
                continue
            t = targets[i]
            if t is not None:
                t.fit(n)[:] = view
                out[i] = t.result(n)
            elif e.kind == E.KIND_BYTES:
                out[i] = bytearray(view)
            else:
                value = self._rebuild(e, bytearray(view))
                if value is None:
                    continue
                out[i] = value
            hits.append(e)
        self._hits(hits)

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
        self._hits((e,))

    def _hits(self, hits: Sequence[E.Entry]) -> None:
        """The bookkeeping of hits: bytes counted, and an LRU touch queued for each whose
        entry was last touched ``touch_after_s`` ago or more (half the TTL if shorter)."""
        if not hits:
            return
        self.stats.get_bytes += sum(e.value_bytes for e in hits)
        after_s = self.config.touch_after_s
        if self.config.ttl_s:
            after_s = min(after_s, self.config.ttl_s / 2)
        stale = self.clock() - after_s  # entries touched before this are touched again
        touches = self._touches
        for e in hits:
            if e.touched_s <= stale and len(touches) < TOUCHES_PENDING_MAX:
                touches[E.entry_name(e.key)] = e
