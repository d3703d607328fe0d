"""Client caches in memory: attributes and directory entries with a TTL, file data by version.

``AttrCache``: path -> attributes, or a *negative* entry (the path did not exist), each with
its own deadline; ``ListingCache``: directory path -> its entries. Both are LRU-bounded by
entry count. ``DataCache``: file bytes keyed by ``DataKey`` — the inode, size, mtime and
ctime that make the bytes valid, so a rewritten file (a new mtime/ctime/size) can never be
answered with its old bytes by a caller that knows its new attributes, and a caller holding
old attributes gets the old bytes whole, never a mix. It is LRU-bounded by bytes and entries.

Which entries are used and for how long is decided by the consistency mode
(``loomfs.client.consistency``); these classes only store, expire, bound and count. Every
method takes a lock (held only for dict operations), because the blocking facade reads the
caches from caller threads while the event loop thread fills them.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from typing import Generic, NamedTuple, TypeVar

from loomfs.common.clock import SYSTEM_CLOCK, Clock
from loomfs.wire.types import Attr, DirEntry, FileType

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Absent:
    """A negative entry: the path did not exist when it was looked up."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = Absent()


TOMBSTONES_MAX = 4096  # forgotten paths remembered at once (see ``_TTLMap``)

Stamp = tuple[float, int]  # (when the answer was asked for, a sequence number for ties)


class _TTLMap(ABC, Generic[K, V]):
    """key -> (deadline, stamp, value), LRU-bounded by ``entries_max``; expired entries are
    dropped when met (and pushed out by the bound).

    Forgetting is by *tombstone*: ``_forget(path, tree)`` drops the path's entries and leaves
    a stamp on the path (``tree``: on the whole subtree below it too, which costs O(1), not a
    walk of the cache). An entry whose answer was *asked for* before a tombstone on its path
    or above it is dead when met, even if it was stored after: an answer that was in flight
    while this client changed the path never revives what the change made stale. A
    tombstone lives as long as the longest TTL any entry was stored with (by then everything
    it covers has expired); at most ``TOMBSTONES_MAX`` live at once: past that the oldest
    single-path one is dropped, and if the oldest is a subtree's the cache is cleared."""

    def __init__(self, entries_max: int, clock: Clock):
        if entries_max < 0:
            raise ValueError("entries_max must be >= 0")
        self.entries_max = entries_max
        self.clock = clock
        self._lock = threading.Lock()
        self._map: OrderedDict[K, tuple[float, Stamp, V]] = OrderedDict()
        self._seq = 0
        self._tombs: OrderedDict[str, tuple[Stamp, float, bool]] = OrderedDict()  # stamp, kept until, tree
        self._ttl_max_s = 0.0
        self.hits = 0
        self.misses = 0
        self.expirations = 0
        self.evictions = 0
        self.invalidations = 0

    def __len__(self) -> int:
        return len(self._map)

    @staticmethod
    @abstractmethod
    def _path_of(key: K) -> str: ...

    @staticmethod
    @abstractmethod
    def _keys_of(path: str) -> tuple[K, ...]: ...

    def _buried(self, path: str, stamp: Stamp) -> bool:
        """A tombstone newer than ``stamp`` lies on ``path``, or on a subtree above it."""
        tombs = self._tombs
        t = tombs.get(path)
        if t is not None and stamp < t[0]:
            return True
        p = path
        while p != "/":
            p = p.rpartition("/")[0] or "/"
            t = tombs.get(p)
            if t is not None and t[2] and stamp < t[0]:
                return True
        return False

    def _get(self, key: K) -> tuple[bool, V | None]:
        """(found, value); counts nothing (callers count what the lookup meant)."""
        now = self.clock.monotonic()
        with self._lock:
            item = self._map.get(key)
            if item is None:
                return False, None
            if item[0] <= now:
                del self._map[key]
                self.expirations += 1
                return False, None
            if self._tombs and self._buried(self._path_of(key), item[1]):
                del self._map[key]
                self.invalidations += 1
                return False, None
            self._map.move_to_end(key)
            return True, item[2]

    def _put(self, key: K, value: V, ttl_s: float, since: float | None = None) -> None:
        """``since``: when the answer was asked for (the TTL counts from then, so an answer
        that was in flight while the path changed expires within the TTL of the change);
        default now."""
        if ttl_s <= 0 or self.entries_max == 0:
            return
        now = self.clock.monotonic()
        asked = now if since is None else since
        deadline = asked + ttl_s
        if deadline <= now:
            return
        with self._lock:
            self._seq += 1
            if ttl_s > self._ttl_max_s:
                self._ttl_max_s = ttl_s
            self._map[key] = (deadline, (asked, self._seq), value)
            self._map.move_to_end(key)
            while len(self._map) > self.entries_max:
                self._map.popitem(last=False)
                self.evictions += 1

    @property
    def ever_stored(self) -> bool:
        """Whether an entry was ever stored (never, in a client whose paths are all strict:
        then an invalidation has nothing to drop and leaves no tombstone)."""
        return self._ttl_max_s > 0.0

    def _forget(self, path: str, tree: bool) -> int:
        """Drop ``path``'s entries (``tree``: and everything below it, lazily); returns how
        many entries were dropped now."""
        if tree and path == "/":
            n = len(self._map)
            self.clear()
            return n
        n = 0
        with self._lock:
            for k in self._keys_of(path):
                if self._map.pop(k, None) is not None:
                    n += 1
            self.invalidations += n
            if not self._ttl_max_s:  # nothing was ever stored (e.g. every path is strict)
                return n
            now = self.clock.monotonic()  # (not before: a strict client's every change comes here)
            tombs = self._tombs
            while tombs:  # tombstones that outlived everything they covered
                first = next(iter(tombs.values()))
                if first[1] > now:
                    break
                tombs.popitem(last=False)
            self._seq += 1
            old = tombs.pop(path, None)
            tombs[path] = ((now, self._seq), now + self._ttl_max_s, tree or (old is not None and old[2]))
            while len(tombs) > TOMBSTONES_MAX:
                _p, (_stamp, _until, was_tree) = tombs.popitem(last=False)
                if was_tree:  # entries below it may still be alive: forget everything
                    self.invalidations += len(self._map)
                    self._map.clear()
                    tombs.clear()
        return n

    def clear(self) -> None:
        with self._lock:
            self.invalidations += len(self._map)
            self._map.clear()
            self._tombs.clear()


