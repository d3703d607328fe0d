"""A run of small values (16 KiB KV blocks back to back in one chunk read) is checked by
combining the values' CRC32Cs (byte tables of ``L_n``, ``_crccat``) and comparing with the CRC
the read's bytes were checked against on arrival, instead of hashing each value again. A value
whose bytes do not match its entry still never comes back: the combination then differs and
every value is hashed on its own."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, cast

import crc32c

from loomfs.kvcache import _crccat
from loomfs.kvcache import _entry as E
from loomfs.kvcache._config import KVConfig, KVStats
from loomfs.kvcache._fetch import ValueFetch
from loomfs.kvcache._reads import Run, plan_reads
from loomfs.net.buffers import BufferPool

SMALL = 16 << 10
CHUNK = 4 << 20


def _entry(i: int, value: bytes, offset: int) -> E.Entry:
    return E.Entry(i.to_bytes(4, "big"), 0.0, len(value), crc32c.crc32c(value), E.KIND_BYTES, "", "w-1", 9,
                   offset, CHUNK, (1, 2))


def _ready(n: int) -> None:
    deadline = time.monotonic() + 30
    while n not in _crccat._TABLES:
        _crccat._warm(n)
        assert time.monotonic() < deadline, f"the tables of length {n} were never computed"
        time.sleep(0.005)


def test_byte_tables_combine_like_the_bytes() -> None:
    for la, lb in [(0, 0), (7, 1), (SMALL, SMALL), (3, 8192), (100_000, 12_345)]:
        a, b = os.urandom(la), os.urandom(lb)
        tables = _crccat.byte_tables(lb)
        assert _crccat.crc_cat(crc32c.crc32c(a), crc32c.crc32c(b), lb, tables) == crc32c.crc32c(a + b)
        assert _crccat.crc_cat(crc32c.crc32c(a), crc32c.crc32c(b), lb) == crc32c.crc32c(a + b)


def test_tiled_crc_of_small_values_back_to_back() -> None:
    vals = [os.urandom(SMALL) for _ in range(64)]
    entries: list[E.Entry | None] = [_entry(i, v, (1 << 20) + i * SMALL) for i, v in enumerate(vals)]
    alone, runs = plan_reads(entries)
    assert alone == [] and len(runs) == 1
    _ready(SMALL)
    assert _crccat.tiled_crc(runs[0], entries) == crc32c.crc32c(b"".join(vals))
    r = runs[0]
    assert _crccat.tiled_crc(Run(r.seg_inode, r.chunk_index, r.start, r.end, r.members[::-1]), entries) is None
    assert _crccat.tiled_crc(Run(r.seg_inode, r.chunk_index, r.start, r.end, r.members[:-1]), entries) is None
    twice = Run(r.seg_inode, r.chunk_index, r.start, r.end, [0, 0, *r.members[1:]])
    assert _crccat.tiled_crc(twice, entries) is None
    gap = [e for i, e in enumerate(entries) if i != 5]  # value 5 not asked: a gap in the run
    _, gruns = plan_reads(gap)
    assert len(gruns) == 1 and _crccat.tiled_crc(gruns[0], gap) is None
    tiny = [_entry(i, b"x" * 4096, i * 4096) for i in range(4)]
    assert _crccat.tiled_crc(Run(9, 0, 0, 4 * 4096, [0, 1, 2, 3]), list(tiny)) is None  # hashed instead


class _Storage:
    """Serves the bytes of one chunk; the reply's CRC is that of the bytes sent (checked on
    arrival), as storage's is."""

    def __init__(self, chunk: bytearray) -> None:
        self.chunk = chunk

    async def read_chunk_crc(self, layout: Any, inode: int, index: int, offset: int, length: int,
                             into: memoryview) -> tuple[int, int]:
        into[:length] = self.chunk[offset : offset + length]
        return length, crc32c.crc32c(into[:length])


class _Client:
    def __init__(self, chunk: bytearray) -> None:
        self.storage = _Storage(chunk)
        self.pool = BufferPool()


class _Fetch(ValueFetch):
    def __init__(self, chunk: bytearray) -> None:
        self.client = cast(Any, _Client(chunk))
        self.config = KVConfig()
        self.stats = KVStats()
        self.prefix = "/kv"
        self.clock = time.time
        self._touches: dict[str, E.Entry] = {}


def test_a_torn_value_in_a_tiled_run_is_a_miss_and_the_others_hits() -> None:
    vals = [os.urandom(SMALL) for _ in range(32)]
    chunk = bytearray(CHUNK)
    entries: list[E.Entry | None] = []
    for i, v in enumerate(vals):
        chunk[i * SMALL : (i + 1) * SMALL] = v
        entries.append(_entry(i, v, i * SMALL))
    _ready(SMALL)
    f = _Fetch(chunk)
    _, runs = plan_reads(entries)
    assert len(runs) == 1

    async def read() -> list[Any]:
        out: list[Any] = [None] * len(vals)
        await f._read_run(runs[0], entries, [None] * len(vals), out)
        return out

    out = asyncio.run(read())
    assert [bytes(o) for o in out] == vals and f.stats.corrupt == 0
    chunk[7 * SMALL + 100] ^= 0x01  # value 7's stored bytes torn: the wire CRC is of what was sent
    out = asyncio.run(read())
    assert out[7] is None and f.stats.corrupt == 1
    assert [bytes(o) for i, o in enumerate(out) if i != 7] == [v for i, v in enumerate(vals) if i != 7]
