"""What a client knows of one lock owner's locks on one file (inode, kind, owner): the record
``loomfs.client.locks.LockClient`` keeps to undo the grants no caller saw."""

from __future__ import annotations

import asyncio

from loomfs.client.lock_ranges import (
    Range,
    TRange,
    ranges_add,
    ranges_sub,
    ranges_union,
    spans,
    typed_cut,
    typed_less,
    typed_set,
)

UNLOCK = 0


class OwnerRecord:
    """``held``: the ranges the owner's callers were told they hold, each with its type
    (granted, and no unlock of them asked since). ``stray``: bytes meta may hold for the owner
    that no caller was told of (an undo that left a part in place or failed, an unlock with no
    answer): the key stays in ``LockClient._held`` (a release at close, renewals) while there
    is any. The attempts in flight (``inflight``) form a group from the first that starts to
    the last answered: ``touched`` is every range held at some moment of the group (held when
    it began, or granted to a caller since), ``untold`` the ranges and types of attempts whose
    callers were never told "granted" (undone once the group is over: ``undo_plan``),
    ``drained`` the undo's wait for that."""

    def __init__(self) -> None:
        self.held: list[TRange] = []
        self.stray: list[Range] = []
        self.inflight = 0
        self.touched: list[Range] = []
        self.untold: list[TRange] = []
        self.drained: asyncio.Future[tuple[list[Range], list[TRange]]] | None = None

    def __repr__(self) -> str:
        return f"OwnerRecord(held={self.held} stray={self.stray} inflight={self.inflight})"

    def begin(self) -> None:
        if self.inflight == 0:
            self.touched = spans(self.held)
            self.untold = []
        self.inflight += 1

    def answered(self, type_: int, rng: Range, *, granted: bool, unknown: bool, told: bool) -> bool:
        """One attempt's answer came (``unknown``: none came, meta may have acted on it): the
        record follows it. True when meta may hold a grant no caller saw (an undo is due)."""
        self.inflight -= 1
        if type_ == UNLOCK:
            if granted:
                self.stray = ranges_sub(self.stray, rng)
            elif unknown:  # it may not have reached meta
                self.stray = ranges_union([*self.stray, *spans(typed_cut(self.held, rng))])
            if granted or unknown:  # asked to unlock: whether or not it did, nobody holds it
                self.held = typed_less(self.held, rng)
            return False
        if granted and told:
            self.held = typed_set(self.held, (rng[0], rng[1], type_))
            self.touched = ranges_add(self.touched, rng)
            self.stray = ranges_sub(self.stray, rng)  # meta's rows there are this lock now
            return False
        if granted or unknown:
            self.untold.append((rng[0], rng[1], type_))
            return True
        return False

    def holds(self, r: TRange) -> bool:
        """Whether the callers were told they hold all of ``r`` with its type."""
        return spans(p for p in typed_cut(self.held, (r[0], r[1])) if p[2] == r[2]) == [(r[0], r[1])]

    def forget(self) -> None:
        """Meta holds nothing of the owner on the file now (released, or its lease lapsed)."""
        self.held = []
        self.stray = []

    def idle(self) -> bool:
        """Nothing held, nothing stray, nothing in flight or to undo: the record can go."""
        return self.inflight == 0 and self.drained is None and not self.held and not self.stray
