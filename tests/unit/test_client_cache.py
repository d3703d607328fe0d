"""Client caches in memory and the consistency policy (no sockets, virtual time)."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any, TypeVar

import pytest
from test_client_support import FakeMeta, FakeStorage

from loomfs.client.cache import ABSENT, AttrCache, DataCache, DataKey, ListingCache
from loomfs.client.consistency import ClientCaches, ConsistencyPolicy, Mode
from loomfs.client.core import AsyncClient
from loomfs.client.diskcache import DiskCache
from loomfs.common.clock import ManualClock
from loomfs.config import ClientConfig
from loomfs.net.buffers import BufferPool
from loomfs.wire import meta as wm
from loomfs.wire.types import Attr, DirEntry, FileType

T = TypeVar("T")


def attr(inode: int = 7, size: int = 3, mtime_ns: int = 100, ctime_ns: int = 100,
         type: int = FileType.FILE) -> Attr:
    return Attr(inode=inode, size=size, mtime_ns=mtime_ns, ctime_ns=ctime_ns, type=type)


# --- AttrCache --------------------------------------------------------------------------

def test_attr_cache_ttl_and_counters() -> None:
    clock = ManualClock()
    c = AttrCache(clock=clock)
    assert c.lookup("/a", True) is None
    c.put("/a", True, attr(), ttl_s=2.0)
    assert c.lookup("/a", True) == attr()
    clock.advance(1.999)
    assert c.lookup("/a", True) == attr()
    clock.advance(0.001)
    assert c.lookup("/a", True) is None  # expired exactly at the deadline
    assert (c.hits, c.misses, c.expirations) == (2, 2, 1)
    assert len(c) == 0
    assert "hits=2" in repr(c)


def test_attr_cache_ttl_counts_from_the_question() -> None:
    """An answer that was in flight while the path changed lives at most the TTL past the
    moment it was asked for, not past its arrival."""
    clock = ManualClock()
    c = AttrCache(clock=clock)
    asked = clock.monotonic()
    clock.advance(0.5)  # the reply took this long
    c.put("/a", True, attr(), ttl_s=2.0, since=asked)
    clock.advance(1.499)
    assert c.lookup("/a", True) is not None
    clock.advance(0.001)
    assert c.lookup("/a", True) is None
    c.put("/b", True, attr(), ttl_s=1.0, since=asked)  # already older than its TTL
    assert len(c) == 0


def test_attr_cache_zero_ttl_stores_nothing() -> None:
    c = AttrCache(clock=ManualClock())
    c.put("/a", True, attr(), ttl_s=0)
    c.put_absent("/b", True, ttl_s=0)
    assert len(c) == 0


def test_attr_cache_negative_entries() -> None:
    clock = ManualClock()
    c = AttrCache(clock=clock)
    c.put_absent("/gone", False, ttl_s=1.0)
    assert c.lookup("/gone", False) is ABSENT
    assert c.lookup("/gone", True) is ABSENT  # lstat ENOENT => stat ENOENT
    assert c.negative_hits == 2 and c.hits == 0
    clock.advance(1.0)
    assert c.lookup("/gone", False) is None


def test_attr_cache_lstat_answers_stat_unless_symlink() -> None:
    c = AttrCache(clock=ManualClock())
    c.put("/f", False, attr(), ttl_s=5)
    assert c.lookup("/f", True) == attr()
    c.put("/l", False, attr(inode=9, type=FileType.SYMLINK), ttl_s=5)
    assert c.lookup("/l", True) is None  # the link's target is another file
    c.put("/s", True, attr(inode=10), ttl_s=5)
    assert c.lookup("/s", False) is None  # stat says nothing about the link itself


def test_attr_cache_bounded_lru() -> None:
    c = AttrCache(entries_max=3, clock=ManualClock())
    for i in range(3):
        c.put(f"/{i}", True, attr(inode=i), ttl_s=5)
    assert c.lookup("/0", True) is not None  # /0 is now the most recent
    c.put("/3", True, attr(inode=3), ttl_s=5)
    assert len(c) == 3 and c.evictions == 1
    assert c.lookup("/1", True) is None  # the least recently used went
    assert c.lookup("/0", True) is not None


def test_attr_cache_invalidation() -> None:
    c = AttrCache(clock=ManualClock())
    for p in ("/d", "/d/x", "/d/x/y", "/dx", "/e"):
        c.put(p, True, attr(), ttl_s=5)
        c.put(p, False, attr(), ttl_s=5)
    assert c.invalidate("/e") == 2
    c.invalidate_tree("/d")
    for p in ("/d", "/d/x", "/d/x/y"):
        assert c.lookup(p, True) is None and c.lookup(p, False) is None
    assert c.lookup("/dx", True) is not None  # a sibling with the same prefix stays
    assert c.invalidations == 8
    c.put("/d/x", True, attr(inode=5), ttl_s=5)  # stored after the subtree was forgotten
    assert c.lookup("/d/x", True) == attr(inode=5)
    c.put("/h1", True, attr(inode=42), ttl_s=5)
    c.put("/h2", False, attr(inode=42), ttl_s=5)
    assert c.invalidate_inode(42) == 2
    c.invalidate_tree("/")
    assert len(c) == 0


def test_an_answer_in_flight_across_an_own_change_is_not_kept() -> None:
    """stat asked, then this client changes the path (or its directory), then the old answer
    arrives: it must not be served as if it were newer than the change."""
    clock = ManualClock()
    c = AttrCache(clock=clock)
    c.put("/seed", True, attr(), ttl_s=5.0)
    asked = clock.monotonic()
    clock.advance(0.1)
    c.invalidate("/f")  # e.g. this client's write of /f closed
    c.invalidate_tree("/d")  # and it renamed /d away
    clock.advance(0.1)
    c.put("/f", True, attr(), ttl_s=5.0, since=asked)
    c.put("/d/x", True, attr(), ttl_s=5.0, since=asked)
    assert c.lookup("/f", True) is None and c.lookup("/d/x", True) is None
    c.put("/f", True, attr(inode=2), ttl_s=5.0)  # asked after the change: kept
    assert c.lookup("/f", True) == attr(inode=2)


def test_strict_only_use_leaves_no_tombstones() -> None:
    c = AttrCache(clock=ManualClock())
    for i in range(10000):
        c.invalidate(f"/f{i}")
        c.invalidate_tree(f"/d{i}")
    assert len(c._tombs) == 0


def test_subtree_tombstones_are_bounded_in_time_and_number() -> None:
    clock = ManualClock()
    c = AttrCache(clock=clock)
    c.put("/a/b", True, attr(), ttl_s=2.0)
    c.put_absent("/a/c", True, ttl_s=5.0)  # the longest TTL decides how long a tombstone lives
    c.invalidate_tree("/a")
    assert len(c._tombs) == 1
    clock.advance(5.0)
    c.put("/x/y", True, attr(), ttl_s=5.0)
    c.invalidate_tree("/x")  # meanwhile the first tombstone outlived everything it covered
    assert list(c._tombs) == ["/x"]
    for i in range(5000):  # past the bound: everything is forgotten instead
        c.put(f"/t{i}/f", True, attr(), ttl_s=5.0)
        c.invalidate_tree(f"/t{i}")
    c.put("/keep", True, attr(), ttl_s=5.0)
    assert len(c._tombs) <= 4096 and c.lookup("/keep", True) is not None
    assert c.lookup("/t4999/f", True) is None


def test_attr_cache_threads_count_every_lookup() -> None:
    c = AttrCache(entries_max=50, clock=ManualClock())

    def work(t: int) -> None:
        for i in range(3000):
            p = f"/d/{(t + i) % 80}"
            if c.lookup(p, True) is None:
                c.put(p, True, attr(inode=i), ttl_s=10)
            if i % 97 == 0:
                c.invalidate_tree("/d")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert c.hits + c.misses == 8 * 3000 and len(c) <= 50


# --- ListingCache -------------------------------------------------------------------------

def test_listing_cache() -> None:
    clock = ManualClock()
    c = ListingCache(clock=clock)
    entries = [DirEntry(name="a", inode=2), DirEntry(name="b", inode=3)]
    c.put("/d", entries, with_attrs=False, ttl_s=1.0)
    assert c.lookup("/d", False) == entries
    assert c.lookup("/d", True) is None  # wants attributes it does not have
    c.put("/d", entries, with_attrs=True, ttl_s=1.0)
    assert c.lookup("/d", False) == entries
    got = c.lookup("/d", True)
    assert got == entries
    got.clear()  # a copy: the cached listing is not changed by its user
    assert c.lookup("/d", True) == entries
    clock.advance(1.0)
    assert c.lookup("/d", False) is None
    c.put("/d/e", entries, False, 5)
    c.put("/d", entries, False, 5)
    c.put("/f", entries, False, 5)
    c.invalidate_tree("/d")
    assert c.lookup("/d/e", False) is None and c.lookup("/d", False) is None
    assert c.lookup("/f", False) == entries


# --- DataCache ------------------------------------------------------------------------------

def test_data_key_names_the_version() -> None:
    a = attr()
    assert DataKey.of(a) == DataKey(7, 3, 100, 100, 0)
    assert DataKey.of(a) != DataKey.of(attr(mtime_ns=101))
    assert DataKey.of(a) != DataKey.of(attr(size=4))
    assert DataKey.of(a) != DataKey.of(attr(ctime_ns=101))  # e.g. a utime back to the old mtime
    assert DataKey.of(a) != DataKey.of(a, block=1)


def test_data_cache_bounded_by_bytes() -> None:
    c = DataCache(bytes_max=10, entries_max=100, entry_bytes_max=10)
    for i in range(3):
        assert c.put(DataKey(i, 4, 0, 0), b"%04d" % i)
    assert c.bytes == 8 and len(c) == 2 and c.evictions == 1 and c.evicted_bytes == 4
    assert c.get(DataKey(0, 4, 0, 0)) is None
    assert c.get(DataKey(2, 4, 0, 0)) == b"0002"
    assert (c.hits, c.misses, c.hit_bytes) == (1, 1, 4)
    assert not c.put(DataKey(9, 11, 0, 0), b"x" * 11)  # larger than an entry may be
    assert c.rejected == 1 and c.bytes == 8


def test_data_cache_bounded_by_entries_lru() -> None:
    c = DataCache(bytes_max=1000, entries_max=2)
    k = [DataKey(i, 1, 0, 0) for i in range(3)]
    c.put(k[0], b"a")
    c.put(k[1], b"b")
    c.get(k[0])
    c.put(k[2], b"c")
    assert k[1] not in c and k[0] in c and k[2] in c
    c.put(k[2], b"C")  # replacing keeps the byte count right
    assert c.bytes == 2 and c.get(k[2]) == b"C"


def test_data_cache_discard_inode() -> None:
    c = DataCache()
    c.put(DataKey(5, 1, 1, 1), b"a")
    c.put(DataKey(5, 2, 2, 2), b"bb")
    c.put(DataKey(6, 1, 1, 1), b"c")
    assert c.discard_inode(5) == 2
    assert c.bytes == 1 and len(c) == 1 and c.invalidations == 2
    assert c.discard_inode(5) == 0
    c.clear()
    assert c.bytes == 0 and len(c) == 0


def test_data_cache_threads() -> None:
    """Many threads putting and getting keep the byte count exact and the bound held."""
    c = DataCache(bytes_max=4096, entries_max=64, entry_bytes_max=256)

    def work(t: int) -> None:
        for i in range(2000):
            k = DataKey((t * 7 + i) % 97, 100, 0, 0)
            if c.get(k) is None:
                c.put(k, bytes([t]) * 100)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert c.bytes == 100 * len(c) <= 4096
    assert c.hits + c.misses == 8 * 2000


# --- ConsistencyPolicy ----------------------------------------------------------------------

def test_policy_longest_prefix_wins() -> None:
    p = ConsistencyPolicy.of("strict", relaxed=["/data", "/ckpt/frozen"], strict=["/data/live"])
    assert p.mode_for("/") is Mode.STRICT
    assert p.mode_for("/data") is Mode.RELAXED
    assert p.mode_for("/data/train/x.jpg") is Mode.RELAXED
    assert p.mode_for("/data/live") is Mode.STRICT
    assert p.mode_for("/data/live/now") is Mode.STRICT
    assert p.mode_for("/data/lively") is Mode.RELAXED  # component boundaries, not string prefixes
    assert p.mode_for("/database") is Mode.STRICT
    assert p.mode_for("/ckpt/frozen/a") is Mode.RELAXED
    assert p.mode_for("/ckpt/step10") is Mode.STRICT
    assert p.any_relaxed
    assert "/data=relaxed" in repr(p)


def test_policy_default_relaxed_and_root_prefix() -> None:
    p = ConsistencyPolicy("relaxed", {"/ckpt/": "strict"})  # prefixes are normalised
    assert p.mode_for("/x") is Mode.RELAXED and p.mode_for("/ckpt/a") is Mode.STRICT
    q = ConsistencyPolicy("strict", {"/": "relaxed"})
    assert q.mode_for("/any/thing") is Mode.RELAXED
    assert not ConsistencyPolicy().any_relaxed


def test_policy_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="unknown consistency mode"):
        ConsistencyPolicy("eventual")
    with pytest.raises(ValueError, match="both strict and relaxed"):
        ConsistencyPolicy.of(relaxed=["/a"], strict=["/a/"])
    assert Mode.parse(" Relaxed ") is Mode.RELAXED


# --- ClientCaches: what each mode answers ----------------------------------------------------

def caches(clock: ManualClock, **kw: object) -> ClientCaches:
    policy = ConsistencyPolicy.of("strict", relaxed=["/data"])
    return ClientCaches(policy, attr_ttl_s=2.0, clock=clock, data=DataCache(), **kw)  # type: ignore[arg-type]


def test_strict_paths_never_answer_from_the_attr_cache() -> None:
    cc = caches(ManualClock())
    cc.learn_attr("/ckpt/a", True, attr())
    cc.learn_absent("/ckpt/b")
    cc.learn_listing("/ckpt", [DirEntry(name="a")], False)
    assert cc.attr("/ckpt/a") is None and cc.attr("/ckpt/b") is None
    assert cc.listing("/ckpt") is None
    assert len(cc.attrs) == 0 and len(cc.listings) == 0  # nothing stored either


def test_relaxed_paths_answer_until_the_ttl() -> None:
    clock = ManualClock()
    cc = caches(clock, negative_ttl_s=0.5)
    cc.learn_attr("/data/a", True, attr())
    cc.learn_absent("/data/missing")
    assert cc.attr("/data/a") == attr()
    assert cc.attr("/data/missing") is ABSENT
    clock.advance(0.5)
    assert cc.attr("/data/missing") is None  # negative entries have their own TTL
    assert cc.attr("/data/a") == attr()
    clock.advance(1.5)
    assert cc.attr("/data/a") is None


def test_listing_with_attrs_fills_the_attr_cache() -> None:
    cc = caches(ManualClock())
    entries = [DirEntry(name="x", inode=3, attr=attr(inode=3)), DirEntry(name="y", inode=4)]
    cc.learn_listing("/data/d", entries, with_attrs=True)
    assert cc.listing("/data/d", with_attrs=True) == entries
    assert cc.attr("/data/d/x", follow_symlinks=False) == attr(inode=3)
    assert cc.attr("/data/d/x") == attr(inode=3)  # not a symlink: answers stat too
    assert cc.attr("/data/d/y") is None


def test_data_is_served_only_for_the_version_it_belongs_to() -> None:
    cc = caches(ManualClock())
    v1 = attr(size=3, mtime_ns=1, ctime_ns=1)
    v2 = attr(size=3, mtime_ns=2, ctime_ns=2)
    cc.learn_data(v1, b"old")
    assert cc.data_for(v1) == b"old"
    assert cc.data_for(v2) is None  # a rewrite of the same size: not the old bytes
    cc.learn_data(v2, b"new")
    assert cc.data_for(v1) == b"old" and cc.data_for(v2, revalidated=True) == b"new"
    assert cc.revalidated_hits == 1
    cc.learn_data(attr(size=5), b"abc")  # length does not match: never stored
    assert cc.data_for(attr(size=5)) is None
    cc.learn_data(attr(type=FileType.DIRECTORY), b"abc")
    assert cc.data_for(attr(type=FileType.DIRECTORY)) is None


def test_own_changes_invalidate() -> None:
    cc = caches(ManualClock())
    for p in ("/data/d", "/data/d/f", "/data/d/sub/g", "/data/e"):
        cc.learn_attr(p, True, attr())
    cc.learn_listing("/data/d", [DirEntry(name="f")], False)
    cc.learn_listing("/data", [DirEntry(name="d")], False)
    cc.learn_data(attr(inode=7), b"abc")
    cc.changed("/data/d/f", inode=7)
    assert cc.attr("/data/d/f") is None
    assert cc.listing("/data/d") is None  # its entry in the parent
    assert cc.data_for(attr(inode=7)) is None
    assert cc.attr("/data/d/sub/g") is not None
    cc.renamed("/data/d", "/data/e")
    assert cc.attr("/data/d/sub/g") is None and cc.attr("/data/e") is None
    assert cc.listing("/data") is None
    cc.learn_absent("/data/n")
    cc.learn_absent("/data/n/m")
    cc.created("/data/n/m/k", parents=True)
    assert cc.attr("/data/n") is None and cc.attr("/data/n/m") is None


def test_disk_layer_under_memory(tmp_path: object) -> None:
    clock = ManualClock()
    disk = DiskCache(str(tmp_path), 1 << 20, background_evict=False)
    cc = caches(clock, disk=disk)
    a = attr(size=5)
    assert cc.wants_data(5) and not cc.wants_data(1 << 30)
    cc.learn_data(a, b"hello")
    assert disk.flush(10) and disk.writes == 1  # written by the disk cache's writer thread
    assert cc.data is not None
    cc.data.clear()
    assert cc.data_for(a) == b"hello"  # from disk, promoted to memory
    assert disk.hits == 1 and DataKey.of(a) in cc.data
    assert cc.data_for(a) == b"hello" and disk.hits == 1
    assert "ClientCaches(" in repr(cc)


def test_no_data_caches() -> None:
    cc = ClientCaches(ConsistencyPolicy("relaxed"))
    cc.learn_data(attr(), b"abc")
    assert cc.data_for(attr()) is None and not cc.caches_data and not cc.wants_data(1)


# --- the async core with its caches (in-memory fakes of meta and storage) -----------------------

class VersionedMeta(FakeMeta):
    """FakeMeta that counts the calls the caches should save and, like meta, gives a file a
    new mtime and ctime whenever a writer reports a length or attributes change."""

    def __init__(self) -> None:
        super().__init__(storage=FakeStorage())
        self.calls: Counter[str] = Counter()
        self.tick = 1_000

    def _bump(self, path: str) -> None:
        self.tick += 1
        self.nodes[path] = replace(self.nodes[path], mtime_ns=self.tick, ctime_ns=self.tick)

    async def stat(self, path: str, follow_symlinks: bool = True) -> Attr:
        self.calls["stat"] += 1
        return await super().stat(path, follow_symlinks)

    async def read(self, path: str, follow_symlinks: bool = True) -> wm.ReadRsp:
        self.calls["read"] += 1
        return await super().read(path, follow_symlinks)

    async def open(self, path: str, flags: int, mode: int, client_id: int, session_id: int = 0, *,
                   data: bytes | None = None, chunked: bool = False) -> wm.OpenRsp:
        self.calls["open"] += 1
        return await super().open(path, flags, mode, client_id, session_id, data=data, chunked=chunked)

    async def readdir(self, path: str, after: str, limit: int, with_attrs: bool,
                      dir_inode: int = 0) -> wm.ReaddirRsp:
        self.calls["readdir"] += 1
        return await super().readdir(path, after, limit, with_attrs, dir_inode)

    async def close(self, inode: int, session_id: int, length: int, mtime_ns: int = 0, *,
                    trunc_epoch: int = 0) -> Attr | None:
        await super().close(inode, session_id, length, mtime_ns, trunc_epoch=trunc_epoch)
        path = self._by_inode(inode)
        if length >= 0:
            self._bump(path)
        return self.nodes[path]

    async def setattr(self, req: wm.SetattrReq) -> wm.SetattrRsp:
        await super().setattr(req)
        self._bump(req.path)
        return wm.SetattrRsp(attr=self.nodes[req.path])


def two_clients(**config: object) -> tuple[AsyncClient, AsyncClient, VersionedMeta, ManualClock]:
    """Client A (strict, the writer) and client B (configured by ``config``) over one
    namespace; B's caches run on a manual clock."""
    meta = VersionedMeta()
    assert meta.storage is not None
    config.setdefault("inline_put_max_bytes", 0)
    clock = ManualClock()
    cfg_b = ClientConfig(**config)  # type: ignore[arg-type]
    cfg_a = ClientConfig(inline_put_max_bytes=0)
    a = AsyncClient(meta, meta.storage, config=cfg_a, client_id=1, pool=BufferPool())
    b = AsyncClient(meta, meta.storage, config=cfg_b, client_id=2, pool=BufferPool(),
                    caches=ClientCaches.from_config(cfg_b, clock=clock))
    return a, b, meta, clock


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_strict_asks_meta_every_time_and_sees_the_closed_write() -> None:
    async def main() -> None:
        a, b, meta, _clock = two_clients()
        await a.pipe("/f", b"one")
        assert (await b.stat("/f")).size == 3
        assert (await b.stat("/f")).size == 3
        assert meta.calls["stat"] == 2
        assert await b.cat("/f") == b"one"
        await a.pipe("/f", b"two!")  # closed: B's next call sees it
        assert (await b.stat("/f")).size == 4
        assert await b.cat("/f") == b"two!"
        await a.unlink("/f")
        assert not await b.exists("/f")
        assert len(b.caches.attrs) == 0

    run(main())


