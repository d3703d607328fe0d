"""``ChunkMap``: an engine's in-memory chunk table, listed in (inode, index) order."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Generic, TypeVar

from loomfs.storage.engine.types import INDEX_END, ChunkKey

V = TypeVar("V")


class ChunkMap(Generic[V]):
    """inode -> index -> value, listed in (inode, index) order without sorting the whole key set
    per page (a target may hold millions of chunks and resync pages through all of them).

    Inodes live in a big sorted list plus a small inbox of new ones: a listing sorts the inbox in
    place (cheap: it is mostly sorted already) and walks both lists at once; the inbox is folded
    into the big list only when it outgrows 1/64 of it, so a new inode costs O(1) amortized and a
    page costs O(page + inbox) whatever the target's size. An inode that empties stays listed
    (skipped, counted as stale) until stale ones are a quarter of all, then both are rebuilt.
    Each inode's indexes are sorted when listed; for inodes with many chunks that order is cached
    until their key set changes.
    """

    _ORDER_CACHE_MIN = 64  # inodes with at least this many chunks keep their sorted indexes
    _INBOX_MIN = 1024  # the inbox is folded in past this + 1/64 of the big list
    _STALE_MIN = 64  # rebuild past this many stale entries (and a quarter of all)

    def __init__(self) -> None:
        self._by_inode: dict[int, dict[int, V]] = {}
        self._inodes: list[int] = []  # sorted; may hold emptied inodes and repeats (stale)
        self._inbox: list[int] = []
        self._stale = 0
        self._order: dict[int, list[int]] = {}
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def get(self, inode: int, index: int) -> V | None:
        d = self._by_inode.get(inode)
        return None if d is None else d.get(index)

    def put(self, inode: int, index: int, value: V) -> None:
        d = self._by_inode.get(inode)
        if d is None:
            d = self._by_inode[inode] = {}
            self._inbox.append(inode)
        if index not in d:
            self._len += 1
            self._order.pop(inode, None)
        d[index] = value

    def pop(self, inode: int, index: int) -> V | None:
        d = self._by_inode.get(inode)
        if d is None or index not in d:
            return None
        value = d.pop(index)
        self._len -= 1
        self._order.pop(inode, None)
        if not d:
            del self._by_inode[inode]
            self._stale += 1
        return value

    def items(self) -> Iterator[tuple[ChunkKey, V]]:
        """Every (key, value), in no particular order."""
        for inode, d in self._by_inode.items():
            for index, value in d.items():
                yield ChunkKey(inode, index), value

    def inode_range(self, inode: int, index_begin: int = 0, index_end: int = INDEX_END) -> list[tuple[int, V]]:
        """(index, value) of ``inode``'s indexes in [index_begin, index_end), in order."""
        return [(k.index, v) for k, v in self._scan_inode(inode, index_begin, index_end)]

    def scan(
        self, after: ChunkKey | None = None, inode: int = 0, index_begin: int = 0, index_end: int = INDEX_END
    ) -> Iterator[tuple[ChunkKey, V]]:
        """(key, value) in (inode, index) order, only keys strictly greater than ``after``;
        ``inode`` != 0 keeps to that inode's [index_begin, index_end). Do not change the map
        while iterating."""
        if inode:
            if after is not None and after.inode >= inode:
                if after.inode > inode:
                    return
                index_begin = max(index_begin, after.index + 1)
            yield from self._scan_inode(inode, index_begin, index_end)
            return
        main, inbox = self._sorted_inodes()
        prev = -1
        if after is not None:
            yield from self._scan_inode(after.inode, after.index + 1, INDEX_END)
            prev = after.inode
        i, j = bisect.bisect_right(main, prev), bisect.bisect_right(inbox, prev)
        while True:  # merge the two sorted lists; repeats (stale entries) are skipped
            if i < len(main) and (j == len(inbox) or main[i] <= inbox[j]):
                ino, i = main[i], i + 1
            elif j < len(inbox):
                ino, j = inbox[j], j + 1
            else:
                return
            if ino != prev:
                prev = ino
                yield from self._scan_inode(ino, 0, INDEX_END)

    def _scan_inode(self, inode: int, lo: int, hi: int) -> Iterator[tuple[ChunkKey, V]]:
        d = self._by_inode.get(inode)
        if not d or lo >= hi:
            return
        if len(d) < self._ORDER_CACHE_MIN:
            order = sorted(d)
        else:
            cached = self._order.get(inode)
            order = self._order[inode] = sorted(d) if cached is None else cached
        for i in range(bisect.bisect_left(order, lo) if lo else 0, len(order)):
            index = order[i]
            if index >= hi:
                return
            yield ChunkKey(inode, index), d[index]

    def _sorted_inodes(self) -> tuple[list[int], list[int]]:
        if self._stale > self._STALE_MIN and 4 * self._stale > len(self._inodes) + len(self._inbox):
            self._inodes, self._stale = sorted(self._by_inode), 0
            self._inbox.clear()
        elif len(self._inbox) > self._INBOX_MIN + len(self._inodes) // 64:
            self._inodes += self._inbox
            self._inbox.clear()
            self._inodes.sort()
        else:
            self._inbox.sort()
        return self._inodes, self._inbox

    def __repr__(self) -> str:
        return f"ChunkMap(chunks={self._len} inodes={len(self._by_inode)} stale={self._stale})"

