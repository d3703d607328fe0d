"""KVCache background writers racing puts, deletes and gets: LRU touches and compaction moves
are conditional (``_rewrite``), a scan survives unreadable index items, and a get never
re-learns an entry this process deleted or replaced while it was in flight. Each test fails
on the code before the fix; interleavings are forced with hooks, never with sleeps."""

# ruff: noqa: F811  (the fixtures imported from the sibling module are the parameters below)
from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest
from test_kvcache import CHUNK_BYTES, FakeClock, kv_dir  # noqa: F401 (kv_dir: a fixture)

import loomfs
from loomfs.kvcache import AsyncKVCache, KVCache, KVConfig, _get
from loomfs.kvcache import _entry as E
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _wait_sealed(fs: loomfs.LoomFS, seg_dir: str, count: int) -> None:
    deadline = time.monotonic() + 30
    while sum(not n.endswith(".open") for n in fs.listdir(seg_dir)) < count:
        assert time.monotonic() < deadline, fs.listdir(seg_dir)
        time.sleep(0.02)


def _entry(fs: loomfs.LoomFS, kv_dir: str, key: bytes) -> E.Entry:
    return E.decode(fs.cat(f"{kv_dir}/index/{E.entry_name(key)}"))


def test_pending_touch_never_reverts_a_newer_put_or_a_delete(fs: loomfs.LoomFS, kv_dir: str) -> None:
    clock = FakeClock()
    with KVCache(fs, kv_dir, background_interval_s=0, clock=clock) as kv:
        kv.put(b"k", b"old" * 10_000)
        kv.put(b"d", b"x" * 10_000)
        clock.now_s += 60  # older than touch_after_s: the hits below queue touches
        assert bytes(kv.get(b"k")) == b"old" * 10_000
        assert kv.get(b"d") is not None
        kv.put(b"k", b"new" * 10_000)
        assert kv.delete(b"d") is True
        kv.maintain()
        assert bytes(kv.get(b"k")) == b"new" * 10_000
        assert kv.get(b"d") is None


def test_other_process_touch_never_reverts_a_put(fs: loomfs.LoomFS, kv_dir: str) -> None:
    clock = FakeClock()
    with KVCache(fs, kv_dir, background_interval_s=0, clock=clock) as reader, \
            KVCache(fs, kv_dir, background_interval_s=0, clock=clock) as writer:
        writer.put(b"k", b"v1" * 10_000)
        writer.put(b"same", b"s" * 10_000)
        clock.now_s += 60
        assert bytes(reader.get(b"k")) == b"v1" * 10_000
        assert reader.get(b"same") is not None
        writer.put(b"k", b"v2" * 10_000)
        assert reader.maintain() is not None
        assert bytes(writer.get(b"k")) == b"v2" * 10_000
        assert reader.stats.touches_written == 1 and reader.stats.touches_dropped == 1
        assert _entry(fs, kv_dir, b"same").touched_s == clock.now_s  # the unchanged key was touched


def test_touch_after_compaction_follows_the_moved_value(fs: loomfs.LoomFS, kv_dir: str) -> None:
    clock = FakeClock()
    with KVCache(fs, kv_dir, background_interval_s=0, clock=clock, segment_roll_s=0.001) as writer, \
            KVCache(fs, kv_dir, background_interval_s=0, clock=clock) as reader:
        hot = os.urandom(20_000)
        writer.put_many([(b"hot", hot)] + [(b"cold%d" % i, os.urandom(20_000)) for i in range(7)])
        writer.put(b"other", b"z" * 1000)  # rolls: the first segment is sealed
        _wait_sealed(fs, f"{kv_dir}/seg", 1)
        writer.delete_many([b"cold%d" % i for i in range(7)])
        clock.now_s += 60
        assert bytes(reader.get(b"hot")) == hot  # queues a touch of the entry in segment 1
        old_seg = _entry(fs, kv_dir, b"hot").seg_name
        r = writer.evict_now()
        assert r["values_moved"] == 1 and r["segments_removed"] >= 1, r
        reader.maintain()  # the touch: written at the value's new place, or not at all
        e = _entry(fs, kv_dir, b"hot")
        assert e.seg_name != old_seg and e.touched_s == clock.now_s
        assert not any(n.startswith(old_seg) for n in fs.listdir(f"{kv_dir}/seg"))
        assert bytes(reader.get(b"hot")) == hot and bytes(writer.get(b"hot")) == hot


