"""Coalesced value reads (several small values in one chunk read) go through a pooled
scratch buffer: what a get hands back must not alias it, whatever the value kind."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import loomfs
from loomfs.kvcache import KVCache

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_values_from_a_coalesced_read_survive_the_next_gets(fs: loomfs.LoomFS, base: str) -> None:
    fs.makedirs(f"{base}/kv", exist_ok=True)
    with KVCache(fs, f"{base}/kv", background_interval_s=0) as kv:
        arrays = {b"a%d" % i: np.full(2000, i, dtype=np.float32) for i in range(8)}
        tensors = {b"t%d" % i: torch.full((1000,), float(i)) for i in range(8)}
        blobs = {b"b%d" % i: bytes([i]) * 30_000 for i in range(8)}
        kv.put_many({**arrays, **tensors, **blobs})  # one batch: laid out back to back, read coalesced
        got_a = kv.get_many(list(arrays))
        got_t = kv.get_many(list(tensors))
        got_b = kv.get_many(list(blobs))
        for _ in range(3):  # later coalesced reads reuse the pooled scratch
            kv.get_many(list(blobs)[::-1] + list(arrays)[::-1])
        assert all(np.array_equal(g, want) for g, want in zip(got_a, arrays.values(), strict=True))
        assert all(torch.equal(g, want) for g, want in zip(got_t, tensors.values(), strict=True))
        assert [bytes(g) for g in got_b] == list(blobs.values())


def test_two_halves_of_a_chunk_read_whole_and_a_torn_one_is_a_miss(fs: loomfs.LoomFS, base: str) -> None:
    import os

    from loomfs.kvcache import _entry as E

    kv_dir = f"{base}/kvw"
    fs.makedirs(kv_dir, exist_ok=True)
    fs.set_layout(kv_dir, chunk_size=4 << 20)
    with KVCache(fs, kv_dir, background_interval_s=0, segment_chunk_bytes=0) as kv:  # the prefix's 4 MiB
        values = {b"h%d" % i: os.urandom(2 << 20) for i in range(4)}  # two chunks, two halves each
        kv.put_many(values)
        bufs = [bytearray(2 << 20) for _ in values]
        got = kv.get_many(list(values), into=bufs)
        assert [bytes(g) for g in got] == list(values.values())
        e = E.decode(fs.cat(f"{kv_dir}/index/{b'h1'.hex()}"))
        names = fs.listdir(f"{kv_dir}/seg")
        seg = f"{kv_dir}/seg/" + next(n for n in names if n in (e.seg_name, e.seg_name + ".open"))
        with fs.open(seg, "r+b") as f:  # as a write that half landed
            f.seek(e.seg_offset + 4096)
            f.write(b"\x00" * 100)
        corrupt = kv.stats.corrupt
        got = kv.get_many(list(values), into=bufs)
        assert got[1] is None and kv.stats.corrupt == corrupt + 1
        assert [bytes(g) for i, g in enumerate(got) if i != 1] == [v for k, v in values.items() if k != b"h1"]


def test_segments_get_their_own_chunk_size_unless_the_prefix_set_one(fs: loomfs.LoomFS, base: str) -> None:
    """Segments default to 16 MiB chunks (8 x 2 MiB values per whole-chunk read); a prefix whose
    layout has another chunk size than the default keeps it; 0 keeps the prefix's."""
    fs.makedirs(f"{base}/kvd", exist_ok=True)
    with KVCache(fs, f"{base}/kvd", background_interval_s=0) as kv:
        kv.put(b"k", b"v" * 1000)
        assert fs.get_layout(f"{base}/kvd/seg").chunk_size == 16 << 20
        assert bytes(kv.get(b"k")) == b"v" * 1000
    fs.makedirs(f"{base}/kvs", exist_ok=True)
    fs.set_layout(f"{base}/kvs", chunk_size=1 << 20)
    with KVCache(fs, f"{base}/kvs", background_interval_s=0):
        assert fs.get_layout(f"{base}/kvs/seg").chunk_size == 1 << 20
    fs.makedirs(f"{base}/kv0", exist_ok=True)
    with KVCache(fs, f"{base}/kv0", background_interval_s=0, segment_chunk_bytes=0):
        assert fs.get_layout(f"{base}/kv0/seg").chunk_size == 4 << 20
    with pytest.raises(ValueError):
        KVCache(fs, f"{base}/kv0", segment_chunk_bytes=3 << 20)


def test_big_values_received_straight_into_their_buffers(fs: loomfs.LoomFS, base: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole-chunk runs of big values land in the callers' buffers (or fresh ones per value)
    with no scratch (``kvcache/_scatter.py``): every kind comes back whole, a key asked twice
    (overlapping values: the scratch path) too, and nothing aliases another get's bytes."""
    import os

    from loomfs.kvcache import _fetch

    plans: list[bool] = []
    real = _fetch.scatter_plan
    monkeypatch.setattr(_fetch, "SCATTER_RUNS", True)

    def counting(*args: Any) -> Any:
        plan = real(*args)
        plans.append(plan is not None)
        return plan

    monkeypatch.setattr(_fetch, "scatter_plan", counting)
    kv_dir = f"{base}/kvs"
    fs.makedirs(kv_dir, exist_ok=True)
    fs.set_layout(kv_dir, chunk_size=4 << 20)
    with KVCache(fs, kv_dir, background_interval_s=0, segment_chunk_bytes=0) as kv:
        blobs = {b"s%d" % i: os.urandom(2 << 20) for i in range(2)}
        arrays = {b"n%d" % i: np.full(1 << 19, i, dtype=np.float32) for i in range(2)}  # 2 MiB each
        tensors = {b"u%d" % i: torch.full((1 << 19,), float(i)) for i in range(2)}
        kv.put_many(blobs)
        kv.put_many(arrays)
        kv.put_many(tensors)
        got_b = kv.get_many(list(blobs))
        got_a = kv.get_many(list(arrays))
        got_t = kv.get_many(list(tensors))
        twice = kv.get_many([b"s0", b"s1", b"s0"])
        into = [torch.empty(1 << 19), torch.empty(1 << 19)]
        got_into = kv.get_many(list(tensors), into=into)
        kv.get_many(list(blobs)[::-1] + list(arrays))  # later gets must not touch what was handed out
        assert [bytes(g) for g in got_b] == list(blobs.values())
        assert all(np.array_equal(g, want) for g, want in zip(got_a, arrays.values(), strict=True))
        assert all(torch.equal(g, want) for g, want in zip(got_t, tensors.values(), strict=True))
        assert [bytes(g) for g in twice] == [blobs[b"s0"], blobs[b"s1"], blobs[b"s0"]]
        assert plans.count(True) >= 4 and False in plans  # scattered runs, and the key asked twice
        assert got_into[0] is into[0] and all(torch.equal(g, want) for g, want in zip(into, tensors.values(),
                                                                                         strict=True))
