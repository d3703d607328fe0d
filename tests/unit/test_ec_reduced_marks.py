"""Reduced-redundancy EC writes (``ec_ack_fragments_min``) mark the file (``Layout.ec_reduced``)
and reads of a marked file compare versions: a skipped fragment whose server comes back with
the old bytes is never served (docs/ec.md, the defect found by review in session 13). Over an
in-memory fragment store (no sockets)."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest
from test_ec_repair_race import VersionedIO
from test_ec_write_gaps import FakeIO, make_file

from loomfs.client import ec_stripe as es
from loomfs.client.ec_file import STATS
from loomfs.ec.codec import make_codec
from loomfs.ec.stripe import Geometry
from loomfs.meta.ops.files import mark_ec_reduced
from loomfs.meta.store.base import decode_layout, encode_layout
from loomfs.meta.store.sqlite import SqliteStore
from loomfs.net.buffers import BufferPool
from loomfs.wire.types import Attr, FileType, Layout


class GeoIO(VersionedIO):
    """Versioned fragment chunks (fenced repairs) with another geometry; ``down_slots``:
    fragments whose server is down (in place and in the shadow)."""

    def __init__(self, g: Geometry) -> None:
        super().__init__()
        self.geometry = g
        self.down_slots: set[int] = set()

    def down(self, index: int) -> bool:
        return index % self.geometry.width in self.down_slots

    async def remove_one(self, index: int) -> None:
        assert not self.down(index), "a down server's chunk is never asked for"
        await self.remove_all(index, index + 1)


async def _write(io: GeoIO, data: bytes, *, overwrite: bool, ack_min: int = 0, marks: list[str] | None = None,
                 above: int = 0) -> int:
    g = io.geometry
    buf = bytearray(es.stripe_buffer_bytes(g))
    for j in range(g.k):
        part = data[j * g.chunk_size : (j + 1) * g.chunk_size]
        es.payload(g, buf, j)[: len(part)] = part

    async def mark() -> None:
        assert marks is not None
        marks.append("mark")

    return await es.write_stripe(io, make_codec(g.k, g.m), STATS, 0, buf, len(data), valid_lo=0, valid_hi=len(data),
                                 overwrite=overwrite, ack_min=ack_min, above_version=above,
                                 mark_reduced=mark if marks is not None else None)


async def _read(io: GeoIO, n: int, *, verify: bool) -> bytes:
    g = io.geometry
    out = bytearray(n)
    await es.read_range(io, make_codec(g.k, g.m), STATS, BufferPool(), 0, memoryview(out), verify=verify)
    return bytes(out)


@pytest.mark.parametrize("k,m,down", [(4, 2, {1}), (2, 3, {0, 1})])
def test_a_skipped_fragment_back_with_old_bytes_is_not_served_from_a_marked_file(
    k: int, m: int, down: set[int],
) -> None:
    """k=2, m=3 with both data fragments skipped: their old bytes agree with each other (k of
    them), so only all k+m fragments tell the newest version."""
    g = Geometry(k, m, 4096)
    io = GeoIO(g)
    old, new = bytes([1]) * g.stripe_bytes, bytes([2]) * g.stripe_bytes

    async def go() -> None:
        v1 = await _write(io, old, overwrite=False)
        io.down_slots = set(down)
        marks: list[str] = []
        await _write(io, new, overwrite=True, ack_min=g.width - len(down), marks=marks, above=v1)
        assert marks == ["mark", "mark"]  # before the fragments are written, and after
        io.down_slots = set()  # the skipped servers come back with the old fragments
        assert await _read(io, len(new), verify=False) != new  # the defect: a healthy read mixes
        assert await _read(io, len(new), verify=True) == new
        await es.repairs_settled()  # the verified read repaired the old fragments
        assert await _read(io, len(new), verify=False) == new

    asyncio.run(go())


def test_a_full_write_marks_nothing() -> None:
    io = GeoIO(Geometry(4, 2, 4096))
    marks: list[str] = []
    asyncio.run(_write(io, b"x" * 100, overwrite=False, ack_min=5, marks=marks))
    assert marks == []


def test_the_open_file_marks_meta_and_then_reads_with_versions() -> None:
    calls: list[dict[str, Any]] = []

    class Meta:
        async def sync(self, inode: int, length: int, **kw: Any) -> None:
            calls.append({"inode": inode, "length": length, **kw})

    io = FakeIO()
    e, f = make_file(io, BufferPool())
    f.inode, f.session_id, f._trunc_epoch, f._meta = 7, 99, 3, Meta()
    assert not e.verify
    asyncio.run(e._mark_reduced())
    assert calls == [{"inode": 7, "length": -1, "trunc_epoch": 3, "session_id": 99, "ec_reduced": True}]
    assert e.verify


def _ec_attr(gen: int = 0, *, ec: bool = True) -> Attr:
    lay = Layout(chunk_size=4096, stripe=6, chains=[1, 2, 3, 4, 5, 6], ec_k=4 if ec else 0, ec_m=2 if ec else 0,
                 replicas=1, ec_reduced=gen)
    return Attr(inode=40, type=FileType.FILE, layout=lay)


def test_meta_marks_a_new_generation_and_clears_only_the_one_a_scrub_started_with() -> None:
    s = SqliteStore(":memory:")

    async def gen_after(attr: Attr, mark: bool, done: int) -> int:
        async with s.write() as t:
            await t.put_inode(attr)
            await mark_ec_reduced(t, attr, mark, done)
        async with s.read() as t:
            got = await t.get_inode(40)
        assert got is not None and got.layout is not None
        return got.layout.ec_reduced

    async def go() -> None:
        assert await gen_after(_ec_attr(0), True, 0) == 1
        assert await gen_after(_ec_attr(1), True, 0) == 2
        assert await gen_after(_ec_attr(2), False, 1) == 2  # marked again since the scrub began
        assert await gen_after(_ec_attr(2), False, 2) == 0
        assert await gen_after(_ec_attr(0, ec=False), True, 0) == 0  # replicated files: no mark
        await s.close()

    asyncio.run(go())


@pytest.mark.parametrize("lay", [
    Layout(chunk_size=1 << 20, chains=[3], ec_k=4, ec_m=2, ec_reduced=7),
    Layout(chunk_size=1 << 20, chains=[3], ec_k=4, ec_m=2, durable=True, ec_reduced=1),
    Layout(chunk_size=1 << 20, chains=[3], ec_k=4, ec_m=2, durable=True),
    Layout(chunk_size=1 << 20, chains=[3], ec_k=4, ec_m=2),
])
def test_the_mark_is_stored_with_the_layout(lay: Layout) -> None:
    assert decode_layout(encode_layout(lay)) == lay
    if not lay.ec_reduced and not lay.durable:  # older layouts keep their shorter encoding
        assert len(encode_layout(lay) or b"") == len(encode_layout(Layout(chunk_size=1 << 20, chains=[3], ec_k=4,
                                                                          ec_m=2)) or b"")


def test_make_file_harness_is_unchanged() -> None:
    """The shared harness still builds a file without a mark (reads without versions)."""
    e, _f = make_file(FakeIO(), BufferPool())
    assert isinstance(e.file, types.SimpleNamespace) and not e.verify