def test_compaction_never_overwrites_a_concurrent_put(cluster: LocalCluster, fs: loomfs.LoomFS,
                                                      kv_dir: str) -> None:
    fs2 = loomfs.connect(str(cluster.root))  # another process: its own client and loop
    a = KVCache(fs, kv_dir, background_interval_s=0, segment_roll_s=0.001)
    b = KVCache(fs2, kv_dir, background_interval_s=0)
    try:
        a.put_many([(b"k", b"OLD!" * 5000)] + [(b"pad%d" % i, os.urandom(20_000)) for i in range(7)])
        a.put(b"roll", b"r" * 100)
        _wait_sealed(fs, f"{kv_dir}/seg", 1)
        a.delete_many([b"pad%d" % i for i in range(7)])
        client: Any = a.aio.client
        orig = client.put_many
        fired: list[int] = []

        async def put_then_race(items: Any) -> Any:
            # the compactor's write of k's moved entry: b's put lands just before it
            if not fired and any(E.decode(data).key == b"k" for _, data in items):
                fired.append(1)
                b.put(b"k", b"NEW!" * 5000)
            return await orig(items)

        client.put_many = put_then_race
        try:
            r = a.evict_now()
        finally:
            del client.put_many
        assert fired
        assert bytes(b.get(b"k")) == b"NEW!" * 5000
        assert bytes(a.get(b"k")) == b"NEW!" * 5000
        assert r["segments_compacted"] == 1 and r["values_moved"] == 0, r
    finally:
        a.close()
        b.close()
        fs2.close()


def test_unreadable_index_item_does_not_stop_eviction(fs: loomfs.LoomFS, kv_dir: str) -> None:
    with KVCache(fs, kv_dir, capacity_bytes=8 * 4096, background_interval_s=0, low_water=0.5) as kv:
        kv.put_many([(b"e%02d" % i, bytes([i]) * 4096) for i in range(16)])
        fs.makedirs(f"{kv_dir}/index/stray", exist_ok=True)
        r = kv.evict_now()
        assert r["garbage"] == 1 and kv.stats.unreadable == 1, r
        assert sum(kv.contains_many([b"e%02d" % i for i in range(16)])) <= 8


def test_get_in_flight_never_relearns_an_own_delete(fs: loomfs.LoomFS, kv_dir: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    orig = _get.read_entries

    async def scenario() -> Any:
        answered, go = asyncio.Event(), asyncio.Event()

        async def held_reply(client: Any, paths: Any, decode: Any) -> Any:
            out = await orig(client, paths, decode)  # meta answered before the delete
            answered.set()
            await go.wait()  # handled after it
            return out

        kv = await AsyncKVCache(fs.client, kv_dir, KVConfig(background_interval_s=0, index_cache_s=60)).open()
        try:
            await kv.put(b"k", b"v" * 20_000)
            kv.icache.forget(b"k")  # as after the cache time
            monkeypatch.setattr(_get, "read_entries", held_reply)
            get = asyncio.ensure_future(kv.get(b"k"))
            await answered.wait()
            assert await kv.delete(b"k") is True
            go.set()
            await get  # overlapping the delete: either answer is fine
            monkeypatch.setattr(_get, "read_entries", orig)
            return await kv.get(b"k")  # begun after the delete returned
        finally:
            await kv.close()

    assert fs.run(scenario()) is None
