"""Crash-safe truncates against real processes: a truncate that committed in meta but whose
chunks were never cut (the process died in between) is cut by meta's GC, or by the next write
open, before any new byte lands; a later extend or sparse write reads zeros, not old bytes; a
writer that missed a truncate cannot grow the length back on close."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

import loomfs
from loomfs.meta.ops.namespace import Namespace
from loomfs.meta.store.sqlite import SqliteStore
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CHUNK = 64 << 10


def _crashed_truncate(cluster: LocalCluster, path: str, size: int) -> None:
    """Commit a truncate the way meta does, then "die" before cutting any chunk: a Namespace
    with no trimmer on the cluster's own metadata store (shared by its meta processes)."""

    async def go() -> None:
        store = SqliteStore(str(cluster.root / "meta.db"))
        try:
            r = await Namespace(store).setattr(path, size=size)
            assert r.attr.size == size
        finally:
            await store.close()

    asyncio.run(go())


def _poll(ok: Callable[[], Any], timeout_s: float, what: str) -> Any:
    end = time.monotonic() + timeout_s
    while True:
        got = ok()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _chunks(cluster: LocalCluster, inode: int) -> dict[int, set[int]]:
    """chunk index -> the lengths its replicas have, for chunks holding bytes (a trimmed chunk
    stays as an empty version, so its version numbers go on if it grows back)."""
    out: dict[int, set[int]] = {}
    for _target, c in cluster.chunks_of(inode):
        if c.length or c.update_ver > c.commit_ver:
            out.setdefault(c.chunk.index, set()).add(c.length)
    return out


def _file(fs: loomfs.LoomFS, path: str, data: bytes) -> int:
    with fs.open(path, "wb") as f:
        f.write(data)
    return fs.attr(path).inode


def test_gc_cuts_a_truncate_whose_trim_was_lost(cluster: LocalCluster, fs: loomfs.LoomFS, base: str) -> None:
    fs.set_layout(base, chunk_size=CHUNK, stripe=2)
    path = f"{base}/f"
    ino = _file(fs, path, b"o" * (3 * CHUNK + 100))
    assert sorted(_chunks(cluster, ino)) == [0, 1, 2, 3]
    _crashed_truncate(cluster, path, CHUNK + 7)
    assert fs.statfs().trims_pending >= 1
    # nobody touches the file: meta's GC worker finds the entry and cuts
    _poll(lambda: _chunks(cluster, ino) == {0: {CHUNK}, 1: {7}}, 30, "GC to cut the chunks past the new end")
    _poll(lambda: fs.statfs().trims_pending == 0, 10, "the trim entry to go")
    fs.truncate(path, 3 * CHUNK)  # extend: the old bytes must not come back
    assert fs.cat(path) == b"o" * (CHUNK + 7) + bytes(2 * CHUNK - 7)
    with fs.open(path, "r+b") as f:  # a sparse write past the end
        f.seek(5 * CHUNK)
        f.write(b"new")
    assert fs.cat(path) == b"o" * (CHUNK + 7) + bytes(4 * CHUNK - 7) + b"new"


def test_rewrite_after_a_lost_trim_keeps_the_new_data(cluster: LocalCluster, fs: loomfs.LoomFS, base: str) -> None:
    # truncate to 0 commits, the trim is lost; a writer re-extends the file at once. Whoever
    # cuts (the write open, or GC), the old chunks go before the new bytes land
    fs.set_layout(base, chunk_size=CHUNK, stripe=2)
    path = f"{base}/f"
    ino = _file(fs, path, b"o" * (4 * CHUNK))
    _crashed_truncate(cluster, path, 0)
    with fs.open(path, "r+b") as f:
        f.seek(2 * CHUNK + 10)
        f.write(b"new")
    want = bytes(2 * CHUNK + 10) + b"new"
    assert fs.cat(path) == want
    _poll(lambda: fs.statfs().trims_pending == 0, 10, "no trim left")
    time.sleep(2.5)  # a few GC rounds (gc_interval_s = 1): nothing may cut the new data
    assert fs.cat(path) == want
    assert sorted(_chunks(cluster, ino)) == [2]


def test_a_stale_writer_does_not_resurrect_a_truncated_length(
    cluster: LocalCluster, fs: loomfs.LoomFS, base: str
) -> None:
    fs.set_layout(base, chunk_size=CHUNK, stripe=2)
    path = f"{base}/f"
    _file(fs, path, b"")
    other = loomfs.connect(str(cluster.root))
    try:
        f = fs.open(path, "r+b")
        f.write(b"w" * (3 * CHUNK))
        f.flush()  # on storage, not yet reported to meta
        other.truncate(path, 10)
        f.close()  # reports 3 chunks, but it has not seen the truncate
        assert fs.attr(path).size == 10
        other.truncate(path, 2 * CHUNK)
        # like a local file: written, then truncated to 10, then extended
        assert fs.cat(path) == b"w" * 10 + bytes(2 * CHUNK - 10)
    finally:
        other.close()
