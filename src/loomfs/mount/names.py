"""``AbsentNames`` (no I/O): names this mount knows are absent, so the kernel's LOOKUP of them
(before every create of a new name) is answered without a meta round trip.

What the mount knows, per directory inode, each for ``ttl_s`` from when it *asked* meta:

- a **full listing**: the names of a directory it made itself (``mkdir``: empty) or listed to
  the end in one ``opendir`` (every ``readdir`` page from offset 0); a name not in it is absent;
- single **misses**: meta answered "no such name" to a LOOKUP.

Every change of names through this mount keeps it right: a name about to be made here is
added before meta is asked (``adding``), a name removed here leaves the listing once meta did
it (``removed``). A miss or listing is recorded only when no name changed through this mount
while meta answered (``epoch``): an answer from before such a change must not outlive it.

What it may hide: a name made by *another* client (or mount) up to ``ttl_s`` after this mount
learned it was absent, as the kernel's own negative dentries (``negative_timeout``) would. The
kernel's positive entries (``entry_timeout``) already let a name removed elsewhere live on for
as long. A create here is never hidden: ``O_EXCL`` and the open-if-exists fallback are meta's
answers at CREATE.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

MAX_DIRS = 1024  # directories with a listing kept
MAX_LISTING_NAMES = 100_000  # a bigger directory keeps no listing (memory)
MAX_MISSES = 4096  # single misses kept


@dataclass(eq=False, slots=True)
class _Listing:
    names: set[str]
    asked: float  # monotonic time meta was asked (the TTL counts from it)


@dataclass(eq=False)
class AbsentNames:
    ttl_s: float
    epoch: int = 0  # grows at every change of names through this mount
    _listings: OrderedDict[int, _Listing] = field(default_factory=OrderedDict, repr=False)
    _misses: OrderedDict[tuple[int, str], float] = field(default_factory=OrderedDict, repr=False)

    def __repr__(self) -> str:
        return f"AbsentNames(ttl={self.ttl_s}, listings={len(self._listings)}, misses={len(self._misses)})"

    @property
    def enabled(self) -> bool:
        return self.ttl_s > 0

    def absent(self, dir_inode: int, name: str, now: float | None = None) -> bool:
        """Whether ``name`` in ``dir_inode`` is known absent (within the TTL)."""
        if not self.enabled:
            return False
        now = time.monotonic() if now is None else now
        missed = self._misses.get((dir_inode, name))
        if missed is not None:
            if now - missed < self.ttl_s:
                return True
            del self._misses[(dir_inode, name)]
        listing = self._listings.get(dir_inode)
        if listing is not None:
            if now - listing.asked < self.ttl_s:
                return name not in listing.names
            del self._listings[dir_inode]
        return False

    def missed(self, dir_inode: int, name: str, asked: float, epoch: int) -> None:
        """Meta answered "no such name" to a question asked at ``asked`` (monotonic) when
        ``epoch`` was current."""
        if not self.enabled or epoch != self.epoch:
            return
        self._misses[(dir_inode, name)] = asked
        self._misses.move_to_end((dir_inode, name))
        while len(self._misses) > MAX_MISSES:
            self._misses.popitem(last=False)

    def listed(self, dir_inode: int, names: Iterable[str], asked: float, epoch: int) -> None:
        """Every name of ``dir_inode`` as meta listed them, asked from ``asked`` on."""
        if not self.enabled or epoch != self.epoch:
            return
        kept = set(names)
        if len(kept) > MAX_LISTING_NAMES:
            return
        self._listings[dir_inode] = _Listing(kept, asked)
        self._listings.move_to_end(dir_inode)
        while len(self._listings) > MAX_DIRS:
            self._listings.popitem(last=False)

    def adding(self, dir_inode: int, name: str) -> None:
        """``name`` may appear in ``dir_inode`` through this mount (called before meta is asked:
        from now on a LOOKUP of it goes to meta, whatever the change's outcome)."""
        self.epoch += 1
        self._misses.pop((dir_inode, name), None)
        listing = self._listings.get(dir_inode)
        if listing is not None:
            if len(listing.names) >= MAX_LISTING_NAMES:
                del self._listings[dir_inode]
            else:
                listing.names.add(name)

    def removed(self, dir_inode: int, name: str) -> None:
        """``name`` went from ``dir_inode`` through this mount (meta did it)."""
        self.epoch += 1
        listing = self._listings.get(dir_inode)
        if listing is not None:
            listing.names.discard(name)

    def forget(self, dir_inode: int) -> None:
        """The kernel forgot ``dir_inode``: its listing goes (its misses age out)."""
        self._listings.pop(dir_inode, None)
