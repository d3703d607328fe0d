"""Byte ranges ``(first, last)`` (inclusive) as sorted lists of disjoint ranges: what a lock
owner is known to hold (``loomfs.client.locks``). A flock is the one range ``0..OFFSET_MAX``."""

from __future__ import annotations

from collections.abc import Iterable

Range = tuple[int, int]


def ranges_union(rs: Iterable[Range]) -> list[Range]:
    """The ranges merged: sorted, disjoint, none touching the next."""
    out: list[Range] = []
    for first, last in sorted(rs):
        if out and first <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], last))
        else:
            out.append((first, last))
    return out


def ranges_add(rs: list[Range], r: Range) -> list[Range]:
    return ranges_union([*rs, r])


def ranges_sub(rs: list[Range], r: Range) -> list[Range]:
    """``rs`` less ``r``."""
    out: list[Range] = []
    for first, last in rs:
        if last < r[0] or first > r[1]:
            out.append((first, last))
            continue
        if first < r[0]:
            out.append((first, r[0] - 1))
        if last > r[1]:
            out.append((r[1] + 1, last))
    return out


def ranges_less(rs: list[Range], others: Iterable[Range]) -> list[Range]:
    """``rs`` less every range of ``others``."""
    for o in others:
        rs = ranges_sub(rs, o)
    return rs


def ranges_cut(rs: Iterable[Range], r: Range) -> list[Range]:
    """The parts of ``rs`` inside ``r``."""
    return ranges_union((max(first, r[0]), min(last, r[1])) for first, last in rs if first <= r[1] and r[0] <= last)


def ranges_cover(rs: list[Range], r: Range) -> bool:
    """Whether ``rs`` hold all of ``r``."""
    return not ranges_less([r], rs)


TRange = tuple[int, int, int]  # (first, last, type): a lock of one type (READ/WRITE) over first..last


def typed_join(rs: Iterable[TRange]) -> list[TRange]:
    """Sorted by ``first``; overlapping or touching ranges of one type joined (ranges of
    different types may touch, not overlap)."""
    out: list[TRange] = []
    for first, last, type_ in sorted(rs):
        if out and out[-1][2] == type_ and first <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], last), type_)
        else:
            out.append((first, last, type_))
    return out


def typed_less(rs: list[TRange], r: Range) -> list[TRange]:
    """``rs`` less the bytes of ``r`` (an unlock)."""
    out: list[TRange] = []
    for first, last, type_ in rs:
        if last < r[0] or first > r[1]:
            out.append((first, last, type_))
            continue
        if first < r[0]:
            out.append((first, r[0] - 1, type_))
        if last > r[1]:
            out.append((r[1] + 1, last, type_))
    return out


def typed_set(rs: list[TRange], r: TRange) -> list[TRange]:
    """``rs`` after a lock ``r``: its bytes take its type, as meta does for one owner."""
    return typed_join([*typed_less(rs, (r[0], r[1])), r])


def typed_cut(rs: Iterable[TRange], r: Range) -> list[TRange]:
    """The parts of ``rs`` inside ``r``, with their types."""
    return [(max(first, r[0]), min(last, r[1]), type_) for first, last, type_ in rs if first <= r[1] and r[0] <= last]


def spans(rs: Iterable[TRange]) -> list[Range]:
    """The bytes of ``rs``, whatever their type."""
    return ranges_union((first, last) for first, last, _ in rs)


def undo_plan(untold: list[TRange], touched: list[Range], held: list[TRange],
              ) -> tuple[list[Range], list[TRange], list[Range]]:
    """What undoes the lock attempts no caller heard were granted (``untold``, each with its
    type) once their group is over, given ``touched`` (every range the owner held at some
    moment of the group) and ``held`` (what its callers were told they hold now). Returns
    ``(unlock, restore, left)``: the bytes of ``untold`` outside ``touched`` go; the parts of
    ``held`` that an untold attempt of another type may have converted are set back to
    ``held``'s type; the parts of ``untold`` in ``touched`` but not held now (held meanwhile
    and unlocked since: meta may hold them for nobody) are left in place."""
    reach = ranges_union((first, last) for first, last, _ in untold)
    unlock = ranges_less(reach, touched)
    restore = typed_join(p for first, last, type_ in untold for p in typed_cut(held, (first, last)) if p[2] != type_)
    left = ranges_less([p for r in reach for p in ranges_cut(touched, r)], spans(held))
    return unlock, restore, left