def test_strict_data_cache_serves_only_revalidated_versions() -> None:
    async def main() -> None:
        a, b, meta, _clock = two_clients()
        assert meta.storage is not None
        await a.pipe("/f", b"x" * 2500)  # three chunks of the fake's 1000
        assert await b.cat("/f") == b"x" * 2500
        reads = len(meta.storage.reads)
        assert await b.cat("/f") == b"x" * 2500  # READ says the same version: no storage read
        assert len(meta.storage.reads) == reads and meta.calls["read"] == 2
        assert b.caches.revalidated_hits == 1
        f = await b.open("/f")  # a read-only open: the same
        assert await f.read() == b"x" * 2500 and len(meta.storage.reads) == reads
        await f.close()
        await a.pipe("/f", b"y" * 2500)  # same size, new version
        assert await b.cat("/f") == b"y" * 2500
        assert len(meta.storage.reads) > reads

    run(main())


def test_relaxed_reuses_answers_until_the_ttl() -> None:
    async def main() -> None:
        a, b, meta, clock = two_clients(consistency="relaxed", attr_cache_ttl_s=5.0)
        await a.pipe("/f", b"old")
        assert (await b.info("/f"))["size"] == 3  # an lstat of a file answers stat too
        assert (await b.stat("/f")).size == 3
        assert await b.exists("/f") and await b.isfile("/f") and not await b.isdir("/f")
        assert meta.calls["stat"] == 1
        with pytest.raises(FileNotFoundError):
            await b.stat("/missing")
        assert not await b.exists("/missing")
        assert meta.calls["stat"] == 2  # the negative answer was reused
        await a.pipe("/missing", b"now here")
        assert not await b.exists("/missing")  # the limit: another client's create, within the TTL
        clock.advance(5.0)
        assert await b.exists("/missing")

    run(main())


