"""One ChunkEngine contract, checked against every engine (memory, file, file+fsync)."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import crc32c
import pytest
from engine_harness import Harness, run

from loomfs.errors import NotFound, StatusError
from loomfs.storage.engine.base import ChunkEngine
from loomfs.storage.engine.blocks import block_crcs_of, unpack_blocks
from loomfs.storage.engine.file import FileEngine
from loomfs.storage.engine.types import ChunkKey
from loomfs.wire.status import Status

K = ChunkKey(7, 0)


@pytest.fixture(params=["memory", "file", "file-fsync"])
def h(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(request.param, tmp_path / "target")
    yield harness
    harness.engine.close()


def read_all(e: ChunkEngine, key: ChunkKey, *, pending: bool = False, size: int = 1 << 20) -> bytes:
    buf = bytearray(size)
    n = e.read(key, 0, memoryview(buf), pending=pending)
    return bytes(buf[:n])


def write(e: ChunkEngine, key: ChunkKey, ver: int, offset: int, data: bytes) -> None:
    e.stage_write(key, ver, offset, data, data_crc=crc32c.crc32c(data))
    run(e.commit(key, ver))


def test_empty(h: Harness) -> None:
    e = h.engine
    assert e.get(K) is None
    with pytest.raises(NotFound):
        e.read(K, 0, memoryview(bytearray(10)))
    assert e.list_chunks() == []
    u = e.usage()
    assert (u.used_bytes, u.chunk_count) == (0, 0) and u.capacity_bytes > 0


def test_full_write_invisible_until_commit(h: Harness) -> None:
    e = h.engine
    data = os.urandom(100_000)
    st = e.stage_write(K, 1, 0, data, data_crc=crc32c.crc32c(data))
    assert (st.commit_ver, st.pending_ver, st.pending_length, st.pending_crc) == (0, 1, len(data), crc32c.crc32c(data))
    assert st.has_pending
    with pytest.raises(NotFound):
        e.read(K, 0, memoryview(bytearray(10)))
    assert read_all(e, K, pending=True) == data
    st = run(e.commit(K, 1))
    assert (st.commit_ver, st.pending_ver, st.length, st.crc) == (1, 0, len(data), crc32c.crc32c(data))
    assert read_all(e, K) == data
    assert e.usage().used_bytes == len(data) and e.usage().chunk_count == 1


def test_read_ranges(h: Harness) -> None:
    e = h.engine
    data = bytes(range(256)) * 40
    write(e, K, 1, 0, data)
    buf = bytearray(100)
    assert e.read(K, 10, memoryview(buf)) == 100 and bytes(buf) == data[10:110]
    assert e.read(K, len(data) - 30, memoryview(buf)) == 30 and bytes(buf[:30]) == data[-30:]
    assert e.read(K, len(data) + 5, memoryview(buf)) == 0


@pytest.mark.parametrize("offset,size", [(100, 50), (0, 10), (990, 10), (500, 1000)])
def test_partial_overwrite(h: Harness, offset: int, size: int) -> None:
    e = h.engine
    base = os.urandom(1000)
    write(e, K, 1, 0, base)
    patch = os.urandom(size)
    st = e.stage_write(K, 2, offset, patch)
    expect = bytearray(base)
    expect[offset : offset + size] = patch
    assert read_all(e, K) == base  # committed stays readable
    assert st.pending_length == len(expect) and st.pending_crc == crc32c.crc32c(expect)
    st = run(e.commit(K, 2))
    assert read_all(e, K) == bytes(expect) and st.crc == crc32c.crc32c(expect) and st.length == len(expect)


def test_append_and_gap(h: Harness) -> None:
    e = h.engine
    write(e, K, 1, 0, b"a" * 100)
    e.stage_write(K, 2, 100, b"b" * 50)
    assert read_all(e, K) == b"a" * 100 and e.get(K).length == 100  # type: ignore[union-attr]
    st = run(e.commit(K, 2))
    assert read_all(e, K) == b"a" * 100 + b"b" * 50 and st.crc == crc32c.crc32c(b"a" * 100 + b"b" * 50)
    # junk appended then aborted must not show up as the gap of a later write
    e.stage_write(K, 3, 150, b"J" * 500)
    e.abort(K)
    assert e.get(K).pending_ver == 0  # type: ignore[union-attr]
    st = e.stage_write(K, 3, 400, b"c" * 10)
    expect = b"a" * 100 + b"b" * 50 + bytes(250) + b"c" * 10
    assert st.pending_crc == crc32c.crc32c(expect)
    run(e.commit(K, 3))
    assert read_all(e, K) == expect


def test_write_at_offset_on_new_chunk(h: Harness) -> None:
    e = h.engine
    write(e, K, 1, 4096, b"x" * 10)
    assert read_all(e, K) == bytes(4096) + b"x" * 10
    assert e.get(K).crc == crc32c.crc32c(bytes(4096) + b"x" * 10)  # type: ignore[union-attr]


def test_full_replace(h: Harness) -> None:
    e = h.engine
    write(e, K, 1, 0, b"z" * 1000)
    e.stage_write(K, 5, 0, b"short", full_replace=True)
    run(e.commit(K, 5))
    assert read_all(e, K) == b"short" and e.get(K).commit_ver == 5  # type: ignore[union-attr]
    # a covering write from offset 0 (not full_replace) also replaces everything
    write(e, K, 6, 0, b"q" * 2000)
    assert read_all(e, K) == b"q" * 2000


@pytest.mark.parametrize("new_len", [0, 10, 100, 5000])
def test_truncate(h: Harness, new_len: int) -> None:
    e = h.engine
    base = os.urandom(100)
    write(e, K, 1, 0, base)
    st = e.stage_truncate(K, 2, new_len)
    assert read_all(e, K) == base
    expect = base[:new_len] + bytes(max(0, new_len - 100))
    assert st.pending_length == new_len and st.pending_crc == crc32c.crc32c(expect)
    run(e.commit(K, 2))
    assert read_all(e, K, size=8192) == expect and e.get(K).crc == crc32c.crc32c(expect)  # type: ignore[union-attr]


def test_truncate_missing_chunk_creates_it(h: Harness) -> None:
    e = h.engine
    e.stage_truncate(K, 1, 300)
    run(e.commit(K, 1))
    assert read_all(e, K) == bytes(300)


def test_versions(h: Harness) -> None:
    e = h.engine
    write(e, K, 3, 0, b"v3")
    with pytest.raises(StatusError) as ei:
        e.stage_write(K, 3, 0, b"again")
    assert ei.value.status is Status.VERSION_MISMATCH
    e.stage_write(K, 4, 0, b"first try")
    e.stage_write(K, 4, 0, b"second try")  # re-staging replaces the pending update
    with pytest.raises(NotFound):
        run(e.commit(K, 5))
    run(e.commit(K, 4))
    assert read_all(e, K) == b"second try"
    with pytest.raises(NotFound):
        run(e.commit(K, 4))  # nothing pending any more


def test_abort_keeps_committed(h: Harness) -> None:
    e = h.engine
    write(e, K, 1, 0, b"keep")
    e.stage_write(K, 2, 1, b"XXXXXXXX")
    e.abort(K)
    assert read_all(e, K) == b"keep" and e.get(K).pending_ver == 0  # type: ignore[union-attr]
    e.stage_write(ChunkKey(7, 1), 1, 0, b"new")
    e.abort(ChunkKey(7, 1))
    assert e.get(ChunkKey(7, 1)) is None
    e.abort(ChunkKey(99, 99))  # no-op


@pytest.mark.parametrize("stage", ["overwrite", "append", "full", "truncate_down", "truncate_up", "new"])
def test_crash_keeps_committed_drops_pending(h: Harness, stage: str) -> None:
    e = h.engine
    base = os.urandom(3000)
    write(e, K, 1, 0, base)
    other = ChunkKey(8, 2)
    {
        "overwrite": lambda: e.stage_write(K, 2, 10, b"Y" * 100),
        "append": lambda: e.stage_write(K, 2, 3000, b"Y" * 100),
        "full": lambda: e.stage_write(K, 2, 0, b"Y" * 5000),
        "truncate_down": lambda: e.stage_truncate(K, 2, 10),
        "truncate_up": lambda: e.stage_truncate(K, 2, 9000),
        "new": lambda: e.stage_write(other, 1, 0, b"Y" * 10),
    }[stage]()
    e = h.crash()
    st = e.get(K)
    assert st is not None and (st.commit_ver, st.pending_ver, st.length) == (1, 0, 3000)
    assert st.crc == crc32c.crc32c(base) and read_all(e, K) == base
    assert e.get(other) is None
    assert e.usage().chunk_count == 1 and e.usage().used_bytes == 3000
    # the chunk keeps working after the restart; leftovers of the lost update read as zeros
    write(e, K, 2, 3050, b"tail")
    assert read_all(e, K) == base + bytes(50) + b"tail"
    assert e.get(K).crc == crc32c.crc32c(base + bytes(50) + b"tail")  # type: ignore[union-attr]
    if isinstance(e, FileEngine):
        files = [p.name for p in (h.path / "chunks").rglob("*") if p.is_file()]
        assert len(files) == 1, files


def test_committed_survives_restart(h: Harness) -> None:
    e = h.engine
    big_inode = (1 << 64) - 5
    keys = [ChunkKey(big_inode, 0), ChunkKey(1, 1 << 40), K]
    for i, k in enumerate(keys):
        write(e, k, i + 1, 0, bytes([i]) * (i + 10))
    e = h.crash()
    for i, k in enumerate(keys):
        assert read_all(e, k) == bytes([i]) * (i + 10) and e.get(k).commit_ver == i + 1  # type: ignore[union-attr]


def test_remove_range(h: Harness) -> None:
    e = h.engine
    for i in range(6):
        write(e, ChunkKey(5, i), 1, 0, b"d" * 10)
    write(e, ChunkKey(6, 0), 1, 0, b"other")
    e.stage_write(ChunkKey(5, 3), 2, 0, b"pending")
    e.stage_write(ChunkKey(5, 9), 1, 0, b"pending only")
    assert run(e.remove_range(5, 2, 4)) == 2
    assert [s.key.index for s in e.list_chunks(5)] == [0, 1, 4, 5, 9]
    assert run(e.remove_range(5)) == 4
    assert e.list_chunks(5) == [] and e.get(ChunkKey(5, 9)) is None
    assert run(e.remove_range(5)) == 0
    assert e.usage().chunk_count == 1 and e.usage().used_bytes == 5
    e = h.crash()
    assert [s.key for s in e.list_chunks()] == [ChunkKey(6, 0)]


def test_list_chunks(h: Harness) -> None:
    e = h.engine
    for ino, idx in [(3, 5), (1, 2), (3, 1), (2, 0), (1, 0)]:
        write(e, ChunkKey(ino, idx), 2, 0, b"x" * idx)
    e.stage_write(ChunkKey(3, 7), 1, 0, b"p")
    assert [(s.key.inode, s.key.index) for s in e.list_chunks()] == [(1, 0), (1, 2), (2, 0), (3, 1), (3, 5), (3, 7)]
    assert [s.key.index for s in e.list_chunks(3, 1, 6)] == [1, 5]
    assert len(e.list_chunks(limit=2)) == 2
    s = e.list_chunks(3, 7, 8)[0]
    assert (s.commit_ver, s.pending_ver) == (0, 1)


def _all_pages(e: ChunkEngine, limit: int, **kw: object) -> list[ChunkKey]:
    out: list[ChunkKey] = []
    after: ChunkKey | None = None
    while True:
        page = e.list_chunks(limit=limit, after=after, **kw)  # type: ignore[arg-type]
        assert len(page) <= limit
        out += [s.key for s in page]
        if len(page) < limit:
            return out
        after = page[-1].key


def test_list_chunks_after_pages(h: Harness) -> None:
    e = h.engine
    big = (1 << 64) - 3
    keys = [ChunkKey(ino, idx) for ino in (1, 2, 9, 300, big) for idx in (0, 1, 5, 1 << 40)]
    keys += [ChunkKey(7, i) for i in range(100)]  # a big inode (its order is cached)
    for k in keys[::2]:
        write(e, k, 1, 0, b"c")
    for k in keys[1::2]:
        e.stage_write(k, 1, 0, b"pending only")  # listed too, in order
    want = sorted(keys)
    assert [s.key for s in e.list_chunks(limit=1000)] == want
    for limit in (1, 3, 7, 64, len(want), 1000):
        assert _all_pages(e, limit) == want, limit
    for i in range(0, len(want), 11):  # strictly after any key, present or not
        assert [s.key for s in e.list_chunks(after=want[i], limit=1000)] == want[i + 1 :]
    assert [s.key for s in e.list_chunks(after=ChunkKey(8, 0), limit=1000)] == [k for k in want if k.inode >= 9]
    assert [s.key for s in e.list_chunks(after=ChunkKey(7, 50), limit=3)] == [ChunkKey(7, 51), ChunkKey(7, 52), ChunkKey(7, 53)]
    assert e.list_chunks(after=want[-1]) == [] and e.list_chunks(after=ChunkKey(big, 1 << 41)) == []
    assert e.list_chunks(limit=0) == []
    # with an inode, ``after`` is one more lower bound
    assert [s.key.index for s in e.list_chunks(7, 10, 20, after=ChunkKey(7, 14))] == list(range(15, 20))
    assert [s.key.index for s in e.list_chunks(7, 10, 20, after=ChunkKey(6, 99))] == list(range(10, 20))
    assert e.list_chunks(7, after=ChunkKey(8, 0)) == []
    assert [s.key.index for s in e.list_chunks(9, after=ChunkKey(9, 1))] == [5, 1 << 40]


def test_list_chunks_pages_while_changing(h: Harness) -> None:
    """A scan that runs while chunks come and go: strictly increasing (no repeats), and every
    chunk that was there all along is listed."""
    e = h.engine
    initial = {ChunkKey(ino, idx) for ino in range(1, 41) for idx in range(3)}
    for k in initial:
        write(e, k, 1, 0, b"x")
    ever, removed = set(initial), set()
    seen: list[ChunkKey] = []
    after: ChunkKey | None = None
    step = 0
    while True:
        page = e.list_chunks(limit=5, after=after)
        seen += [s.key for s in page]
        if len(page) < 5:
            break
        after = page[-1].key
        step += 1
        gone = 40 - step if step % 2 else step // 2  # ahead of and behind the cursor
        run(e.remove_range(gone))
        removed.add(gone)
        new = [ChunkKey(100 + step, 0), ChunkKey(gone, 1)]  # a new inode; a removed one back
        for k in new:
            write(e, k, 2, 0, b"new")
        e.stage_write(ChunkKey(1000 + step, 0), 1, 0, b"pending")
        ever.update(new + [ChunkKey(1000 + step, 0)])
    assert seen == sorted(set(seen)) and set(seen) <= ever
    assert {k for k in initial if k.inode not in removed} <= set(seen)
    final = [s.key for s in e.list_chunks(limit=10_000)]
    assert final == sorted(final) and _all_pages(e, 4) == final


def test_random_ops_match_model(h: Harness) -> None:
    """Random writes/truncates/aborts/crashes against a plain bytearray model."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    e = h.engine
    model: dict[ChunkKey, tuple[int, bytes]] = {}
    keys = [ChunkKey(1, i) for i in range(3)]
    for _ in range(150):
        k = rng.choice(keys)
        ver, cur = model.get(k, (0, b""))
        op = rng.random()
        if op < 0.08:
            e = h.crash()
            continue
        if op < 0.55:
            off = rng.choice([0, len(cur), rng.randrange(0, len(cur) + 1), len(cur) + rng.randrange(1, 3000)])
            data = rng.randbytes(rng.randrange(0, 5000))
            new = bytearray(cur) + bytes(max(0, off - len(cur)))
            new[off : off + len(data)] = data
            e.stage_write(k, ver + 1, off, data)
        else:
            n = rng.randrange(0, 6000)
            new = bytearray(cur[:n]) + bytes(max(0, n - len(cur)))
            e.stage_truncate(k, ver + 1, n)
        if rng.random() < 0.2:
            e.abort(k)
            continue
        run(e.commit(k, ver + 1))
        model[k] = (ver + 1, bytes(new))
    for k, (ver, data) in model.items():
        st = e.get(k)
        assert st is not None, seed
        assert (st.commit_ver, st.length, st.crc) == (ver, len(data), crc32c.crc32c(data)), seed
        assert read_all(e, k, size=64 << 10) == data, seed
        assert e.block_crcs(k) == unpack_blocks(block_crcs_of(data)) and e.verify(k) == [], seed
        if len(data) > 2:
            buf = bytearray(len(data) - 2)
            assert e.read(k, 1, memoryview(buf)) == len(buf) and bytes(buf) == data[1:-1], seed