class AttrCache(_TTLMap[tuple[str, bool], Attr | Absent]):
    """Attributes by (normalised path, follow_symlinks), and negative entries.

    An ``lstat`` answer that is not a symlink also answers ``stat`` of the same path (the
    last component is not a link to follow); a negative ``lstat`` answer also answers
    ``stat``. The reverse does not hold, so it is not used.
    """

    def __init__(self, entries_max: int = 65536, *, clock: Clock = SYSTEM_CLOCK):
        super().__init__(entries_max, clock)
        self.negative_hits = 0

    @staticmethod
    def _path_of(key: tuple[str, bool]) -> str:
        return key[0]

    @staticmethod
    def _keys_of(path: str) -> tuple[tuple[str, bool], ...]:
        return ((path, False), (path, True))

    def lookup(self, path: str, follow_symlinks: bool) -> Attr | Absent | None:
        """The cached answer (``ABSENT`` for a negative entry), or None (not cached/expired)."""
        found, value = self._get((path, follow_symlinks))
        if not found and follow_symlinks:
            found, value = self._get((path, False))
            if found and isinstance(value, Attr) and value.type == FileType.SYMLINK:
                found, value = False, None
        with self._lock:  # counters are shared by the caller threads and the loop thread
            if not found or value is None:
                self.misses += 1
                return None
            if isinstance(value, Absent):
                self.negative_hits += 1
            else:
                self.hits += 1
        return value

    def put(self, path: str, follow_symlinks: bool, attr: Attr, ttl_s: float,
            since: float | None = None) -> None:
        self._put((path, follow_symlinks), attr, ttl_s, since)

    def put_absent(self, path: str, follow_symlinks: bool, ttl_s: float, since: float | None = None) -> None:
        self._put((path, follow_symlinks), ABSENT, ttl_s, since)

    def invalidate(self, path: str) -> int:
        """Forget ``path`` (both variants); returns how many entries were dropped."""
        return self._forget(path, False)

    def invalidate_tree(self, top: str) -> None:
        """Forget ``top`` and every path below it (a renamed or removed directory); O(1)."""
        self._forget(top, True)

    def invalidate_inode(self, inode: int) -> int:
        """Forget every path whose cached attributes name ``inode`` (hard links, and paths
        through symlinks, that the caller cannot name)."""
        if not self._map:
            return 0
        with self._lock:
            dead = {k[0] for k, (_, _, v) in self._map.items() if isinstance(v, Attr) and v.inode == inode}
        return sum(self._forget(p, False) for p in dead)

    def __repr__(self) -> str:
        return (f"AttrCache({len(self)}/{self.entries_max} hits={self.hits} "
                f"negative_hits={self.negative_hits} misses={self.misses} evictions={self.evictions})")


class Listing(NamedTuple):
    entries: tuple[DirEntry, ...]
    with_attrs: bool


