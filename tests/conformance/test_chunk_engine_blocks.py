"""Per-block CRC32Cs, checked against every engine: every kind of staging keeps them right,
partial reads check them (a flipped byte fails only reads of its block), they survive a reopen,
and an index from before block CRCs (schema 0) still opens and reads."""

from __future__ import annotations

import functools
import mmap
import os
import random
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import crc32c
import pytest
from engine_harness import Harness, run

from loomfs.errors import StatusError
from loomfs.storage.engine.base import ChunkEngine
from loomfs.storage.engine.blocks import (
    block_count,
    block_crcs_of,
    crc_of_blocks,
    kept_blocks,
    unpack_blocks,
)
from loomfs.storage.engine.chunkmap import ChunkMap
from loomfs.storage.engine.file import FileEngine
from loomfs.storage.engine.types import BLOCK_BYTES, ChunkKey
from loomfs.wire.status import Status

B = BLOCK_BYTES
K = ChunkKey(0x1234, 3)


@pytest.fixture(params=["memory", "file", "file-direct"])
def h(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(request.param, tmp_path / "target")
    yield harness
    harness.engine.close()


def aligned(data: bytes) -> memoryview:
    m = mmap.mmap(-1, max(len(data), 1))
    m[: len(data)] = data
    return memoryview(m)[: len(data)]


def commit(e: ChunkEngine, key: ChunkKey = K) -> None:
    st = e.get(key)
    assert st is not None
    run(e.commit(key, st.pending_ver))


def next_ver(e: ChunkEngine, key: ChunkKey = K) -> int:
    st = e.get(key)
    return 1 if st is None else max(st.commit_ver, st.pending_ver) + 1


def read(e: ChunkEngine, offset: int, n: int, key: ChunkKey = K) -> bytes:
    buf = bytearray(n)
    got = e.read(key, offset, memoryview(buf))
    return bytes(buf[:got])


def ranges(length: int) -> list[tuple[int, int]]:
    """Partial read ranges that hit every block shape: inside one block, across a boundary,
    whole blocks, the short tail, from 0 but short, up to the end."""
    out = [(0, 1), (0, min(length, 4096)), (length - 1, 1), (max(0, length - 5000), 5000), (1, length - 1)]
    for b in range(0, length, B):
        out += [(b, min(B, length - b)), (b + 17, 100), (max(0, b - 10), 20), (b + 4096, 4096)]
    rng = random.Random(length)
    out += [(rng.randrange(length), rng.randrange(1, 3 * B)) for _ in range(20)]
    return [(o, n) for o, n in out if 0 <= o < length and n > 0 and not (o == 0 and n >= length)]


def check_content(e: ChunkEngine, expect: bytes, key: ChunkKey = K) -> None:
    """Committed block CRCs match, every partial read returns the right bytes, verify is clean."""
    assert e.block_crcs(key) == unpack_blocks(block_crcs_of(expect))
    st = e.get(key)
    assert st is not None and st.length == len(expect) and st.crc == crc32c.crc32c(expect)
    for off, n in ranges(len(expect)):
        assert read(e, off, n, key) == expect[off : off + n], (off, n)
    assert read(e, 0, len(expect) + 10, key) == expect
    assert e.verify(key) == []


BASE = os.urandom(5 * B + 1234)  # 6 blocks, the last short

STAGES: dict[str, Callable[[bytes], tuple[Callable[[ChunkEngine, int], object], bytes]]] = {}


def stage(name: str):  # type: ignore[no-untyped-def]
    def deco(fn):  # type: ignore[no-untyped-def]
        STAGES[name] = fn
        return fn
    return deco


def _write(offset: int, data: bytes, full_replace: bool = False) -> Callable[[ChunkEngine, int], object]:
    return lambda e, v: e.stage_write(K, v, offset, data, data_crc=crc32c.crc32c(data), full_replace=full_replace)


def _patched(base: bytes, offset: int, data: bytes) -> bytes:
    out = bytearray(base) + bytes(max(0, offset - len(base)))
    out[offset : offset + len(data)] = data
    return bytes(out)


@pytest.mark.parametrize(
    "offset,size",
    [
        (100, 50),  # inside block 0
        (B - 10, 20),  # across a boundary
        (B, B),  # exactly one block
        (2 * B + 5, 2 * B),  # edge + whole + edge
        (0, 3 * B),  # from 0, shorter than the chunk
        (5 * B + 1000, 1000),  # into the short last block, growing it
        (4 * B, 3 * B),  # over the end: grows the chunk by whole blocks
        (300, 0),  # empty write
    ],
)
def test_overwrite_keeps_blocks(h: Harness, offset: int, size: int) -> None:
    e = h.engine
    _write(0, BASE)(e, 1)
    commit(e)
    patch = os.urandom(size)
    expect = _patched(BASE, offset, patch)
    _write(offset, patch)(e, 2)
    assert e.block_crcs(K, pending=True) == unpack_blocks(block_crcs_of(expect))
    check_content(e, BASE)  # the committed version is untouched and still checks
    commit(e)
    check_content(e, expect)


@pytest.mark.parametrize("base_len", [0, 1000, B, 2 * B + 7])
@pytest.mark.parametrize("gap,size", [(0, 10), (0, B), (0, 3 * B + 5), (17, 100), (B + 3, 2 * B)])
def test_append_and_gap_keep_blocks(h: Harness, base_len: int, gap: int, size: int) -> None:
    e = h.engine
    base = BASE[:base_len]
    if base_len:
        _write(0, base)(e, 1)
        commit(e)
    data = os.urandom(size)
    _write(base_len + gap, data)(e, 2)
    expect = base + bytes(gap) + data
    assert e.block_crcs(K, pending=True) == unpack_blocks(block_crcs_of(expect))
    commit(e)
    check_content(e, expect)
    # a second append on top of the first one continues the CRCs again
    more = os.urandom(B // 3)
    _write(len(expect), more)(e, 3)
    commit(e)
    check_content(e, expect + more)


@pytest.mark.parametrize("new_len", [0, 1, 100, B, B + 1, 3 * B - 1, len(BASE), len(BASE) + 1, 9 * B + 77])
def test_truncate_keeps_blocks(h: Harness, new_len: int) -> None:
    e = h.engine
    _write(0, BASE)(e, 1)
    commit(e)
    e.stage_truncate(K, 2, new_len)
    expect = BASE[:new_len] + bytes(max(0, new_len - len(BASE)))
    assert e.block_crcs(K, pending=True) == unpack_blocks(block_crcs_of(expect))
    commit(e)
    if new_len:
        check_content(e, expect)
    else:
        assert e.block_crcs(K) == [] and e.verify(K) == []


def test_new_chunks_and_full_replace(h: Harness) -> None:
    e = h.engine
    k0, k1, k2 = ChunkKey(1, 0), ChunkKey(1, 1), ChunkKey(1, 2)
    e.stage_write(k0, 1, 0, BASE)  # whole
    e.stage_write(k1, 1, 3 * B + 5, b"tail")  # past offset 0 on a new chunk: zeros before
    e.stage_truncate(k2, 1, 4 * B + 3)  # truncate creates it: all zeros
    for key, expect in [(k0, BASE), (k1, bytes(3 * B + 5) + b"tail"), (k2, bytes(4 * B + 3))]:
        commit(e, key)
        check_content(e, expect, key)
    short = os.urandom(B + 9)
    e.stage_write(k0, 2, 0, short, full_replace=True)  # shorter: every block is new
    commit(e, k0)
    check_content(e, short, k0)
    e.stage_write(k1, 2, 0, BASE)  # covering write from 0 replaces everything too
    commit(e, k1)
    check_content(e, BASE, k1)


@pytest.mark.parametrize("size", [4 << 20, (1 << 20) + 123, 600 << 10])
def test_async_whole_write_then_partial_reads(h: Harness, size: int) -> None:
    async def go() -> None:
        e = h.engine
        data = os.urandom(size)
        await e.astage_write(K, 1, 0, aligned(data), data_crc=crc32c.crc32c(data))
        await e.commit(K, 1)
        assert e.block_crcs(K) == unpack_blocks(block_crcs_of(data))
        for off, n in [(4096, size - 4096), (0, size - 1), (B, 8 * B), (123, 700_000), (size - B - 3, B + 3)]:
            n = min(n, size - off)
            out = aligned(bytes(n))
            assert await e.aread(K, off, out) == n and bytes(out) == data[off : off + n]
            out2 = memoryview(bytearray(n))  # unaligned: the buffered path
            assert await e.aread(K, off, out2) == n and bytes(out2) == data[off : off + n]
        assert e.verify(K) == []

    run(go())


def test_random_ops_keep_blocks(h: Harness) -> None:
    """Random writes/truncates/aborts across block sizes against a bytes model."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    e = h.engine
    model: dict[ChunkKey, bytes] = {}
    keys = [ChunkKey(3, i) for i in range(3)]
    for step in range(120):
        k = rng.choice(keys)
        cur = model.get(k, b"")
        v = next_ver(e, k)
        if rng.random() < 0.6:
            off = rng.choice([0, len(cur), rng.randrange(0, len(cur) + 1), len(cur) + rng.randrange(1, 2 * B)])
            data = rng.randbytes(rng.choice([rng.randrange(0, 300), rng.randrange(0, 3 * B)]))
            new = _patched(cur, off, data)
            e.stage_write(k, v, off, data)
        else:
            n = rng.randrange(0, 5 * B)
            new = cur[:n] + bytes(max(0, n - len(cur)))
            e.stage_truncate(k, v, n)
        assert e.block_crcs(k, pending=True) == unpack_blocks(block_crcs_of(new)), (seed, step)
        if rng.random() < 0.15:
            e.abort(k)
            continue
        run(e.commit(k, v))
        model[k] = new
        if new and rng.random() < 0.3:
            off = rng.randrange(len(new))
            n = rng.randrange(1, 2 * B)
            assert read(e, off, n, k) == new[off : off + n], (seed, step)
    for k, data in model.items():
        assert e.block_crcs(k) == unpack_blocks(block_crcs_of(data)), seed
        assert e.verify(k) == [], seed


# ---- corruption -------------------------------------------------------------------------
def _expect_mismatch(fn: Callable[[], object], block: int) -> None:
    with pytest.raises(StatusError) as ei:
        fn()
    assert ei.value.status is Status.CHECKSUM_MISMATCH
    assert f"block {block} at offset {block * B}" in str(ei.value), str(ei.value)


def test_flipped_byte_fails_only_its_block(h: Harness) -> None:
    e = h.engine
    _write(0, BASE)(e, 1)
    commit(e)
    h.corrupt(K, 2 * B + 100)
    _expect_mismatch(lambda: read(e, 2 * B + 100, 1), 2)
    _expect_mismatch(lambda: read(e, 2 * B, 4096), 2)  # same block, other bytes
    _expect_mismatch(lambda: read(e, 2 * B - 10, 20), 2)  # across the boundary into it
    _expect_mismatch(lambda: read(e, B + 5, 3 * B), 2)  # an inner, whole block
    _expect_mismatch(lambda: read(e, 0, len(BASE) - 1), 2)
    for b in (0, 1, 3, 4, 5):
        off = b * B
        assert read(e, off, 4096) == BASE[off : off + 4096]
        assert read(e, off + 7, B - 7) == BASE[off + 7 : off + B]
    assert read(e, 0, 2 * B) == BASE[: 2 * B] and read(e, 3 * B, 10 * B) == BASE[3 * B :]
    # the whole-chunk read is not checked here (the client checks the whole-chunk CRC)
    whole = read(e, 0, len(BASE))
    assert whole != BASE and crc32c.crc32c(whole) != e.get(K).crc  # type: ignore[union-attr]
    assert e.verify(K) == [2]
    h.corrupt(K, 5 * B + 1)
    assert e.verify(K) == [2, 5]
    assert ChunkEngine.verify(e, K) == [2, 5]  # the generic one agrees
    _expect_mismatch(lambda: read(e, len(BASE) - 1, 1), 5)


def _whole_read_refused(e: ChunkEngine, good: bytes, key: ChunkKey = K) -> None:
    """The chunk's stored whole-chunk CRC is the good content's, so the reader's CRC check
    refuses the rotten bytes a whole-chunk read returns."""
    st = e.get(key)
    assert st is not None and st.length == len(good) and st.crc == crc32c.crc32c(good)
    whole = read(e, 0, len(good), key)
    assert whole != good and crc32c.crc32c(whole) != st.crc


def _chunk_files(h: Harness, key: ChunkKey = K) -> list[Path]:
    return sorted(h.path.rglob(f"{key.inode:x}.{key.index:x}.*")) if h.kind != "memory" else []


def test_corruption_survives_unrelated_updates(h: Harness) -> None:
    """Appends and zero-extending truncates read no old byte but the short last block they
    continue: they succeed on a chunk with bit rot in another block and keep the stored CRCs
    (block and whole-chunk) of the good content, so the rot stays visible. (An overwrite
    elsewhere, or a growth of a rotten last block, is refused instead: see the tests below.)"""
    e = h.engine
    _write(0, BASE)(e, 1)
    commit(e)
    h.corrupt(K, B + 3)
    good = BASE
    _write(len(good), b"appended")(e, 2)  # in place, into the short last block
    assert e.get(K).pending_crc == crc32c.crc32c(good + b"appended")  # type: ignore[union-attr]
    commit(e)
    good += b"appended"
    e.stage_truncate(K, 3, len(good) + 3 * B)  # zero-extend
    commit(e)
    good += bytes(3 * B)
    _write(len(good) + 10, b"past a gap")(e, 4)
    commit(e)
    good += bytes(10) + b"past a gap"
    _expect_mismatch(lambda: read(e, B, 10), 1)
    assert e.verify(K) == [1]
    assert e.block_crcs(K) == unpack_blocks(block_crcs_of(good))
    assert read(e, 4 * B, 10) == good[4 * B : 4 * B + 10]
    assert read(e, 5 * B, 3 * B) == good[5 * B : 8 * B]
    _whole_read_refused(e, good)
    # a whole rewrite (a repair) makes it good again
    _write(0, BASE, full_replace=True)(e, 5)
    commit(e)
    check_content(e, BASE)


# Updates that keep bytes of a rotten block (flipped byte in block 2 of BASE, or in its short
# last block 5): refused with CHECKSUM_MISMATCH naming the block, whether the update touches that
# block in part or leaves it alone (its bytes would be copied into the new version).
ROT2, ROT5 = 2 * B + 100, 5 * B + 7
REFUSED: dict[str, tuple[int, Callable[[ChunkEngine, int], object]]] = {
    "write inside the rotten block": (ROT2, _write(2 * B + 50, b"w" * 100)),
    "write over the rotten byte": (ROT2, _write(ROT2 - 2, b"w" * 5)),
    "write across a boundary into it": (ROT2, _write(2 * B - 10, b"w" * 20)),
    "write across a boundary out of it": (ROT2, _write(3 * B - 10, b"w" * 20)),
    "write of whole other blocks": (ROT2, _write(3 * B, b"w" * 2 * B)),
    "write inside another block": (ROT2, _write(4 * B + 5, b"w" * 10)),
    "write from 0, short of it": (ROT2, _write(0, b"w" * (2 * B))),
    "write from 0, into it": (ROT2, _write(0, b"w" * (2 * B + 101))),
    "write growing the chunk": (ROT2, _write(4 * B + 1, b"w" * 3 * B)),
    "empty write": (ROT2, _write(300, b"")),
    "write into the rotten last block, growing": (ROT5, _write(5 * B + 1000, b"w" * B)),
    "write elsewhere, rotten last block": (ROT5, _write(100, b"w")),
    "async write elsewhere": (ROT2, lambda e, v: run(e.astage_write(K, v, 5 * B, b"w" * 1000))),
    "truncate into the rotten block": (ROT2, lambda e, v: e.stage_truncate(K, v, 2 * B + 50)),
    "truncate keeping it whole": (ROT2, lambda e, v: e.stage_truncate(K, v, 3 * B + 7)),
    "truncate at its end": (ROT2, lambda e, v: e.stage_truncate(K, v, 3 * B)),
    "truncate into the rotten last block": (ROT5, lambda e, v: e.stage_truncate(K, v, 5 * B + 1000)),
    # growing a chunk continues its short last block's CRC: a torn tail (simulator seed 227082)
    "append to the rotten last block": (ROT5, _write(len(BASE), b"w" * 10)),
    "write past a gap after the rotten last block": (ROT5, _write(len(BASE) + 2 * B, b"w" * 10)),
    "zero-extend the rotten last block": (ROT5, lambda e, v: e.stage_truncate(K, v, len(BASE) + B)),
}


@pytest.mark.parametrize("pending_before", [False, True])
@pytest.mark.parametrize("case", list(REFUSED))
def test_update_keeping_rotten_bytes_is_refused(h: Harness, case: str, pending_before: bool) -> None:
    rot, stage_it = REFUSED[case]
    e = h.engine
    _write(0, BASE)(e, 1)
    commit(e)
    h.corrupt(K, rot)
    bad = rot // B
    files = _chunk_files(h)
    if pending_before:  # an append staged first: it reads only the last block's old bytes
        if bad == len(BASE) // B:
            _expect_mismatch(lambda: _write(len(BASE), b"pending")(e, 2), bad)
        else:
            _write(len(BASE), b"pending")(e, 2)
    _expect_mismatch(lambda: stage_it(e, 3), bad)
    # nothing staged, a pending update before it dropped too, no file left behind
    st = e.get(K)
    assert st is not None and (st.commit_ver, st.pending_ver, st.pending_tags) == (1, 0, ())
    assert _chunk_files(h) == files and all(f.stat().st_size == len(BASE) for f in files)
    # the committed version is unchanged: its good blocks read, the rot is still reported
    assert e.block_crcs(K) == unpack_blocks(block_crcs_of(BASE))
    for b in range(6):
        if b != bad:
            assert read(e, b * B + 1, B - 1) == BASE[b * B + 1 : (b + 1) * B]
    _expect_mismatch(lambda: read(e, rot, 1), bad)
    assert e.verify(K) == [bad]
    _whole_read_refused(e, BASE)
    _expect_mismatch(lambda: stage_it(e, 3), bad)  # refused again: still rotten
    # a full replace repairs it, and the same update then goes through
    _write(0, BASE, full_replace=True)(e, 3)
    commit(e)
    check_content(e, BASE)
    stage_it(e, 4)
    commit(e)
    assert e.verify(K) == []


REPAIRS: dict[str, tuple[Callable[[ChunkEngine, int], object], bytes]] = {
    "write covering it whole": (_write(2 * B, b"r" * B), _patched(BASE, 2 * B, b"r" * B)),
    "write covering it and edges of others": (_write(2 * B - 5, b"r" * (B + 10)), _patched(BASE, 2 * B - 5, b"r" * (B + 10))),
    "write from it to the end": (_write(B, b"r" * (4 * B + 1234)), _patched(BASE, B, b"r" * (4 * B + 1234))),
    "truncate cutting it away": (lambda e, v: e.stage_truncate(K, v, 2 * B), BASE[: 2 * B]),
    "truncate cutting it away, short": (lambda e, v: e.stage_truncate(K, v, B + 5), BASE[: B + 5]),
    "write covering everything": (_write(0, b"r" * len(BASE)), b"r" * len(BASE)),
    "full replace": (_write(0, b"r" * 10, full_replace=True), b"r" * 10),
}


@pytest.mark.parametrize("case", list(REPAIRS))
def test_update_dropping_rotten_bytes_repairs(h: Harness, case: str) -> None:
    """An update that keeps no byte of the rotten block (covers it whole, cuts it away) succeeds:
    the new version is good."""
    stage_it, expect = REPAIRS[case]
    e = h.engine
    _write(0, BASE)(e, 1)
    commit(e)
    h.corrupt(K, 2 * B + 100)
    stage_it(e, 2)
    assert e.block_crcs(K, pending=True) == unpack_blocks(block_crcs_of(expect))
    assert e.get(K).pending_crc == crc32c.crc32c(expect)  # type: ignore[union-attr]
    commit(e)
    check_content(e, expect)


def test_random_updates_never_bless_rot(h: Harness) -> None:
    """Random rot, writes, truncates and repairs against a model (good content + rotten
    offsets): an update is refused exactly when it would keep a rotten block's bytes, and after
    every step the chunk reports exactly the rotten blocks, reads its good blocks, and its
    whole-chunk CRC is the good content's."""
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    e = h.engine
    good = rng.randbytes(rng.randrange(1, 6 * B))
    _write(0, good)(e, 1)
    commit(e)
    rot: set[int] = set()
    for step in range(150):
        v = next_ver(e)
        old_len = len(good)
        r = rng.random()
        if r < 0.2 and len(rot) < 3 and old_len:
            off = rng.randrange(old_len)
            if off not in rot:
                h.corrupt(K, off)
                rot.add(off)
            continue
        if r < 0.65:
            off = rng.choice([0, old_len, rng.randrange(max(1, old_len)), old_len + rng.randrange(1, B),
                              rng.randrange(old_len // B + 1) * B])
            size = rng.choice([0, rng.randrange(1, 300), rng.randrange(1, 3 * B), B, 2 * B])
            data = rng.randbytes(size)
            full = rng.random() < 0.05
            new = data if full else _patched(good, off, data)
            lo, hi = (0, old_len) if full or (off == 0 and size >= old_len) else (off, off + size)
            stage_it: Callable[[], object] = functools.partial(e.stage_write, K, v, off, data, full_replace=full)
        else:
            n = rng.choice([rng.randrange(0, old_len + 1), rng.randrange(old_len // B + 1) * B,
                            old_len + rng.randrange(0, 2 * B)])
            new = good[:n] + bytes(max(0, n - old_len))
            lo, hi = n, max(n, old_len)
            stage_it = functools.partial(e.stage_truncate, K, v, n)
        grows_only = lo >= old_len
        # refused iff a rotten byte lies in an old block the update does not replace whole; one
        # that only grows the chunk keeps (and checks) just the short last block
        keeps_rot = sorted({
            o // B for o in rot
            if ((o // B == old_len // B and old_len % B) if grows_only
                else not (lo <= o // B * B and min(o // B * B + B, old_len) <= hi and lo < hi))
        })
        if keeps_rot:
            with pytest.raises(StatusError) as ei:
                stage_it()
            assert ei.value.status is Status.CHECKSUM_MISMATCH, seed
            assert any(f"block {b} at offset {b * B}" in str(ei.value) for b in keeps_rot), (seed, step, str(ei.value))
            assert e.get(K).pending_ver == 0, (seed, step)  # type: ignore[union-attr]
        else:
            stage_it()
            assert e.block_crcs(K, pending=True) == unpack_blocks(block_crcs_of(new)), (seed, step)
            assert e.get(K).pending_crc == crc32c.crc32c(new), (seed, step)  # type: ignore[union-attr]
            commit(e)
            if not grows_only:  # rot it replaced or cut away is gone; appends carry the rest
                rot = {o for o in rot if o < len(new) and not lo <= o < hi}
            good = new
        bad = sorted({o // B for o in rot})
        assert e.verify(K) == bad, (seed, step)
        st = e.get(K)
        assert st is not None and st.length == len(good) and st.crc == crc32c.crc32c(good), (seed, step)
        whole = read(e, 0, len(good) + 1)
        assert (whole == good) == (not rot) and (crc32c.crc32c(whole) == st.crc) == (not rot), (seed, step)
        for b in range(block_count(len(good))):
            off = b * B + rng.randrange(B)
            n = min(rng.randrange(1, 100), (b + 1) * B - off)  # inside block b
            if off >= len(good) or (off == 0 and n >= len(good)):
                continue
            if b in bad:
                _expect_mismatch(functools.partial(read, e, off, n), b)
            else:
                assert read(e, off, n) == good[off : off + n], (seed, step, sorted(rot))


def test_async_partial_read_detects_corruption(h: Harness) -> None:
    async def go() -> None:
        e = h.engine
        data = os.urandom(4 << 20)
        await e.astage_write(K, 1, 0, aligned(data), data_crc=crc32c.crc32c(data))
        await e.commit(K, 1)
        h.corrupt(K, 40 * B + 5)
        for off, n in [(B, 60 * B), (40 * B + 3, 600 << 10), (4096, (4 << 20) - 4096), (30 * B + 1, 10 * B + 9)]:
            for out in (aligned(bytes(n)), memoryview(bytearray(n))):
                with pytest.raises(StatusError) as ei:
                    await e.aread(K, off, out)
                assert ei.value.status is Status.CHECKSUM_MISMATCH and "block 40 " in str(ei.value)
        out = aligned(bytes(30 * B))
        assert await e.aread(K, 4096, out) == 30 * B and bytes(out) == data[4096 : 4096 + 30 * B]
        out = aligned(bytes(4 << 20))
        assert await e.aread(K, 0, out) == 4 << 20  # whole: not checked here
        assert e.verify(K) == [40]

    run(go())


def test_blocks_survive_reopen(h: Harness) -> None:
    e = h.engine
    keys = [ChunkKey(9, i) for i in range(3)] + [ChunkKey((1 << 64) - 3, 1 << 40)]
    contents = [BASE, BASE[: B + 1] + os.urandom(B), bytes(3 * B), os.urandom(777)]
    for k, c in zip(keys, contents, strict=True):
        e.stage_write(k, 1, 0, c)
        run(e.commit(k, 1))
    e.stage_write(keys[0], 2, 100, b"p" * (2 * B))  # partial update, committed
    run(e.commit(keys[0], 2))
    contents[0] = _patched(BASE, 100, b"p" * (2 * B))
    e.stage_write(keys[1], 2, 5, b"lost")  # pending at close: dropped
    e = h.reopen()
    for k, c in zip(keys, contents, strict=True):
        check_content(e, c, k)
    if isinstance(e, FileEngine):
        db = sqlite3.connect(h.path / "index.sqlite")
        rows = db.execute("SELECT length, blocks FROM chunks").fetchall()
        db.close()
        assert len(rows) == 4 and all(len(b) == 4 * ((n + B - 1) // B) for n, b in rows)
    h.corrupt(keys[0], 3)
    e = h.reopen()
    _expect_mismatch(lambda: read(e, 0, 10, keys[0]), 0)


def test_kept_blocks_and_crc_of_blocks() -> None:
    """The base helpers the rot checks stand on, against slow references."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    for _ in range(3000):
        old_len = rng.choice([0, 1, B - 1, B, B + 1, 3 * B, 3 * B + 7, rng.randrange(6 * B)])
        lo = rng.choice([0, rng.randrange(old_len + 2), rng.randrange(old_len // B + 2) * B, old_len])
        hi = lo + rng.choice([0, 1, B, rng.randrange(4 * B), max(0, rng.randrange(old_len // B + 3) * B - lo)])
        whole, part = [], []
        for i in range(block_count(old_len)):
            start, end = i * B, min((i + 1) * B, old_len)
            if hi <= lo or end <= lo or start >= hi:
                whole.append(i)
            elif start < lo or end > hi:
                part.append(i)
        (before, after), got_part = kept_blocks(old_len, lo, hi)
        assert ([*before, *after], sorted(got_part)) == (whole, part), (seed, old_len, lo, hi)
    for n in [0, 1, 100, B - 1, B, B + 1, 3 * B, 3 * B + 77, 64 * B - 5, 64 * B]:
        data = rng.randbytes(n)
        assert crc_of_blocks(block_crcs_of(data), n) == crc32c.crc32c(data), (seed, n)


# ---- an index from before block CRCs ------------------------------------------------------
# The schema as it was before block CRCs (git show 9c26514:src/loomfs/storage/engine/file.py).
OLD_SCHEMA = """
CREATE TABLE IF NOT EXISTS chunks (
    inode INTEGER NOT NULL, idx INTEGER NOT NULL, commit_ver INTEGER NOT NULL,
    length INTEGER NOT NULL, crc INTEGER NOT NULL, file_ver INTEGER NOT NULL,
    PRIMARY KEY (inode, idx)) WITHOUT ROWID
"""


def _old_target(path: Path, chunks: dict[ChunkKey, tuple[int, bytes]], *, bad_crc: set[ChunkKey] = frozenset()) -> None:  # type: ignore[assignment]
    """A target as the old engine left it: data files + schema-0 rows."""
    (path / "chunks").mkdir(parents=True)
    db = sqlite3.connect(path / "index.sqlite", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(OLD_SCHEMA)
    for key, (ver, data) in chunks.items():
        bucket = path / "chunks" / f"{key.inode & 0xFF:02x}"
        bucket.mkdir(exist_ok=True)
        (bucket / f"{key.inode:x}.{key.index:x}.{ver:x}").write_bytes(data)
        crc = crc32c.crc32c(data) ^ (1 if key in bad_crc else 0)
        db.execute("INSERT OR REPLACE INTO chunks VALUES (?, ?, ?, ?, ?, ?)", (key.inode, key.index, ver, len(data), crc, ver))
    db.close()


@pytest.mark.parametrize("direct", [False, True])
def test_old_schema_index_opens_and_reads(tmp_path: Path, direct: bool) -> None:
    path = tmp_path / "old"
    good, bad, grow, cow = ChunkKey(5, 0), ChunkKey(5, 1), ChunkKey(5, 2), ChunkKey(6, 0)
    data = {k: os.urandom(n) for k, n in [(good, 3 * B + 11), (bad, 2 * B), (grow, B + 1), (cow, 4 * B)]}
    _old_target(path, {k: (3, d) for k, d in data.items()}, bad_crc={bad})
    e = FileEngine(path, direct_io=direct)
    try:
        assert [(s.key, s.tags) for s in e.list_chunks()] == [(good, ()), (bad, ()), (grow, ()), (cow, ())]
        assert all(read(e, 0, 1 << 20, k) == d for k, d in data.items())  # whole reads: as before
        # first partial read: block CRCs computed from the file, whole CRC checked, row updated
        assert read(e, B + 5, 100, good) == data[good][B + 5 : B + 105]
        check_content(e, data[good], good)
        with pytest.raises(StatusError) as ei:
            read(e, 10, 10, bad)
        assert ei.value.status is Status.CHECKSUM_MISMATCH
        assert e.verify(bad) == [0, 1]  # bad, position unknown
        # updates on old rows: an append continues the (now computed) CRCs, an overwrite copies
        e.stage_write(grow, 4, B + 1, b"more")
        run(e.commit(grow, 4))
        check_content(e, data[grow] + b"more", grow)
        e.stage_write(cow, 4, 2 * B - 3, b"cow!" * 10)
        run(e.commit(cow, 4))
        check_content(e, _patched(data[cow], 2 * B - 3, b"cow!" * 10), cow)
        # a whole rewrite repairs the bad one
        e.stage_write(bad, 4, 0, data[bad], full_replace=True)
        run(e.commit(bad, 4))
        check_content(e, data[bad], bad)
    finally:
        e.close()
    db = sqlite3.connect(path / "index.sqlite")
    assert db.execute("PRAGMA user_version").fetchone()[0] == 2
    rows = dict(db.execute("SELECT idx, blocks IS NOT NULL FROM chunks WHERE inode = 5").fetchall())
    db.close()
    assert rows == {0: 1, 1: 1, 2: 1}
    e = FileEngine(path, direct_io=direct)  # reopen the migrated index
    try:
        check_content(e, data[good], good)
        check_content(e, _patched(data[cow], 2 * B - 3, b"cow!" * 10), cow)
    finally:
        e.close()


def test_old_schema_bad_chunk_refuses_partial_update(tmp_path: Path) -> None:
    path = tmp_path / "old"
    _old_target(path, {K: (2, os.urandom(B + 5))}, bad_crc={K})
    e = FileEngine(path)
    try:
        for stage_it in (lambda: e.stage_write(K, 3, 10, b"x"), lambda: e.stage_write(K, 3, B + 5, b"x"),
                         lambda: e.stage_truncate(K, 3, 10), lambda: e.stage_truncate(K, 3, 5 * B)):
            with pytest.raises(StatusError) as ei:
                stage_it()
            assert ei.value.status is Status.CHECKSUM_MISMATCH
            assert e.get(K).pending_ver == 0  # type: ignore[union-attr]
        assert len([p for p in (path / "chunks").rglob("*") if p.is_file()]) == 1  # nothing leaked
    finally:
        e.close()


# ---- ordered listing structure ------------------------------------------------------------
@pytest.mark.parametrize("small", [False, True])
def test_chunk_map_scan_matches_sorted_model(small: bool) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    cm: ChunkMap[int] = ChunkMap()
    if small:  # exercise every path: inbox folding, stale rebuilds, cached index orders
        cm._INBOX_MIN, cm._STALE_MIN, cm._ORDER_CACHE_MIN = 2, 2, 3  # type: ignore[misc]
    model: dict[ChunkKey, int] = {}
    inodes = [rng.randrange(1, 1 << 64) for _ in range(30)] + [1, 2, 3]
    for step in range(4000):
        ino = rng.choice(inodes)
        idx = rng.randrange(0, 200) if ino != 1 else rng.randrange(0, 5)
        if rng.random() < 0.55:
            cm.put(ino, idx, step)
            model[ChunkKey(ino, idx)] = step
        else:
            cm.pop(ino, idx)
            model.pop(ChunkKey(ino, idx), None)
        if step % 97 == 0:
            want = sorted(model.items())
            assert len(cm) == len(model), seed
            assert list(cm.scan()) == want, seed
            after = rng.choice(want)[0] if want and rng.random() < 0.8 else ChunkKey(rng.randrange(1 << 64), 7)
            assert list(cm.scan(after)) == [kv for kv in want if kv[0] > after], seed
            ino = rng.choice(inodes)
            lo, hi = sorted(rng.randrange(0, 220) for _ in range(2))
            assert list(cm.scan(None, ino, lo, hi)) == [kv for kv in want if kv[0].inode == ino and lo <= kv[0].index < hi], seed
            assert cm.inode_range(ino, lo, hi) == [(k.index, v) for k, v in want if k.inode == ino and lo <= k.index < hi]