def test_relaxed_reads_one_whole_version() -> None:
    async def main() -> None:
        a, b, meta, clock = two_clients(consistency="relaxed", attr_cache_ttl_s=5.0)
        await a.pipe("/f", b"A" * 2500)
        assert await b.cat("/f") == b"A" * 2500
        reads = meta.calls["read"]
        await a.pipe("/f", b"B" * 2500)  # another client rewrites it, same size
        calls = sum(meta.calls.values())
        for _ in range(3):  # within the TTL: the old version, whole, no round trip at all
            assert await b.cat("/f") == b"A" * 2500
            f = await b.open("/f", "rb")
            assert await f.read() == b"A" * 2500
            await f.close()
        assert sum(meta.calls.values()) == calls
        clock.advance(5.0)
        assert await b.cat("/f") == b"B" * 2500  # after it: the new version
        assert meta.calls["read"] == reads + 1

    run(main())


def test_relaxed_data_miss_never_mixes_cached_attrs_with_new_bytes() -> None:
    async def main() -> None:
        a, b, meta, clock = two_clients(consistency="relaxed", attr_cache_ttl_s=5.0,
                                        data_cache_bytes_max=0)
        await a.pipe("/f", b"A" * 2500)
        assert (await b.stat("/f")).size == 2500  # attributes cached, no data cache
        await a.pipe("/f", b"B" * 1500)
        assert (await b.stat("/f")).size == 2500  # stale attributes, as allowed
        assert await b.cat("/f") == b"B" * 1500  # but bytes come with the version meta names
        f = await b.open("/f")
        assert f.length == 1500 and await f.read() == b"B" * 1500
        await f.close()

    run(main())


