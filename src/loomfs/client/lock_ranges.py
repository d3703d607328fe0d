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
