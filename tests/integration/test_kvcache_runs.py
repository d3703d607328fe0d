"""Coalesced value reads (several small values in one chunk read) go through a pooled
scratch buffer: what a get hands back must not alias it, whatever the value kind."""

from __future__ import annotations

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
