"""This process's cache of index entries: a get of a recently seen key skips meta.

An entry is reused for ``ttl_s`` (monotonic time) after meta answered it or this process
wrote it; puts, touches, deletes, evictions and compaction moves made here update it at
once. What other processes did shows after at most ``ttl_s``: until then a get may return
the value this process last saw for a key (complete and CRC-checked: never torn or foreign
bytes; bytes no longer matching the entry make the get ask meta again). Entries carrying
their value inline are not kept (the value's bytes would fill the cache). Bounded by
``entries_max`` (oldest out first).
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

    def learn(self, e: Entry) -> None:
        if self.ttl_s <= 0:
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

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"IndexCache(ttl_s={self.ttl_s} entries={len(self._items)} hits={self.hits})"