def test_relaxed_sees_its_own_changes_at_once() -> None:
    async def main() -> None:
        _a, b, meta, _clock = two_clients(consistency="relaxed", attr_cache_ttl_s=60.0)
        assert not await b.exists("/d")
        await b.mkdir("/d")
        assert await b.isdir("/d")
        assert await b.listdir("/d") == []
        await b.pipe("/d/f", b"one")
        assert await b.listdir("/d") == ["f"]
        assert await b.cat("/d/f") == b"one"
        await b.pipe("/d/f", b"three")
        assert (await b.stat("/d/f")).size == 5 and await b.cat("/d/f") == b"three"
        f = await b.open("/d/f", "ab")
        await f.write(b"!")
        await f.close()
        assert await b.cat("/d/f") == b"three!"
        await b.truncate("/d/f", 2)
        assert await b.cat("/d/f") == b"th"
        await b.chmod("/d/f", 0o600)
        assert (await b.stat("/d/f")).mode == 0o600
        await b.rename("/d/f", "/d/g")  # (the fake renames no subtrees)
        assert not await b.exists("/d/f") and await b.cat("/d/g") == b"th"
        assert await b.listdir("/d") == ["g"]
        await b.unlink("/d/g")
        assert not await b.exists("/d/g") and await b.ls("/d") == []
        await b.rmdir("/d")
        assert not await b.exists("/d")
        assert meta.calls["readdir"] >= 3

    run(main())


