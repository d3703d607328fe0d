"""Hunt 16 (meta removes or cuts data it must keep) on PostgreSQL, with two meta processes: two
``Namespace`` objects, each on its own ``PostgresStore`` of one database (each with its own
trimmer), and a model of the chunks for storage (``test_meta_trim.Chunks``). ManualClock."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Awaitable, Iterator
from typing import TypeVar

import pytest

from loomfs.common.clock import ManualClock
from loomfs.common.routing import Routing
from loomfs.meta.gc import GcWorker
from loomfs.meta.ops.inline import Patch
from loomfs.meta.ops.namespace import Namespace
from loomfs.meta.store.base import MetaStore
from loomfs.meta.trim import Trimmer
from loomfs.wire.types import ChainInfo, ChainTable, Layout, RoutingInfo

pytestmark = [pytest.mark.integration]

T = TypeVar("T")
W = os.O_WRONLY
CREAT = os.O_WRONLY | os.O_CREAT
MIB = 1 << 20


class FakeRouting:
    def __init__(self, chains: int) -> None:
        ids = list(range(101, 101 + chains))
        self.routing = Routing(RoutingInfo(version=1, chains=[ChainInfo(chain_id=c, targets=[c], table_id=1) for c in ids],
                                           tables=[ChainTable(table_id=1, replicas=1, chain_ids=ids)]))

    async def get(self) -> Routing:
        return self.routing

    async def refresh(self, min_version: int = 0) -> Routing:
        return self.routing


class WritingChunks:
    """Chunk contents per (inode, index) with the storage calls meta makes (as the unit tests'
    ``test_meta_trim.Chunks`` and ``test_meta_inline.WritingChunks``, which this directory
    cannot import)."""

    def __init__(self) -> None:
        self.data: dict[tuple[int, int], bytearray] = {}
        self.calls: list[tuple[str, int, int]] = []

    async def truncate_chunk(self, layout: Layout, inode: int, index: int, length: int, *,
                             fenced: bool = False) -> None:
        self.calls.append(("truncate", inode, index))
        chunk = self.data.setdefault((inode, index), bytearray())
        del chunk[length:]
        chunk.extend(bytes(length - len(chunk)))

    async def remove_chunks(self, layout: Layout, inode: int, index_begin: int, index_end: int = 1 << 62, *,
                            keep_versions: bool = False, fenced: bool = False) -> None:
        self.calls.append(("remove", inode, index_begin))
        for key in [k for k in self.data if k[0] == inode and index_begin <= k[1] < index_end]:
            del self.data[key]

    async def remove_files_chunks(self, files: list[tuple[int, Layout]]) -> None:
        for inode, layout in files:
            await self.remove_chunks(layout, inode, 0)

    async def write_chunk(self, layout: Layout, inode: int, index: int, offset: int, data: memoryview) -> None:
        self.write(inode, index * MIB + offset, bytes(data))

    def write(self, inode: int, offset: int, payload: bytes) -> None:
        done = 0
        while done < len(payload):
            index, off = divmod(offset + done, MIB)
            n = min(MIB - off, len(payload) - done)
            chunk = self.data.setdefault((inode, index), bytearray())
            if len(chunk) < off:
                chunk.extend(bytes(off - len(chunk)))
            chunk[off : off + n] = payload[done : done + n]
            done += n

    def read(self, inode: int, offset: int, length: int) -> bytes:
        out = bytearray(length)
        done = 0
        while done < length:
            index, off = divmod(offset + done, MIB)
            n = min(MIB - off, length - done)
            seg = self.data.get((inode, index), b"")[off : off + n]
            out[done : done + len(seg)] = seg
            done += n
        return bytes(out)


class TwoMetas:
    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock()
        self.chunks = WritingChunks()
        routing = FakeRouting(8)
        layout = Layout(chunk_size=MIB, stripe=4, table_id=1, inline_max_bytes=4096)
        self.stores = [MetaStore.open(url), MetaStore.open(url)]
        self.ns: list[Namespace] = []
        for k, store in enumerate(self.stores):
            ns = Namespace(store, routing=routing, clock=self.clock, rng=random.Random(k), default_layout=layout,
                           chunk_writer=self.chunks)
            ns.trimmer = Trimmer(store, self.chunks, clock=self.clock, owner=0x1000 + k, wait_s=0.0)
            self.ns.append(ns)
        self.run(self.ns[0].init())

    def run(self, aw: Awaitable[T]) -> T:
        async def main() -> T:
            return await aw

        return self.loop.run_until_complete(main())

    def gc(self, k: int) -> GcWorker:
        return GcWorker(self.stores[k], self.chunks, delay_s=60.0, clock=self.clock, trimmer=self.ns[k].trimmer,
                        files_per_s=0)

    def gc_pending(self) -> int:
        return self.run(self.ns[0].statfs()).gc_pending

    def close(self) -> None:
        for s in self.stores:
            self.run(s.close())
        self.loop.close()


@pytest.fixture
def metas(pg_url: str) -> Iterator[TwoMetas]:
    m = TwoMetas(pg_url)
    yield m
    m.close()


def _trim_exists(m: TwoMetas, inode: int) -> bool:
    async def go() -> bool:
        async with m.stores[1].read() as t:
            return await t.trim_get(inode) is not None
    return m.run(go())


def test_an_inline_writer_on_one_meta_hears_the_epoch_only_after_the_other_metas_cut(metas: TwoMetas) -> None:
    """``test_meta_hunt16_inline_epoch`` across two metas: the truncate commits on meta 0, which
    dies before its cut; the inline writer's WRITE_INLINE (the file is in chunks) on meta 1."""
    a, b, chunks = metas.ns[0], metas.ns[1], metas.chunks
    w = metas.run(b.open("/f", CREAT, client_id=1))
    ino = w.attr.inode
    assert metas.run(b.write_inline(ino, w.session_id, [Patch(0, b"hello")])).applied
    metas.run(a.migrate(ino))
    x = metas.run(a.open("/f", W, client_id=2))
    chunks.write(ino, 0, b"x" * (3 * MIB))
    metas.run(a.close(ino, x.session_id, 3 * MIB, trunc_epoch=x.trunc_epoch))
    a.trimmer = None  # meta 0 commits the truncate and dies before cutting
    assert metas.run(a.setattr("/f", size=MIB)).trunc_epoch == 1 and _trim_exists(metas, ino)
    rsp = metas.run(b.write_inline(ino, w.session_id, [Patch(2 * MIB, b"late!")]))
    assert not rsp.applied and rsp.trunc_epoch == 1 and not _trim_exists(metas, ino)
    chunks.write(ino, 2 * MIB, b"late!")
    attr = metas.run(b.close(ino, w.session_id, 2 * MIB + 5, trunc_epoch=rsp.trunc_epoch))
    assert attr is not None and attr.size == 2 * MIB + 5
    metas.run(metas.gc(1).run_once())
    assert chunks.read(ino, 2 * MIB, 5) == b"late!" and chunks.read(ino, MIB, 8) == bytes(8)


