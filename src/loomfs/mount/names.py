"""``AbsentNames`` (no I/O): names this mount knows are absent, so the kernel's LOOKUP of them
(before every create of a new name) is answered without a meta round trip.

What the mount knows, per directory inode, each for ``ttl_s`` from when it *asked* meta:

- a **full listing**: the names of a directory it made itself (``mkdir``: empty) or listed to
  the end in one ``opendir`` (every ``readdir`` page from offset 0); a name not in it is absent.
  A listing that answered at least ``RELIST_MIN_ANSWERS`` LOOKUPs and holds at most
  ``RELIST_MAX_NAMES`` names is worth keeping fresh: once expired, the next LOOKUP in the
  directory lists it again (one READDIR of names, no attributes) before it answers
  (``wants_relist``), so a loop creating files in one directory pays one READDIR per TTL
  instead of one STAT per file;
- single **misses**: meta answered "no such name" to a LOOKUP.

Every change of names through this mount keeps it right: a name about to be made here is
added before meta is asked (``adding``), also to every listing of the directory in flight
(``begin_listing``: a listing read before the change committed must still hold the name); a
name removed here leaves the listing once meta did it (``removed``). A miss is recorded only
when no name changed through this mount while meta answered (``epoch``).

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
RELIST_MIN_ANSWERS = 8  # an expired listing that answered this many LOOKUPs is read again
RELIST_MAX_NAMES = 8192  # ... when it holds no more names than this (one READDIR page)


@dataclass(eq=False, slots=True)
class _Listing:
    names: set[str]
    asked: float  # monotonic time meta was asked (the TTL counts from it)
    answers: int = 0  # LOOKUPs it answered


@dataclass(eq=False)
class AbsentNames:
    ttl_s: float
    epoch: int = 0  # grows at every change of names through this mount
    _listings: OrderedDict[int, _Listing] = field(default_factory=OrderedDict, repr=False)
    _misses: OrderedDict[tuple[int, str], float] = field(default_factory=OrderedDict, repr=False)
    # directory inode -> names added through the mount while a listing of it is read (one set each)
    _inflight: dict[int, list[set[str]]] = field(default_factory=dict, repr=False)
    _expired: dict[int, int] = field(default_factory=dict, repr=False)  # directory -> names, worth a relist

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
                if name in listing.names:
                    return False
                listing.answers += 1
                return True
            del self._listings[dir_inode]
            if listing.answers >= RELIST_MIN_ANSWERS and len(listing.names) <= RELIST_MAX_NAMES:
                self._expired[dir_inode] = len(listing.names)
                if len(self._expired) > MAX_DIRS:
                    del self._expired[next(iter(self._expired))]
        return False

    def wants_relist(self, dir_inode: int, now: float | None = None) -> bool:
        """Whether a LOOKUP in ``dir_inode`` should list it again first (its listing expired
        after answering LOOKUPs; once: the next listing earns the next relist)."""
        if not self.enabled:
            return False
        listing = self._listings.get(dir_inode)
        if listing is not None:
            now = time.monotonic() if now is None else now
            if now - listing.asked < self.ttl_s:
                return False
            self.absent(dir_inode, "", now)  # drops it (and notes whether it earned a relist)
        return self._expired.pop(dir_inode, None) is not None

    def missed(self, dir_inode: int, name: str, asked: float, epoch: int) -> None:
        """Meta answered "no such name" to a question asked at ``asked`` (monotonic) when
        ``epoch`` was current."""
        if not self.enabled or epoch != self.epoch:
            return
        self._misses[(dir_inode, name)] = asked
        self._misses.move_to_end((dir_inode, name))
        while len(self._misses) > MAX_MISSES:
            self._misses.popitem(last=False)

    def begin_listing(self, dir_inode: int) -> set[str]:
        """A listing of ``dir_inode`` starts: the token to pass to ``listed`` or ``abandon``
        (it collects the names added through the mount meanwhile)."""
        token: set[str] = set()
        self._inflight.setdefault(dir_inode, []).append(token)
        return token

    def abandon(self, dir_inode: int, token: set[str]) -> None:
        waiting = self._inflight.get(dir_inode, [])
        if any(t is token for t in waiting):
            waiting[:] = [t for t in waiting if t is not token]
            if not waiting:
                del self._inflight[dir_inode]

    def listed(self, dir_inode: int, names: Iterable[str], asked: float, token: set[str]) -> None:
        """Every name of ``dir_inode`` as meta listed them, asked from ``asked`` on (``token``
        from ``begin_listing`` at that time; a new directory's own: ``set()``)."""
        self.abandon(dir_inode, token)
        if not self.enabled:
            return
        kept = set(names) | token
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
        for token in self._inflight.get(dir_inode, ()):
            token.add(name)
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
        self._expired.pop(dir_inode, None)