def test_relaxed_listings_are_cached() -> None:
    async def main() -> None:
        a, b, meta, clock = two_clients(consistency="relaxed", attr_cache_ttl_s=5.0)
        await a.mkdir("/d")
        for name in "abc":
            await a.pipe(f"/d/{name}", name.encode())
        assert await b.listdir("/d") == ["a", "b", "c"]
        n = meta.calls["readdir"]
        assert await b.listdir("/d") == ["a", "b", "c"]
        infos = await b.ls("/d", detail=True)  # needs attributes: listed again, with them
        assert [i["size"] for i in infos] == [1, 1, 1]
        stats = meta.calls["stat"]
        assert (await b.stat("/d/b")).size == 1  # learned from the listing
        assert meta.calls["stat"] == stats
        assert meta.calls["readdir"] > n
        n = meta.calls["readdir"]
        await a.pipe("/d/z", b"z")
        assert await b.listdir("/d") == ["a", "b", "c"]  # within the TTL
        assert meta.calls["readdir"] == n
        clock.advance(5.0)
        assert await b.listdir("/d") == ["a", "b", "c", "z"]

    run(main())


def test_prefix_modes_in_one_client() -> None:
    async def main() -> None:
        a, b, meta, _clock = two_clients(relaxed_prefixes=["/data"], strict_prefixes=["/data/live"],
                                         attr_cache_ttl_s=5.0)
        await a.mkdir("/data")
        await a.mkdir("/data/live")
        for p in ("/data/x", "/data/live/y", "/z"):
            await a.pipe(p, b"1")
            await b.stat(p)
            n = meta.calls["stat"]
            await b.stat(p)
            assert meta.calls["stat"] == (n if p == "/data/x" else n + 1), p

    run(main())


