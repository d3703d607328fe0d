"""The lean hand-out of a run of small values read into one scratch (``ValueFetch._hand_out_run``)
and the hits' bookkeeping done once per run (``_hits``): every value is checked against its
CRC32C (a torn one is a miss, its neighbours still hits), lands in its ``into=`` buffer or a
fresh one of its kind, and only hits whose entry was touched long enough ago queue a touch."""

from __future__ import annotations

import os
from typing import Any

import crc32c
import numpy as np

from loomfs.kvcache import _entry as E
from loomfs.kvcache._config import KVConfig, KVStats
from loomfs.kvcache._fetch import ValueFetch
from loomfs.kvcache._reads import Run
from loomfs.kvcache._values import Target

CHUNK = 1 << 20


class _Fetch(ValueFetch):
    def __init__(self, now_s: float, touch_after_s: float = 30.0, ttl_s: float = 0.0) -> None:
        self.config = KVConfig(touch_after_s=touch_after_s, ttl_s=ttl_s)
        self.stats = KVStats()
        self.prefix = "/kv"
        self.clock = lambda: now_s
        self._touches: dict[str, E.Entry] = {}


def _run(values: list[bytes], touched_s: list[float], *, kinds: list[int] | None = None,
         descs: list[str] | None = None) -> tuple[Run, list[E.Entry | None], memoryview]:
    scratch = bytearray()
    entries: list[E.Entry | None] = []
    for i, v in enumerate(values):
        entries.append(E.Entry(bytes([i + 1]) * 8, touched_s[i], len(v), crc32c.crc32c(v),
                               kinds[i] if kinds else E.KIND_BYTES, descs[i] if descs else "", "w-1", 7,
                               3 * CHUNK + len(scratch), CHUNK, (1,)))
        scratch += v
    return Run(7, 3, 0, len(scratch), list(range(len(values)))), entries, memoryview(scratch)


def test_values_land_in_their_buffers_and_a_torn_one_is_a_miss() -> None:
    vals = [os.urandom(4096) for _ in range(4)]
    r, entries, scratch = _run(vals, [0.0] * 4)
    scratch[4096 + 10] ^= 0xFF  # value 1 torn
    f = _Fetch(now_s=100.0, touch_after_s=30.0)
    bufs = [bytearray(4096), bytearray(4096), bytearray(8192)]
    targets: list[Target | None] = [Target(b) for b in bufs] + [None]
    out: list[Any] = [None] * 4
    f._hand_out_run(r, entries, targets, out, scratch, checked=False)
    assert out[0] is bufs[0] and bytes(bufs[0]) == vals[0]
    assert out[1] is None and f.stats.corrupt == 1
    assert bytes(out[2]) == vals[2] and bytes(bufs[2][:4096]) == vals[2]
    assert isinstance(out[3], bytearray) and bytes(out[3]) == vals[3]
    assert f.stats.get_bytes == 3 * 4096
    assert len(f._touches) == 3  # the three hits, all touched long ago; not the miss
    assert E.entry_name(entries[1].key) not in f._touches  # type: ignore[union-attr]


def test_checked_run_is_not_hashed_again_and_recent_hits_queue_no_touch() -> None:
    vals = [os.urandom(1000) for _ in range(3)]
    r, entries, scratch = _run(vals, [95.0, 50.0, 70.0])
    f = _Fetch(now_s=100.0, touch_after_s=30.0, ttl_s=40.0)  # touch after min(30, 40 / 2) = 20 s
    out: list[Any] = [None] * 3
    f._hand_out_run(r, entries, [None] * 3, out, scratch, checked=True)
    assert [bytes(o) for o in out] == vals
    assert set(f._touches) == {E.entry_name(entries[1].key), E.entry_name(entries[2].key)}  # type: ignore[union-attr]
    f._hand_out_run(r, entries, [None] * 3, out, scratch, checked=True)
    assert f.stats.get_bytes == 2 * 3000 and len(f._touches) == 2


def test_a_numpy_value_comes_back_rebuilt_and_a_bad_descriptor_is_a_miss() -> None:
    a = np.arange(256, dtype=np.float32).reshape(16, 16)
    vals = [a.tobytes(), os.urandom(64)]
    r, entries, scratch = _run(vals, [0.0, 0.0], kinds=[E.KIND_NUMPY, E.KIND_NUMPY],
                               descs=["<f4;16,16", "<f4;1000"])
    f = _Fetch(now_s=1.0)
    out: list[Any] = [None] * 2
    f._hand_out_run(r, entries, [None, None], out, scratch, checked=False)
    assert isinstance(out[0], np.ndarray) and np.array_equal(out[0], a)
    assert out[1] is None and f.stats.corrupt == 1 and f.stats.get_bytes == a.nbytes
