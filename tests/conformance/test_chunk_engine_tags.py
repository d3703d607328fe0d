"""Request tags (retry dedupe that survives a change of head), checked against every engine: a
version's tags are committed with it and reported by get / list_chunks, ``tags=None`` keeps the
committed list, pending tags stay invisible until commit, abort and crash lose pending tags only,
at most TAGS_MAX are kept; the file engine keeps them across restarts, writes them in the commit's
one row write, and migrates an index from before tags (schema 1)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import crc32c
import pytest
from engine_harness import Harness, run

from loomfs.errors import InvalidArgument
from loomfs.storage.engine.base import ChunkEngine
from loomfs.storage.engine.file import FileEngine
from loomfs.storage.engine.file_index import SCHEMA_VERSION
from loomfs.storage.engine.tags import TagListCache, decode_tags, encode_tags, tags_with
from loomfs.storage.engine.types import BLOCK_BYTES, TAGS_MAX, ChunkKey, ChunkState, ChunkTag

B = BLOCK_BYTES
K = ChunkKey(0x77, 2)
BASE = os.urandom(2 * B + 100)
A = (ChunkTag(1, 10, 1),)
T = (ChunkTag(1, 10, 1), ChunkTag(2, 20, 2))


@pytest.fixture(params=["memory", "file", "file-fsync"])
def h(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(request.param, tmp_path / "target")
    yield harness
    harness.engine.close()


def state(e: ChunkEngine, key: ChunkKey = K) -> ChunkState:
    st = e.get(key)
    assert st is not None
    return st


def listed(e: ChunkEngine, key: ChunkKey = K) -> ChunkState:
    (st,) = [s for s in e.list_chunks(key.inode) if s.key == key]
    assert st == state(e, key)  # list_chunks reports what get does
    return st


def first_version(e: ChunkEngine, tags: tuple[ChunkTag, ...] = A) -> None:
    e.stage_write(K, 1, 0, BASE, data_crc=crc32c.crc32c(BASE), tags=tags)
    run(e.commit(K, 1))


# Every kind of update (the file engine stages each differently: new file, in place, copy).
STAGES: dict[str, Callable[[ChunkEngine, int, tuple[ChunkTag, ...] | None], ChunkState]] = {
    "whole": lambda e, v, t: e.stage_write(K, v, 0, os.urandom(3 * B), tags=t),
    "full_replace": lambda e, v, t: e.stage_write(K, v, 0, b"short", full_replace=True, tags=t),
    "append": lambda e, v, t: e.stage_write(K, v, len(BASE) + 7, b"tail", tags=t),
    "overwrite": lambda e, v, t: e.stage_write(K, v, B - 3, b"x" * 10, tags=t),
    "truncate_grow": lambda e, v, t: e.stage_truncate(K, v, 4 * B, tags=t),
    "truncate_shrink": lambda e, v, t: e.stage_truncate(K, v, B + 1, tags=t),
}


@pytest.mark.parametrize("kind", list(STAGES))
def test_tags_commit_with_their_version(h: Harness, kind: str) -> None:
    e = h.engine
    st = e.stage_write(K, 1, 0, BASE, tags=A)
    assert (st.tags, st.pending_tags) == ((), A)  # a first write: nothing committed yet
    assert listed(e).pending_tags == A
    st = run(e.commit(K, 1))
    assert (st.tags, st.pending_tags) == (A, ())
    assert (listed(e).tags, listed(e).pending_tags) == (A, ())
    st = STAGES[kind](e, 2, T)
    assert (st.commit_ver, st.tags, st.pending_ver, st.pending_tags) == (1, A, 2, T)  # invisible
    assert (listed(e).tags, listed(e).pending_tags) == (A, T)
    st = run(e.commit(K, 2))
    assert (st.commit_ver, st.tags, st.pending_tags) == (2, T, ())
    assert listed(e).tags == T


@pytest.mark.parametrize("kind", list(STAGES))
def test_tags_none_keeps_the_committed_tags(h: Harness, kind: str) -> None:
    e = h.engine
    first_version(e, T)
    st = STAGES[kind](e, 2, None)
    assert (st.tags, st.pending_tags) == (T, T)  # what version 2 will carry
    assert run(e.commit(K, 2)).tags == T
    assert STAGES[kind](e, 3, ()).pending_tags == ()  # an empty list is a list: it clears
    assert run(e.commit(K, 3)).tags == ()
    assert STAGES[kind](e, 4, None).pending_tags == ()


def test_new_chunk_without_tags(h: Harness) -> None:
    e = h.engine
    assert e.stage_truncate(K, 1, 100).pending_tags == ()
    st = run(e.commit(K, 1))
    assert (st.tags, st.pending_tags) == ((), ())


@pytest.mark.parametrize("kind", list(STAGES))
def test_abort_loses_pending_tags_only(h: Harness, kind: str) -> None:
    e = h.engine
    first_version(e)
    STAGES[kind](e, 2, T)
    e.abort(K)
    st = state(e)
    assert (st.commit_ver, st.tags, st.pending_ver, st.pending_tags) == (1, A, 0, ())
    assert STAGES[kind](e, 2, None).pending_tags == A  # the next update starts from the committed ones


@pytest.mark.parametrize("kind", list(STAGES))
def test_crash_loses_pending_tags_only(h: Harness, kind: str) -> None:
    e = h.engine
    first_version(e)
    other = ChunkKey(0x78, 0)
    e.stage_write(other, 1, 0, b"never committed", tags=T)
    STAGES[kind](e, 2, T)
    e = h.crash()
    st = state(e)
    assert (st.commit_ver, st.tags, st.pending_ver, st.pending_tags) == (1, A, 0, ())
    assert e.get(other) is None
    assert [s.key for s in e.list_chunks()] == [K]


def test_restage_replaces_pending_tags(h: Harness) -> None:
    """A re-forwarded update (same version, staged again) carries the tags it is given now."""
    e = h.engine
    first_version(e)
    e.stage_write(K, 2, 5, b"one", tags=T)
    assert e.stage_write(K, 2, 5, b"two", tags=A + (ChunkTag(3, 30, 2),)).pending_tags == A + (ChunkTag(3, 30, 2),)
    assert e.stage_write(K, 2, 5, b"three").pending_tags == A  # None: the committed ones
    assert run(e.commit(K, 2)).tags == A


def test_at_most_tags_max_newest_kept(h: Harness) -> None:
    e = h.engine
    many = tuple(ChunkTag(9, r, r) for r in range(1, TAGS_MAX + 5))
    assert e.stage_write(K, 1, 0, BASE, tags=many).pending_tags == many[-TAGS_MAX:]
    assert run(e.commit(K, 1)).tags == many[-TAGS_MAX:]
    tags = state(e).tags
    for v in range(2, 2 * TAGS_MAX):  # the service's way: committed list + the new tag, trimmed
        tags = tags_with(tags, ChunkTag(5, 100 + v, v))
        e.stage_write(K, v, 0, b"v%d" % v, tags=tags)
        assert run(e.commit(K, v)).tags == tags
        assert len(tags) == TAGS_MAX and tags[-1] == ChunkTag(5, 100 + v, v)
    assert [t.request_id for t in state(e).tags] == list(range(100 + TAGS_MAX, 100 + 2 * TAGS_MAX))


@pytest.mark.parametrize("bad", [ChunkTag(-1, 1, 1), ChunkTag(1, 1 << 64, 1), ChunkTag(1, 1, -2)])
def test_bad_tag_refused_before_anything_changes(h: Harness, bad: ChunkTag) -> None:
    e = h.engine
    first_version(e)
    e.stage_write(K, 2, 0, b"pending", tags=T)
    for stage_it in (lambda: e.stage_write(K, 3, 0, b"x", tags=(bad,)),
                     lambda: e.stage_write(K, 3, len(BASE), b"x", tags=A + (bad,)),
                     lambda: e.stage_truncate(K, 3, 10, tags=(bad,))):
        with pytest.raises(InvalidArgument):
            stage_it()
        st = state(e)
        assert (st.commit_ver, st.tags, st.pending_ver, st.pending_tags) == (1, A, 2, T)
    with pytest.raises(InvalidArgument):
        e.stage_write(ChunkKey(0x79, 0), 1, 0, b"x", tags=(bad,))
    assert e.get(ChunkKey(0x79, 0)) is None


def test_remove_range_drops_tags(h: Harness) -> None:
    e = h.engine
    first_version(e, T)
    e.stage_write(ChunkKey(K.inode, 9), 1, 0, b"pending", tags=A)
    assert run(e.remove_range(K.inode)) == 1
    assert e.get(K) is None and e.get(ChunkKey(K.inode, 9)) is None
    assert e.stage_write(K, 1, 0, b"again").pending_tags == ()
    assert run(e.commit(K, 1)).tags == ()


def test_tags_survive_reopen_and_crash(h: Harness) -> None:
    e = h.engine
    big = (ChunkTag((1 << 64) - 1, (1 << 64) - 2, (1 << 63) + 5), ChunkTag(0, 0, 1))
    keys = [ChunkKey(3, 0), ChunkKey((1 << 64) - 3, 1 << 40), ChunkKey(3, 1)]
    for k, t in zip(keys, [big, T, ()], strict=True):
        e.stage_write(k, 1, 0, b"data", tags=t)
        run(e.commit(k, 1))
    e = h.reopen()
    assert [(s.key, s.tags, s.pending_tags) for s in e.list_chunks()] == [
        (keys[0], big, ()), (keys[2], (), ()), (keys[1], T, ())]
    e.stage_write(keys[0], 2, 0, b"v2", tags=tags_with(big, ChunkTag(7, 7, 2)))
    run(e.commit(keys[0], 2))
    e.stage_write(keys[1], 2, 4, b"+", tags=A)  # pending at the crash: lost with its tags
    e = h.crash()
    assert [(s.key, s.tags, s.pending_tags) for s in e.list_chunks()] == [
        (keys[0], big + (ChunkTag(7, 7, 2),), ()), (keys[2], (), ()), (keys[1], T, ())]
    e = h.reopen()
    assert state(e, keys[0]).tags == big + (ChunkTag(7, 7, 2),)


def test_async_whole_write_carries_tags(h: Harness) -> None:
    e = h.engine
    first_version(e)
    data = os.urandom(4 << 20)  # big enough for the file engine's off-loop path

    async def go() -> None:
        st = await e.astage_write(K, 2, 0, data, data_crc=crc32c.crc32c(data), tags=T)
        assert (st.tags, st.pending_tags) == (A, T)
        assert (await e.commit(K, 2)).tags == T
        st = await e.astage_write(K, 3, 0, data, data_crc=crc32c.crc32c(data))
        assert st.pending_tags == T
        e.abort(K)

    run(go())
    assert (state(e).tags, state(e).pending_tags) == (T, ())


def test_pack_round_trip() -> None:
    tags = tuple(ChunkTag(c, c * 3, c + 1) for c in range(TAGS_MAX + 2))
    assert decode_tags(encode_tags(tags)) == tags[-TAGS_MAX:]
    assert encode_tags(()) == b"" and decode_tags(b"") == ()
    assert len(encode_tags(tags)) == 24 * TAGS_MAX
    assert tags_with((), A[0]) == A
    cache = TagListCache(entries_max=2)
    blobs = [encode_tags(tags[i : i + 2]) for i in range(3)]
    assert [cache.decode(b) for b in blobs] == [tags[i : i + 2] for i in range(3)]
    assert cache.decode(blobs[2]) == tags[2:4] and (cache.hits, cache.misses) == (1, 3)
    assert cache.decode(blobs[0]) == tags[0:2] and cache.misses == 4  # the oldest went first
    assert repr(cache) == "TagListCache(entries=2/2 hits=1 misses=4)"


# ---- file engine: one row write per commit; an index from before tags --------------------------
@pytest.mark.parametrize("fsync", [False, True])
def test_commit_is_one_statement(tmp_path: Path, fsync: bool) -> None:
    e = FileEngine(tmp_path / "t", fsync_on_commit=fsync)
    try:
        first_version(e, T)
        statements: list[str] = []
        e._index._db.set_trace_callback(statements.append)
        e.stage_write(K, 2, 3, b"x", tags=tags_with(T, ChunkTag(4, 4, 2)))
        run(e.commit(K, 2))
        e._index._db.set_trace_callback(None)
        assert len(statements) == 1 and statements[0].startswith("INSERT OR REPLACE")
    finally:
        e.close()


# The schema as it was before tags (git show cc1d278:src/loomfs/storage/engine/file.py).
SCHEMA_1 = """
CREATE TABLE IF NOT EXISTS chunks (
    inode INTEGER NOT NULL, idx INTEGER NOT NULL, commit_ver INTEGER NOT NULL,
    length INTEGER NOT NULL, crc INTEGER NOT NULL, file_ver INTEGER NOT NULL,
    blocks BLOB,
    PRIMARY KEY (inode, idx)) WITHOUT ROWID
