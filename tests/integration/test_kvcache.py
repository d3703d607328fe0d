"""KVCache against a real local cluster: round trips, batches, TTL, eviction, compaction,
several writer processes."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import loomfs
from loomfs.kvcache import KVCache
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
CHUNK_BYTES = 256 << 10


def _seg_file(fs: loomfs.LoomFS, kv_dir: str, seg_name: str) -> str:
    """The path of segment ``seg_name`` (sealed, or still .open)."""
    names = fs.listdir(f"{kv_dir}/seg")
    return f"{kv_dir}/seg/" + next(n for n in names if n in (seg_name, seg_name + ".open"))


class FakeClock:
    def __init__(self, now_s: float = 1_000_000.0):
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture()
def kv_dir(fs: loomfs.LoomFS, base: str) -> str:
    fs.makedirs(f"{base}/kv", exist_ok=True)
    fs.set_layout(f"{base}/kv", chunk_size=CHUNK_BYTES)
    return f"{base}/kv"


@pytest.fixture()
def kv(fs: loomfs.LoomFS, kv_dir: str) -> Iterator[KVCache]:
    cache = KVCache(fs, kv_dir, background_interval_s=0)
    yield cache
    cache.close()


def test_round_trip_every_kind(kv: KVCache) -> None:
    blob = os.urandom(100_000)
    kv.put(b"bytes", blob)
    kv.put(b"empty", b"")
    arr = np.random.default_rng(1).standard_normal((4, 8, 16)).astype(np.float16)
    kv.put(b"numpy", arr)
    t = torch.randn(2, 4, 64, 32).to(torch.bfloat16)
    kv.put(b"torch", t)
    assert bytes(kv.get(b"bytes")) == blob
    assert bytes(kv.get(b"empty")) == b""
    back = kv.get(b"numpy")
    assert isinstance(back, np.ndarray) and back.dtype == np.float16 and np.array_equal(back, arr)
    tb = kv.get(b"torch")
    assert isinstance(tb, torch.Tensor) and tb.dtype == torch.bfloat16 and torch.equal(tb, t)
    assert kv.get(b"missing") is None
    # zero-copy into the caller's buffers
    into = torch.empty_like(t)
    assert kv.get(b"torch", into=into) is into and torch.equal(into, t)
    buf = bytearray(len(blob) + 10)
    got = kv.get(b"bytes", into=buf)
    assert bytes(got) == blob and bytes(buf[: len(blob)]) == blob
    with pytest.raises(ValueError):  # EINVAL: the buffer is too small
        kv.get(b"bytes", into=bytearray(10))
    # an allocator: told the value's size, dtype and shape, it returns the buffer to read into
    seen = []

    def alloc(info: object) -> torch.Tensor:
        seen.append(info)
        return torch.empty(info.shape, dtype=getattr(torch, info.dtype))  # type: ignore[attr-defined]

    got_t, got_miss = kv.get_many([b"torch", b"missing"], into=[alloc, alloc])
    assert torch.equal(got_t, t) and got_miss is None and len(seen) == 1
    assert (seen[0].nbytes, seen[0].kind, seen[0].shape) == (t.numel() * 2, "torch", (2, 4, 64, 32))
    # a value bigger than a chunk spans chunks (read in pieces)
    big = os.urandom(3 * CHUNK_BYTES + 5)
    kv.put(b"big", big)
    assert bytes(kv.get(b"big")) == big


def test_batches_overwrite_delete_contains(kv: KVCache) -> None:
    items = [(b"k%03d" % i, os.urandom(1000 + i * 977)) for i in range(64)]
    items.append((b"k000", b"last wins"))
    kv.put_many(items)
    keys = [k for k, _ in items[:64]] + [b"nope"]
    got = kv.get_many(keys)
    assert bytes(got[0]) == b"last wins"
    assert [bytes(g) for g in got[1:64]] == [v for _, v in items[1:64]]
    assert got[64] is None
    assert kv.contains_many([b"k001", b"nope"]) == [True, False]
    bufs = [bytearray(len(v)) for _, v in items[1:5]]
    assert [bytes(b) for b in kv.get_many([k for k, _ in items[1:5]], into=bufs)] == [v for _, v in items[1:5]]
    assert kv.delete(b"k001") is True and kv.delete(b"k001") is False
    assert kv.get(b"k001") is None
    kv.put(b"k002", b"new")
    assert bytes(kv.get(b"k002")) == b"new"
    long_key = bytes(range(256)) * 2  # named by its hash
    kv.put(long_key, b"v")
    assert bytes(kv.get(long_key)) == b"v" and kv.get(long_key[:-1] + b"\x00") is None


def test_inline_small_values(fs: loomfs.LoomFS, kv_dir: str, calls: object) -> None:
    with KVCache(fs, kv_dir, inline_value_max_bytes=16 << 10, background_interval_s=0) as kv:
        vals = {b"s%d" % i: os.urandom(16 << 10) for i in range(32)}
        calls.methods.clear()  # type: ignore[attr-defined]
        kv.put_many(vals)
        got = kv.get_many(list(vals))
        # one PUT_MANY and one READ_MANY: no storage round trip for inline values
        assert calls.methods == ["put_many", "read_many"]  # type: ignore[attr-defined]
        assert [bytes(g) for g in got] == list(vals.values())
        kv.put(b"big", os.urandom(20 << 10))  # over the inline limit: a segment
        assert len(kv.get(b"big")) == 20 << 10


def test_big_batch_asks_meta_in_groups(fs: loomfs.LoomFS, kv_dir: str, calls: object) -> None:
    """A get_many of more keys than META_GROUP_KEYS asks meta in groups (each group's values read
    while meta answers the next): every value and miss comes back in place."""
    from loomfs.kvcache import _get

    n = 2 * _get.META_GROUP_KEYS + 44 if _get.META_GROUP_KEYS > 0 else 300
    with KVCache(fs, kv_dir, background_interval_s=0) as kv:
        vals = {b"g%d" % i: os.urandom(1000 + i) for i in range(n) if i % 7}
        kv.put_many(vals)
        keys = [b"g%d" % i for i in range(n)]
        calls.methods.clear()  # type: ignore[attr-defined]
        got = kv.get_many(keys)
        for k, g in zip(keys, got, strict=True):
            assert (None if g is None else bytes(g)) == vals.get(k), k
        groups = -(-n // _get.META_GROUP_KEYS) if _get.META_GROUP_KEYS > 0 else 1
        assert calls.methods.count("read_many") == groups  # type: ignore[attr-defined]


def test_ttl_and_touch(fs: loomfs.LoomFS, kv_dir: str) -> None:
    clock = FakeClock()
    with KVCache(fs, kv_dir, ttl_s=10.0, clock=clock, background_interval_s=0, touch_after_s=1e9) as kv:
        kv.put_many([(b"a", b"1"), (b"b", b"2")])
        clock.now_s += 8
        assert kv.touch(b"a") is True and kv.touch(b"zz") is False
        clock.now_s += 5  # b: 13 s old; a: touched 5 s ago
        assert kv.get(b"b") is None and bytes(kv.get(b"a")) == b"1"
        assert kv.contains_many([b"a", b"b"]) == [True, False]
        r = kv.evict_now()
        assert r["expired"] == 1 and r["removed"] == 1
        assert not fs.exists(f"{kv_dir}/index/{b'b'.hex()}")
        # the hit on "a" above (5 s after its touch: half the TTL) is written as a touch, so it
        # lives 10 s from that hit, not from the explicit touch
        assert kv.maintain() is not None and kv.stats.touches_written == 1
        clock.now_s += 8
        assert bytes(kv.get(b"a")) == b"1"
        clock.now_s += 3
        assert kv.get(b"a") is None


def test_capacity_evicts_least_recently_used(fs: loomfs.LoomFS, kv_dir: str) -> None:
    clock = FakeClock()
    with KVCache(fs, kv_dir, capacity_bytes=10 * 4096, clock=clock, background_interval_s=0,
                 touch_after_s=0.5, low_water=1.0) as kv:
        for i in range(16):
            clock.now_s += 1
            kv.put(b"v%02d" % i, bytes([i]) * 4096)
        clock.now_s += 1
        assert kv.get(b"v00") is not None and kv.get(b"v01") is not None  # hits: used recently
        assert kv.maintain() is not None  # writes the touches, holds the lease, evicts
        present = kv.contains_many([b"v%02d" % i for i in range(16)])
        kept = {i for i, p in enumerate(present) if p}
        assert kept == {0, 1} | set(range(8, 16)), kept
        assert kv.stats.touches_written == 2


def _sealed(fs: loomfs.LoomFS, seg_dir: str, count: int) -> list[str]:
    """The segment file names once ``count`` of them are sealed (sealing runs in the background)."""
    import time

    deadline = time.monotonic() + 30
    while True:
        names = fs.listdir(seg_dir)
        if sum(not n.endswith(".open") for n in names) >= count or time.monotonic() > deadline:
            return names
        time.sleep(0.02)


def test_compaction_moves_live_values_and_removes_segments(fs: loomfs.LoomFS, kv_dir: str) -> None:
    with KVCache(fs, kv_dir, background_interval_s=0, segment_roll_s=0.001) as kv:
        vals = {b"c%02d" % i: os.urandom(8 << 10) for i in range(32)}
        keys = list(vals)
        for b in range(8):  # segment_roll_s tiny: each batch retires the previous segment
            kv.put_many([(k, vals[k]) for k in keys[4 * b : 4 * b + 4]])
        segs_before = _sealed(fs, f"{kv_dir}/seg", 7)
        assert len(segs_before) == 8 and [n for n in segs_before if n.endswith(".open")] == [segs_before[-1]]
        # segments 0-3: all dead; 4-6: one value of four lives; 7: still open
        dead = keys[:16] + [k for i, k in enumerate(keys[16:28]) if i % 4]
        kv.delete_many(dead)
        r = kv.evict_now()
        assert (r["segments_removed"], r["segments_compacted"], r["values_moved"]) == (7, 3, 3), r
        for k, v in vals.items():
            got = kv.get(k)
            assert (bytes(got) if got is not None else None) == (None if k in dead else v)
        after = fs.listdir(f"{kv_dir}/seg")
        assert not set(after) & set(segs_before[:-1])  # the sealed ones went; moved values live on


def test_unsealed_segments_wait_for_their_entries(fs: loomfs.LoomFS, kv_dir: str) -> None:
    """An .open segment (its writer may still be writing entries for it) is left alone by a
    compactor however empty it looks, until it is segment_abandon_s old."""
    with KVCache(fs, kv_dir, background_interval_s=0, segment_roll_s=300) as kv:
        kv.put(b"x", b"v" * 10_000)
        kv.delete(b"x")  # the open segment now holds no live value
        assert kv.evict_now()["segments_removed"] == 0
        kv.aio.config.__dict__["segment_abandon_s"] = 0.0  # as if its writer died long ago
        kv.aio.writer._file = None  # this object no longer appends to it (as after a crash)
        assert kv.evict_now()["segments_removed"] == 1
        assert fs.listdir(f"{kv_dir}/seg") == []


def _writer_proc(cluster_root: str, prefix: str, n: int, rank: int) -> None:
    fs = loomfs.connect(cluster_root)
    with KVCache(fs, prefix, background_interval_s=0.2) as kv:
        for j in range(0, n, 8):
            kv.put_many([(b"p%d-%03d" % (rank, i), bytes([rank]) * (20_000 + i)) for i in range(j, j + 8)])
            kv.put(b"shared", b"%d" % rank * 1000)
    fs.close()


def test_concurrent_writer_processes(cluster: LocalCluster, fs: loomfs.LoomFS, kv_dir: str) -> None:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer_proc, args=(str(cluster.root), kv_dir, 32, r)) for r in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
        assert p.exitcode == 0
    with KVCache(fs, kv_dir, background_interval_s=0) as kv:
        for r in range(3):
            got = kv.get_many([b"p%d-%03d" % (r, i) for i in range(32)])
            assert [bytes(g) for g in got] == [bytes([r]) * (20_000 + i) for i in range(32)]
        shared = bytes(kv.get(b"shared"))
        assert shared in {b"%d" % r * 1000 for r in range(3)}
        assert len({n.split("-")[0] for n in fs.listdir(f"{kv_dir}/seg")}) == 3  # a segment per writer


def test_torn_value_is_a_miss(fs: loomfs.LoomFS, kv: KVCache, kv_dir: str) -> None:
    from loomfs.kvcache import _entry as E

    kv.put(b"torn", os.urandom(100_000))
    kv.put(b"fine", b"y" * 50_000)
    e = E.decode(fs.cat(f"{kv_dir}/index/{b'torn'.hex()}"))
    with fs.open(_seg_file(fs, kv_dir, e.seg_name), "r+b") as f:  # as a write that half landed
        f.seek(e.seg_offset + 5000)
        f.write(b"\x00" * 100)
    assert kv.get(b"torn") is None and kv.stats.corrupt == 1
    assert bytes(kv.get(b"fine")) == b"y" * 50_000
    # an entry whose descriptor does not fit its bytes (not written by this code): a miss
    kv.put(b"arr", np.zeros(100, dtype=np.float32))
    path = f"{kv_dir}/index/{b'arr'.hex()}"
    fs.pipe(path, E.encode(dataclasses.replace(E.decode(fs.cat(path)), desc="<f4;7,7")))
    assert kv.get(b"arr") is None and kv.stats.corrupt == 2


def test_index_cache_skips_meta_and_recovers_from_stale_entries(fs: loomfs.LoomFS, kv_dir: str,
                                                                calls: object) -> None:
    from loomfs.kvcache import _entry as E

    a = KVCache(fs, kv_dir, background_interval_s=0, index_cache_s=60.0)
    b = KVCache(fs, kv_dir, background_interval_s=0)  # another writer (its own segment)
    try:
        vals = {b"ic%02d" % i: os.urandom(16 << 10) for i in range(16)}
        a.put_many(vals)
        calls.methods.clear()  # type: ignore[attr-defined]
        got = a.get_many(list(vals))
        assert [bytes(g) for g in got] == list(vals.values())
        assert calls.methods == ["read"]  # type: ignore[attr-defined]  # one chunk read, no meta
        e1 = E.decode(fs.cat(f"{kv_dir}/index/{b'ic00'.hex()}"))
        b.put(b"ic00", b"newer value" * 3000)
        # within the cache's time a's get may still answer the value it saw (complete, checked)
        assert bytes(a.get(b"ic00")) in (vals[b"ic00"], b"newer value" * 3000)
        with fs.open(_seg_file(fs, kv_dir, e1.seg_name), "r+b") as f:  # the old bytes go away
            f.seek(e1.seg_offset)
            f.write(b"\x00" * 64)
        assert bytes(a.get(b"ic00")) == b"newer value" * 3000  # CRC failed: asked meta
        a.delete(b"ic01")
        assert a.get(b"ic01") is None  # this process's own delete is seen at once
    finally:
        a.close()
        b.close()


def test_background_task_evicts_over_capacity(fs: loomfs.LoomFS, kv_dir: str) -> None:
    import time

    with KVCache(fs, kv_dir, capacity_bytes=8 * 4096, background_interval_s=0.1, evict_interval_s=0.1,
                 low_water=0.5) as kv:
        kv.put_many([(b"bg%02d" % i, bytes([i]) * 4096) for i in range(16)])
        deadline = time.monotonic() + 30
        while sum(kv.contains_many([b"bg%02d" % i for i in range(16)])) > 4:
            assert time.monotonic() < deadline, repr(kv)
            time.sleep(0.05)
        assert kv.stats.evicted >= 12
        assert fs.exists(f"{kv_dir}/evictor")  # it held the eviction lease


def _forked_child(kv: KVCache) -> None:
    kv.put(b"from-child", b"c" * 70_000)
    assert bytes(kv.get(b"from-parent")) == b"p" * 70_000
    kv.close()


def test_usable_after_fork(kv: KVCache) -> None:
    kv.put(b"from-parent", b"p" * 70_000)
    child = mp.get_context("fork").Process(target=_forked_child, args=(kv,))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert bytes(kv.get(b"from-child")) == b"c" * 70_000


def _versioned(key: bytes, version: int) -> bytes:
    head = key + b"|%08d|" % version
    return (head * (30_000 // len(head) + 1))[:30_000]


def _version_of(key: bytes, data: bytes) -> int:
    """The version ``data`` is a whole copy of (-1: not one: garbage)."""
    try:
        version = int(data[len(key) + 1 : len(key) + 9])
    except ValueError:
        return -1
    return version if data == _versioned(key, version) else -1


def _overwriter(cluster_root: str, prefix: str, keys: list[bytes], rounds: int) -> None:
    fs = loomfs.connect(cluster_root)
    with KVCache(fs, prefix, background_interval_s=0, segment_roll_s=0.05) as kv:
        for r in range(1, rounds + 1):
            kv.put_many([(k, _versioned(k, r)) for k in keys])
    fs.close()


def test_reads_during_overwrites_and_compaction_in_other_processes(cluster: LocalCluster, fs: loomfs.LoomFS,
                                                                   kv_dir: str) -> None:
    """A writer process overwrites keys in short-lived segments while this process compacts
    them away (meta's GC removes their chunks a second later) and reads with its index cache
    on: every value read is a whole version that was put."""
    import time

    keys = [b"ow%02d" % i for i in range(16)]
    with KVCache(fs, kv_dir, background_interval_s=0, index_cache_s=0.5, segment_roll_s=0.05,
                 compact_live_ratio=1.0) as kv:
        kv.put_many([(k, _versioned(k, 0)) for k in keys])
        writer = mp.get_context("spawn").Process(target=_overwriter, args=(str(cluster.root), kv_dir, keys, 40))
        writer.start()
        reads = moved = 0
        deadline = time.monotonic() + 90
        while writer.is_alive() and time.monotonic() < deadline:
            for k, got in zip(keys, kv.get_many(keys), strict=True):
                assert got is not None and _version_of(k, bytes(got)) >= 0, (k, bytes(got)[:40])
                reads += 1
            moved += kv.evict_now()["values_moved"]
        writer.join(30)
        assert writer.exitcode == 0
        final = [_version_of(k, bytes(g)) for k, g in zip(keys, kv.get_many(keys), strict=True)]
        assert all(v >= 0 for v in final), final
        print(f"[kvcache] {reads} values read during 40 overwrite rounds, {moved} moved by compaction, "
              f"{kv.stats.corrupt} stale reads fell back to meta; final versions {sorted(set(final))}")
        assert moved > 0 and reads > 0
