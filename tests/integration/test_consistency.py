"""Consistency modes with two independent clients of one real cluster (docs/consistency.md).

Client A writes (strict). Client B reads in strict mode: it sees every change A closed on its
next call. Client C reads in relaxed mode: it may see the old attributes and the old bytes
(always one whole version) until its TTL has passed since it asked, then the new ones; its
own changes it sees at once. Waits are on a condition with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import loomfs
from loomfs.config import ClientConfig
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TTL_S = 2.0
SLACK_S = 1.0  # scheduling noise on a shared VM, on top of the TTL
CHUNKED = 200 << 10  # over the 64 KiB inline limit: the file lives in chunks


@pytest.fixture()
def clients(cluster: LocalCluster) -> Iterator[tuple[loomfs.LoomFS, loomfs.LoomFS, loomfs.LoomFS]]:
    a = loomfs.connect(str(cluster.root))
    b = loomfs.connect(str(cluster.root), consistency="strict")
    c = loomfs.connect(str(cluster.root), config=ClientConfig(consistency="relaxed", attr_cache_ttl_s=TTL_S))
    yield a, b, c
    for fs in (a, b, c):
        fs.close()


def versions(size: int) -> tuple[bytes, bytes]:
    """Two contents of one size: a rewrite keeps the length, so only the version tells."""
    return b"o" * size, b"n" * size


def wait_until(deadline_s: float, check: Callable[[], Any]) -> tuple[Any, float]:
    """Poll ``check`` until it returns something truthy; (its value, seconds waited)."""
    t0 = time.monotonic()
    while True:
        value = check()
        if value:
            return value, time.monotonic() - t0
        if time.monotonic() - t0 > deadline_s:
            raise AssertionError(f"condition not met within {deadline_s}s")
        time.sleep(0.02)


@pytest.mark.parametrize("size", [4096, CHUNKED], ids=["inline", "chunked"])
def test_strict_sees_a_closed_write_on_the_next_call(clients: Any, base: str, size: int) -> None:
    a, b, _c = clients
    old, new = versions(size)
    path = f"{base}/f"
    a.pipe(path, old)
    assert b.cat(path) == old
    st_old = b.stat(path)
    with b.open(path, "rb") as f:
        assert f.read() == old
    with a.open(path, "wb") as f:  # closed when the block ends
        f.write(new)
    st = b.stat(path)  # the very next call, no waiting
    assert (st.st_mtime_ns, st.st_ctime_ns) != (st_old.st_mtime_ns, st_old.st_ctime_ns)
    assert b.cat(path) == new
    with b.open(path, "rb") as f:
        assert f.read() == new
    a.unlink(path)
    assert not b.exists(path)
    a.pipe(path, b"back")
    assert b.cat(path) == b"back"


def test_strict_data_cache_answers_only_a_revalidated_version(clients: Any, base: str) -> None:
    a, b, _c = clients
    old, new = versions(CHUNKED)
    path = f"{base}/f"
    a.pipe(path, old)
    assert b.cat(path) == old
    caches = b.client.caches
    hits = caches.revalidated_hits
    assert b.cat(path) == old  # READ names the version B holds: no storage read
    assert caches.revalidated_hits == hits + 1
    a.pipe(path, new)
    assert b.cat(path) == new  # a new version: read from storage
    assert caches.revalidated_hits == hits + 1


@pytest.mark.parametrize("size", [4096, CHUNKED], ids=["inline", "chunked"])
def test_relaxed_stale_until_the_ttl_never_mixed(clients: Any, base: str, size: int) -> None:
    a, _b, c = clients
    old, new = versions(size)
    path = f"{base}/f"
    a.pipe(path, old)
    asked = time.monotonic()
    assert c.cat(path) == old  # C learns the attributes and the bytes
    st_old = c.stat(path)
    a.pipe(path, new)  # A rewrites it and closes
    changed = time.monotonic()
    if changed - asked < TTL_S:  # the limit: within the TTL, C may still see the old version
        assert c.stat(path).st_mtime_ns == st_old.st_mtime_ns
        assert c.cat(path) == old
        with c.open(path, "rb") as f:
            assert f.read() == old

    def seen() -> bool:
        data = c.cat(path)
        assert data in (old, new), "a mix of two versions"
        return data == new

    _, waited = wait_until(TTL_S + SLACK_S + 5, seen)
    assert changed + waited - asked <= TTL_S + SLACK_S  # the guarantee: new within the TTL
    assert c.stat(path).st_mtime_ns != st_old.st_mtime_ns
    with c.open(path, "rb") as f:
        assert f.read() == new


def test_relaxed_negative_entries_and_listings(clients: Any, base: str) -> None:
    a, _b, c = clients
    path = f"{base}/late"
    asked = time.monotonic()
    assert not c.exists(path)
    assert c.listdir(base) == []
    a.pipe(path, b"x")
    if time.monotonic() - asked < TTL_S:
        assert not c.exists(path)  # the limit: ENOENT is remembered for the TTL
        assert c.listdir(base) == []
    _, waited = wait_until(TTL_S + SLACK_S + 5, lambda: c.exists(path))
    assert waited <= TTL_S + SLACK_S
    wait_until(TTL_S + SLACK_S + 5, lambda: c.listdir(base) == ["late"])


def test_relaxed_reads_its_own_changes_at_once(clients: Any, base: str) -> None:
    _a, _b, c = clients
    path = f"{base}/mine"
    assert not c.exists(path)
    c.pipe(path, b"one")
    assert c.cat(path) == b"one" and c.stat(path).st_size == 3
    with c.open(path, "wb") as f:
        f.write(b"three")
    assert c.cat(path) == b"three"
    c.rename(path, f"{base}/moved")
    assert not c.exists(path) and c.cat(f"{base}/moved") == b"three"
    assert c.listdir(base) == ["moved"]
    c.unlink(f"{base}/moved")
    assert not c.exists(f"{base}/moved") and c.listdir(base) == []
    c.makedirs(f"{base}/d/e", exist_ok=True)
    assert c.isdir(f"{base}/d/e")
    c.rmtree(f"{base}/d")
    assert not c.exists(f"{base}/d")


def test_relaxed_hits_stay_on_the_callers_thread(clients: Any, base: str) -> None:
    """A relaxed cache hit crosses to neither meta nor the event loop thread."""
    a, _b, c = clients
    path = f"{base}/f"
    a.pipe(path, b"hello")
    assert c.cat(path) == b"hello" and c.stat(path).st_size == 5
    assert c.info(path)["size"] == 5  # an lstat: cached apart from stat (a link is not its target)
    assert not c.exists(f"{base}/missing")

    def no_loop(coro: Any) -> Any:
        coro.close()
        raise AssertionError("a cache hit went to the event loop thread")

    fast = c._fast
    calls = fast.calls if fast is not None else 0
    c._submit = no_loop
    try:
        assert c.stat(path).st_size == 5 and c.exists(path) and c.isfile(path)
        assert not c.isdir(path) and c.info(path)["size"] == 5
        assert not c.exists(f"{base}/missing")
        assert c.cat(path) == b"hello"
        with c.open(path, "rb") as f:  # a cached whole version, read in memory
            assert f.read(2) == b"he" and f.seek(1) == 1 and f.read() == b"ello"
            assert f.readable() and not f.writable() and f.name == path
            with pytest.raises(OSError):
                f.write(b"x")
        with c.open(path, "r") as t:
            assert t.read() == "hello"
    finally:
        del c._submit
    assert (fast.calls if fast is not None else 0) == calls  # no meta round trip either


def test_prefix_modes_within_one_connection(cluster: LocalCluster, base: str, fs: loomfs.LoomFS) -> None:
    cfg = ClientConfig(consistency="strict", relaxed_prefixes=[f"{base}/data"], attr_cache_ttl_s=60.0)
    c = loomfs.connect(str(cluster.root), config=cfg)
    try:
        fs.makedirs(f"{base}/data", exist_ok=True)
        fs.pipe(f"{base}/data/x", b"1")
        fs.pipe(f"{base}/ctl", b"1")
        assert c.cat(f"{base}/data/x") == b"1" and c.cat(f"{base}/ctl") == b"1"
        fs.pipe(f"{base}/data/x", b"2")
        fs.pipe(f"{base}/ctl", b"2")
        assert c.cat(f"{base}/data/x") == b"1"  # relaxed: within its (long) TTL
        assert c.cat(f"{base}/ctl") == b"2"  # strict: at once
    finally:
        c.close()


def test_disk_cache_survives_a_new_client(cluster: LocalCluster, base: str, fs: loomfs.LoomFS,
                                          tmp_path: Any) -> None:
    data = bytes(range(256)) * (CHUNKED // 256)
    fs.pipe(f"{base}/shard", data)
    cfg = ClientConfig(disk_cache_dir=str(tmp_path), data_cache_bytes_max=0)
    first = loomfs.connect(str(cluster.root), config=cfg)
    try:
        assert first.cat(f"{base}/shard") == data
        disk = first.client.caches.disk
        assert disk is not None and disk.flush(30) and disk.writes == 1
    finally:
        first.close()
    second = loomfs.connect(str(cluster.root), config=cfg)  # a restarted worker
    try:
        assert second.cat(f"{base}/shard") == data  # strict: READ, then the disk copy of that version
        disk = second.client.caches.disk
        assert disk is not None and disk.hits == 1 and second.client.caches.revalidated_hits == 1
        fs.pipe(f"{base}/shard", data[::-1])
        assert second.cat(f"{base}/shard") == data[::-1]  # a new version is not the cached one
    finally:
        second.close()


def test_cache_counters_in_metrics(clients: Any, base: str) -> None:
    import urllib.request

    a, _b, c = clients
    a.pipe(f"{base}/f", b"abc")
    c.stat(f"{base}/f")
    c.stat(f"{base}/f")
    port = c.serve_metrics()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as rsp:
        text = rsp.read().decode()
    assert 'loomfs_client_cache_hits_total{cache="attr"}' in text
    assert 'loomfs_client_cache_bytes{cache="data"}' in text


def test_relaxed_batches_use_the_caches(clients: Any, base: str) -> None:
    a, _b, c = clients
    names = [f"{base}/f{i}" for i in range(5)]
    a.put_many({p: b"old" for p in names})
    asked = time.monotonic()
    assert [s.st_size for s in c.stat_many(names)] == [3] * 5  # learned
    assert [c.cat(p) for p in names] == [b"old"] * 5  # learned with their versions (read_many does not teach data)
    missing = c.stat_many([f"{base}/nope"])
    assert isinstance(missing[0], FileNotFoundError)
    a.put_many({p: b"new!" for p in names})
    if time.monotonic() - asked < TTL_S:  # within the TTL: the old versions, whole
        assert [s.st_size for s in c.stat_many(names)] == [3] * 5
        assert c.read_many(names) == [b"old"] * 5
    wait_until(TTL_S + SLACK_S + 5, lambda: c.read_many(names) == [b"new!"] * 5)
    c.put_many({names[0]: b"mine"})  # own writes: at once
    assert c.read_many(names[:1]) == [b"mine"] and c.stat_many(names[:1])[0].st_size == 4
    c.rm_many(names[:1])
    assert isinstance(c.stat_many(names[:1])[0], FileNotFoundError)