class ListingCache(_TTLMap[str, Listing]):
    """A directory's entries by its normalised path (a listing with attributes also answers
    one without)."""

    def __init__(self, entries_max: int = 1024, *, clock: Clock = SYSTEM_CLOCK):
        super().__init__(entries_max, clock)

    @staticmethod
    def _path_of(key: str) -> str:
        return key

    @staticmethod
    def _keys_of(path: str) -> tuple[str, ...]:
        return (path,)

    def lookup(self, path: str, with_attrs: bool) -> list[DirEntry] | None:
        found, value = self._get(path)
        with self._lock:
            if not found or value is None or (with_attrs and not value.with_attrs):
                self.misses += 1
                return None
            self.hits += 1
        return list(value.entries)

    def put(self, path: str, entries: Iterable[DirEntry], with_attrs: bool, ttl_s: float,
            since: float | None = None) -> None:
        self._put(path, Listing(tuple(entries), with_attrs), ttl_s, since)

    def invalidate(self, path: str) -> int:
        return self._forget(path, False)

    def invalidate_tree(self, top: str) -> None:
        self._forget(top, True)

    def __repr__(self) -> str:
        return (f"ListingCache({len(self)}/{self.entries_max} hits={self.hits} "
                f"misses={self.misses} evictions={self.evictions})")


# ---- data ----------------------------------------------------------------------------------

class DataKey(NamedTuple):
    """What makes cached bytes valid: the inode and its size, mtime and ctime (meta sets a new
    ctime on every change, so even a ``utime`` back to an old mtime gives a new key).
    ``block``: which piece of the file (0 for whole small files)."""

    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int
    block: int = 0

    @classmethod
    def of(cls, attr: Attr, block: int = 0) -> DataKey:
        return cls(attr.inode, attr.size, attr.mtime_ns, attr.ctime_ns, block)


class DataCache:
    """File bytes by ``DataKey``, LRU-bounded by total bytes and entry count.

    Values are immutable ``bytes`` handed out without a copy. An entry larger than
    ``entry_bytes_max`` (or than the whole budget) is not stored.
    """

    def __init__(self, bytes_max: int = 64 << 20, entries_max: int = 16384, *,
                 entry_bytes_max: int = 4 << 20):
        if bytes_max < 0 or entries_max < 0 or entry_bytes_max < 0:
            raise ValueError("cache bounds must be >= 0")
        self.bytes_max = bytes_max
        self.entries_max = entries_max
        self.entry_bytes_max = min(entry_bytes_max, bytes_max)
        self._lock = threading.Lock()
        self._map: OrderedDict[DataKey, bytes] = OrderedDict()
        self._by_inode: dict[int, set[DataKey]] = {}
        self.bytes = 0  # held now
        self.hits = 0
        self.misses = 0
        self.hit_bytes = 0
        self.inserts = 0
        self.insert_bytes = 0
        self.evictions = 0
        self.evicted_bytes = 0
        self.rejected = 0  # too large to hold
        self.invalidations = 0

    def __len__(self) -> int:
        return len(self._map)

    def __contains__(self, key: DataKey) -> bool:
        return key in self._map

    def get(self, key: DataKey) -> bytes | None:
        with self._lock:
            data = self._map.get(key)
            if data is None:
                self.misses += 1
                return None
            self._map.move_to_end(key)
            self.hits += 1
            self.hit_bytes += len(data)
            return data

    def put(self, key: DataKey, data: bytes) -> bool:
        """Hold ``data`` under ``key``; False if it is too large to hold."""
        n = len(data)
        if n > self.entry_bytes_max or self.entries_max == 0:
            self.rejected += 1
            return False
        with self._lock:
            old = self._map.pop(key, None)
            if old is not None:
                self.bytes -= len(old)
            self._map[key] = data
            self._by_inode.setdefault(key.inode, set()).add(key)
            self.bytes += n
            self.inserts += 1
            self.insert_bytes += n
            while self.bytes > self.bytes_max or len(self._map) > self.entries_max:
                k, v = self._map.popitem(last=False)
                self._unindex(k)
                self.bytes -= len(v)
                self.evictions += 1
                self.evicted_bytes += len(v)
        return True

    def _unindex(self, key: DataKey) -> None:
        keys = self._by_inode.get(key.inode)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_inode[key.inode]

    def discard_inode(self, inode: int) -> int:
        """Drop every version of ``inode`` (its data changed here: the old versions are dead)."""
        with self._lock:
            keys = self._by_inode.pop(inode, set())
            for k in keys:
                v = self._map.pop(k, None)
                if v is not None:
                    self.bytes -= len(v)
            self.invalidations += len(keys)
            return len(keys)

    def clear(self) -> None:
        with self._lock:
            self.invalidations += len(self._map)
            self._map.clear()
            self._by_inode.clear()
            self.bytes = 0

    def __repr__(self) -> str:
        return (f"DataCache({len(self)}/{self.entries_max} entries {self.bytes}/{self.bytes_max} bytes "
                f"hits={self.hits} misses={self.misses} evictions={self.evictions})")
