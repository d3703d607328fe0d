"""This process's cache of index entries: a get of a recently seen key skips meta.

An entry is reused for ``ttl_s`` (monotonic time) after meta answered it or this process
wrote it; puts, touches, deletes, evictions and compaction moves made here update it at
once. What other processes did shows after at most ``ttl_s``: until then a get may return
the value this process last saw for a key (complete and CRC-checked: never torn or foreign
bytes; bytes no longer matching the entry make the get ask meta again). Entries carrying
their value inline are not kept (the value's bytes would fill the cache). Bounded by
``entries_max`` (oldest out first).

A get that read an entry from meta learns it only if this process did not put or delete the
key while the read was in flight (``gen`` when the read began, ``changed`` after each put or
delete): a reply answered before this process's own write but handled after it would
otherwise bring the old entry back for ``ttl_s``. The per-key marks are bounded by
``entries_max`` too: once the oldest mark is dropped, a read begun before it learns nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from loomfs.kvcache._entry import Entry


class IndexCache:
    def __init__(self, ttl_s: float, entries_max: int = 1 << 18,
                 monotonic_s: Callable[[], float] = time.monotonic):
        self.ttl_s = ttl_s
        self.entries_max = entries_max
        self._mono = monotonic_s
        self._items: dict[bytes, tuple[Entry, float]] = {}
        self.hits = 0
        self.gen = 0  # bumped by each ``changed``
        self._changed_at: dict[bytes, int] = {}  # key -> ``gen`` of its last put or delete here
        self._dropped_gen = 0  # the newest mark dropped from ``_changed_at`` (bounded)

    def get(self, key: bytes) -> Entry | None:
        if self.ttl_s <= 0:
            return None
        item = self._items.get(key)
        if item is None:
            return None
        if self._mono() - item[1] >= self.ttl_s:
            del self._items[key]
            return None
        self.hits += 1
        return item[0]

    def learn(self, e: Entry, since: int | None = None) -> None:
        """Keep ``e``; with ``since`` (``gen`` when the read of ``e`` began), only if this
        process did not put or delete the key since then."""
        if self.ttl_s <= 0:
            return
        if since is not None and (self._changed_at.get(e.key, 0) > since or self._dropped_gen > since):
            return
        if e.inline is not None:
            self._items.pop(e.key, None)
            return
        self._items.pop(e.key, None)  # re-inserted at the end: the oldest go first
        if len(self._items) >= self.entries_max:
            del self._items[next(iter(self._items))]
        self._items[e.key] = (e, self._mono())

    def forget(self, key: bytes) -> None:
        self._items.pop(key, None)

    def changed(self, key: bytes) -> None:
        """This process put or deleted ``key`` (called once the write was answered)."""
        if self.ttl_s <= 0:
            return
        self.gen += 1
        self._changed_at.pop(key, None)
        if len(self._changed_at) >= self.entries_max:
            oldest = next(iter(self._changed_at))
            self._dropped_gen = self._changed_at.pop(oldest)
        self._changed_at[key] = self.gen

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"IndexCache(ttl_s={self.ttl_s} entries={len(self._items)} hits={self.hits})"