def test_own_write_reopened_before_close_is_seen_after_it() -> None:
    """A stat while this client's write is open learns the attributes of then; the close
    drops them, so the next stat sees the new length (relaxed, own writes)."""
    async def main() -> None:
        _a, b, _meta, _clock = two_clients(consistency="relaxed", attr_cache_ttl_s=60.0)
        f = await b.open("/f", "wb")
        await f.write(b"12345")
        assert (await b.stat("/f")).size == 0  # not closed yet: meta has the old length
        await f.close()
        assert (await b.stat("/f")).size == 5

    run(main())


def test_metrics_export_the_cache_counters(tmp_path: Any) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from loomfs.metrics import ClientCollector

    async def main() -> str:
        a, b, _meta, _clock = two_clients(consistency="relaxed", disk_cache_dir=str(tmp_path))
        await a.pipe("/f", b"abc")
        await b.stat("/f")
        await b.stat("/f")
        assert await b.cat("/f") == b"abc"
        reg = CollectorRegistry()
        reg.register(ClientCollector(b, BufferPool()))
        return generate_latest(reg).decode()

    text = run(main())
    assert 'loomfs_client_cache_hits_total{cache="attr"} 2.0' in text
    assert 'loomfs_client_cache_misses_total{cache="attr"} 1.0' in text
    assert 'loomfs_client_cache_entries{cache="data"} 1.0' in text
    assert 'loomfs_client_cache_bytes{cache="data"} 3.0' in text
    assert 'loomfs_client_cache_hits_total{cache="disk"}' in text
    assert "loomfs_client_disk_cache_corrupt_total 0.0" in text
