"""The KV cache's pure parts: entry encoding, value kinds, segment packing, eviction plans."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from loomfs.errors import InvalidArgument
from loomfs.kvcache import _entry as E
from loomfs.kvcache._evict import SegmentInfo, plan_eviction, plan_segments
from loomfs.kvcache._segments import aligned_offset, segment_name, writer_of
from loomfs.kvcache._values import Target, as_bytes, rebuild


def _seg_entry(key: bytes, seg: str = "s", off: int = 0, n: int = 100, touched_s: float = 0.0) -> E.Entry:
    return E.Entry(key=key, touched_s=touched_s, value_bytes=n, value_crc=7, seg_name=seg, seg_inode=5,
                   seg_offset=off, chunk_size=1 << 20, chains=(1, 2, 3))


def test_entry_round_trip_segment_and_inline() -> None:
    e = E.Entry(key=b"k" * 32, touched_s=12.5, value_bytes=4096, value_crc=0xDEADBEEF, kind=E.KIND_TORCH,
                desc="float16;2,4", seg_name="00ff-00000001", seg_inode=1 << 40, seg_offset=123 << 20,
                chunk_size=4 << 20, chains=tuple(range(1, 17)))
    assert E.decode(E.encode(e)) == e
    i = E.Entry(key=b"\x00\x01", touched_s=1.0, value_bytes=3, value_crc=9, inline=b"abc")
    assert E.decode(E.encode(i)) == i


@pytest.mark.parametrize("cut", [0, 5, 40, 60])
def test_truncated_or_foreign_entries_are_errors(cut: int) -> None:
    data = E.encode(_seg_entry(b"abc"))
    with pytest.raises(E.EntryError):
        E.decode(data[:cut])
    with pytest.raises(E.EntryError):
        E.decode(b"\x00" * len(data))
    inline = E.encode(E.Entry(key=b"a", touched_s=0, value_bytes=10, value_crc=0, inline=b"x" * 10))
    with pytest.raises(E.EntryError):
        E.decode(inline[:-1])  # an inline value shorter than its length
    with pytest.raises(E.EntryError):
        E.decode(data + b"junk")  # a segment entry with trailing bytes


def test_key_checks_and_names() -> None:
    assert E.entry_name(b"\xab\xcd") == "abcd"
    long_key = bytes(range(200))
    name = E.entry_name(long_key)
    assert name.startswith("h") and len(name) == 65 and name != E.entry_name(long_key[:-1] + b"\x00")
    for bad in (b"", "text", 5, b"x" * (E.KEY_BYTES_MAX + 1)):
        with pytest.raises(InvalidArgument):
            E.check_key(bad)


def test_values_round_trip_every_kind() -> None:
    view, kind, desc = as_bytes(b"hello")
    assert (bytes(view), kind, desc) == (b"hello", E.KIND_BYTES, "")
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)[:, ::2]  # not contiguous: copied once
    view, kind, desc = as_bytes(a)
    back = rebuild(kind, desc, bytearray(view))
    assert kind == E.KIND_NUMPY and back.shape == (2, 2, 4) and np.array_equal(back, a)
    for dtype in (torch.bfloat16, torch.float16, torch.int8, torch.float32):
        t = torch.randn(3, 5).to(dtype)
        view, kind, desc = as_bytes(t)
        back = rebuild(kind, desc, bytearray(view))
        assert kind == E.KIND_TORCH and back.dtype == dtype and torch.equal(back, t)
    empty = torch.empty(0, 4)
    view, kind, desc = as_bytes(empty)
    assert len(view) == 0 and rebuild(kind, desc, bytearray()).shape == (0, 4)
    with pytest.raises(InvalidArgument):
        as_bytes("not bytes")
    with pytest.raises(InvalidArgument):
        as_bytes(np.array([object()]))


def test_into_targets() -> None:
    buf = bytearray(10)
    t = Target(buf)
    t.fit(10)[:] = b"0123456789"
    assert t.result(10) is buf and buf == b"0123456789"
    assert bytes(Target(bytearray(16)).result(4)) == b"\x00" * 4
    with pytest.raises(InvalidArgument):
        Target(bytearray(3)).fit(4)
    with pytest.raises(InvalidArgument):
        Target(b"read only")
    tensor = torch.zeros(4, dtype=torch.float32)
    tt = Target(tensor)
    tt.fit(16)[:] = memoryview(np.arange(4, dtype=np.float32).view(np.uint8))
    assert tt.result(16) is tensor and tensor.tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(InvalidArgument):
        Target(torch.zeros(4, 4).t())  # not contiguous
    arr = np.zeros(3, dtype=np.int64)
    Target(arr).fit(24)[:] = memoryview(np.array([7, 8, 9], dtype=np.int64).view(np.uint8))
    assert arr.tolist() == [7, 8, 9]


def test_values_never_cross_a_chunk_unless_bigger() -> None:
    cs = 1 << 20
    assert aligned_offset(0, cs, cs) == 0
    assert aligned_offset(cs - 10, 100, cs) == cs  # would cross: next chunk
    assert aligned_offset(cs - 100, 100, cs) == cs - 100  # fits exactly
    assert aligned_offset(10, 3 * cs, cs) == 10  # bigger than a chunk: spans, read in pieces
    assert aligned_offset(5, 0, cs) == 5
    assert writer_of(segment_name(0xABC, 7)) == 0xABC
    assert writer_of("evictor") is None and writer_of("zzzzzzzzzzzzzzzz-1") is None


def test_eviction_plan_ttl_capacity_lru() -> None:
    scanned = [(f"k{i}", _seg_entry(b"k%d" % i, touched_s=float(i))) for i in range(10)]
    scanned.append(("bad", None))
    plan = plan_eviction(scanned, now_s=100.0, ttl_s=95.5, capacity_bytes=10_000, low_water=0.9)
    assert plan.garbage == 1 and plan.expired == 5 and plan.evicted == 0  # touched 0..4 expired
    assert sorted(plan.drop) == ["bad", "k0", "k1", "k2", "k3", "k4"]
    plan = plan_eviction(scanned[:10], now_s=100.0, ttl_s=0, capacity_bytes=500, low_water=0.8)
    # 1000 bytes live, goal 400: the six least recently touched go
    assert plan.drop == ["k0", "k1", "k2", "k3", "k4", "k5"] and plan.live_bytes == 400
    assert [n for n, _ in plan.live] == ["k6", "k7", "k8", "k9"]


def test_segment_plan_only_sealed() -> None:
    live = [_seg_entry(b"a", "s1", 0, 100), _seg_entry(b"b", "s2", 0, 900),
            E.Entry(key=b"c", touched_s=0, value_bytes=5, value_crc=0, inline=b"12345")]
    segs = [SegmentInfo("s0", 1000, 99.0), SegmentInfo("s1", 1000, 99.0), SegmentInfo("s2", 1000, 99.0),
            SegmentInfo("s3", 0, 1.0, sealed=False), SegmentInfo("s4", 1000, 99.0),
            SegmentInfo("s5", 0, 700.0, sealed=False)]
    remove, compact = plan_segments(segs, live, open_names={"s4"}, abandon_s=600.0, compact_live_ratio=0.5)
    # s3 unsealed and young (its writer may still write entries), s4 this writer's open one;
    # s5 unsealed for 700 s: its writer is gone
    assert [s.file_name for s in remove] == ["s0", "s5.open"]
    assert [s.name for s in compact] == ["s1"]  # 10% live; s2 90% live stays


def test_read_plan_coalesces_neighbours_in_one_chunk() -> None:
    from loomfs.kvcache._reads import plan_reads

    cs = 1 << 20
    def seg(off: int, n: int, inode: int = 5) -> E.Entry:
        return E.Entry(key=b"k", touched_s=0, value_bytes=n, value_crc=0, seg_name="s", seg_inode=inode,
                       seg_offset=off, chunk_size=cs, chains=(1,))
    entries = [seg(0, 1000), seg(1000, 1000), None, seg(200_000, 1000),  # far: alone
               seg(2 * cs + 10, 500), seg(2 * cs + 600, 500),  # chunk 2: one run
               seg(3000, 1000, inode=6), seg(0, 2 << 20),  # another segment: alone; bigger than a chunk
               E.Entry(key=b"i", touched_s=0, value_bytes=1, value_crc=0, inline=b"x"), seg(2100, 900)]
    alone, runs = plan_reads(entries, gap_max_bytes=1000)
    assert alone == [3, 6, 7]
    got = sorted((r.seg_inode, r.chunk_index, r.start, r.end, r.members) for r in runs)
    assert got == [(5, 0, 0, 3000, [0, 1, 9]), (5, 2, 10, 1100, [4, 5])]