def test_a_size_set_on_one_meta_keeps_a_writers_bytes_past_an_idle_trim(metas: TwoMetas) -> None:
    """``test_meta_hunt16_trims`` across two metas: the idle trim is queued by meta 0, the size
    set (an extend under an open writer) is made on meta 1."""
    a, b, chunks = metas.ns[0], metas.ns[1], metas.chunks
    stale = metas.run(a.open("/f", CREAT, client_id=1, chunked=True))
    ino = stale.attr.inode
    metas.run(a.setattr("/f", size=0))
    fresh = metas.run(b.open("/f", W, client_id=2))
    chunks.write(ino, 0, b"fresh!")
    chunks.write(ino, 100, b"stale")
    metas.run(a.close(ino, stale.session_id, 105, trunc_epoch=stale.trunc_epoch))
    assert _trim_exists(metas, ino)  # idle: a writer is open
    metas.run(b.setattr("/f", size=50))
    assert chunks.read(ino, 0, 6) == b"fresh!"
    metas.run(b.close(ino, fresh.session_id, 6, trunc_epoch=fresh.trunc_epoch))
    assert chunks.read(ino, 0, 105) == b"fresh!" + bytes(99)


def test_open_unlinked_across_metas_is_removed_only_after_its_last_close(metas: TwoMetas) -> None:
    """Held: a file open for write on meta 0 and unlinked on meta 1 stays (an orphan) through GC
    rounds on both metas past gc_delay_s; its close on meta 0 queues it, and GC removes it
    gc_delay_s after the unlink. One name of a two-link file unlinked on meta 1 queues nothing."""
    a, b, chunks = metas.ns[0], metas.ns[1], metas.chunks
    o = metas.run(a.open("/f", CREAT, client_id=1, chunked=True))
    ino = o.attr.inode
    chunks.write(ino, 0, b"kept" * 100)
    metas.run(b.link("/f", "/g"))
    metas.run(b.unlink("/g"))
    assert metas.run(b.unlink("/f")) == (ino, False)
    assert metas.gc_pending() == 0
    metas.clock.advance(120)
    for k in (0, 1):
        metas.run(metas.gc(k).run_once())
    assert chunks.read(ino, 0, 4) == b"kept" and chunks.calls == []
    attr = metas.run(a.close(ino, o.session_id, 400, trunc_epoch=o.trunc_epoch))
    assert attr is None and metas.gc_pending() == 1  # queued as of the unlink: due now
    assert metas.run(metas.gc(1).run_once()) == 1
    assert chunks.read(ino, 0, 4) == bytes(4) and metas.gc_pending() == 0

    # the other way round: opened on meta 1, renamed over on meta 0; a GC round before the close
    o2 = metas.run(b.open("/v", CREAT, client_id=2, chunked=True))
    chunks.write(o2.attr.inode, 0, b"victim")
    metas.run(a.open("/n", CREAT, client_id=3))
    metas.run(a.rename("/n", "/v"))
    metas.clock.advance(120)
    metas.run(metas.gc(0).run_once())
    assert chunks.read(o2.attr.inode, 0, 6) == b"victim"
    metas.run(b.close(o2.attr.inode, o2.session_id, 6, trunc_epoch=o2.trunc_epoch))
    metas.run(metas.gc(0).run_once())
    assert chunks.read(o2.attr.inode, 0, 6) == bytes(6)