"""


def _schema1_target(path: Path, chunks: dict[ChunkKey, bytes]) -> None:
    """A target as the schema-1 engine left it: data files + rows without tags (version 3)."""
    (path / "chunks").mkdir(parents=True)
    db = sqlite3.connect(path / "index.sqlite", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(SCHEMA_1)
    db.execute("PRAGMA user_version = 1")
    for key, data in chunks.items():
        bucket = path / "chunks" / f"{key.inode & 0xFF:02x}"
        bucket.mkdir(exist_ok=True)
        (bucket / f"{key.inode:x}.{key.index:x}.3").write_bytes(data)
        blocks = b"".join(crc32c.crc32c(data[i : i + B]).to_bytes(4, "little") for i in range(0, len(data), B))
        db.execute("INSERT INTO chunks VALUES (?, ?, 3, ?, ?, 3, ?)",
                   (key.inode, key.index, len(data), crc32c.crc32c(data), blocks))
    db.close()


def test_schema1_index_migrates(tmp_path: Path) -> None:
    path = tmp_path / "old"
    old, kept = ChunkKey(5, 0), ChunkKey(5, 1)
    data = {old: os.urandom(B + 90), kept: os.urandom(100)}
    _schema1_target(path, data)
    e = FileEngine(path)
    try:
        assert [(s.key, s.commit_ver, s.tags) for s in e.list_chunks()] == [(old, 3, ()), (kept, 3, ())]
        buf = bytearray(50)
        assert e.read(old, B - 20, memoryview(buf)) == 50 and bytes(buf) == data[old][B - 20 : B + 30]
        st = e.stage_write(old, 4, B, b"new", tags=T)
        assert (st.tags, st.pending_tags) == ((), T)
        assert run(e.commit(old, 4)).tags == T
        assert e.stage_write(kept, 4, 0, b"kept").pending_tags == ()  # old rows: no tags to keep
        run(e.commit(kept, 4))
    finally:
        e.close()
    db = sqlite3.connect(path / "index.sqlite")
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    assert "tags" in {row[1] for row in db.execute("PRAGMA table_info(chunks)")}
    rows = dict(db.execute("SELECT idx, tags FROM chunks WHERE inode = 5").fetchall())
    db.close()
    assert rows == {0: encode_tags(T), 1: b""}
    e = FileEngine(path)  # reopen the migrated index
    try:
        assert [(s.key, s.commit_ver, s.tags) for s in e.list_chunks()] == [(old, 4, T), (kept, 4, ())]
        buf = bytearray(B + 3)
        assert e.read(old, 0, memoryview(buf)) == B + 3 and bytes(buf) == data[old][:B] + b"new"
    finally:
        e.close()


def test_malformed_tags_row_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "t"
    e = FileEngine(path)
    first_version(e, T)
    e.stage_write(ChunkKey(8, 0), 1, 0, b"ok", tags=A)
    run(e.commit(ChunkKey(8, 0), 1))
    e.close()
    db = sqlite3.connect(path / "index.sqlite", isolation_level=None)
    db.execute("UPDATE chunks SET tags = ? WHERE inode = ?", (b"\x01" * 25, K.inode))
    db.close()
    e = FileEngine(path)
    try:
        assert state(e).tags == () and state(e, ChunkKey(8, 0)).tags == A
        assert state(e).commit_ver == 1 and state(e).length == len(BASE)  # the chunk itself is kept
    finally:
        e.close()
