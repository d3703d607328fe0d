"""The mount's read-hold bookkeeping (loomfs.mount.holds; no I/O)."""

from __future__ import annotations

from loomfs.mount.holds import Holds, new_hold_id


def test_hold_ids_are_client_range_and_distinct() -> None:
    ids = {new_hold_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(1 << 62 <= i < 1 << 63 for i in ids)  # meta's own session ids are below 1 << 62


def test_holds_are_kept_until_popped() -> None:
    h = Holds()
    h.add(5, 100)
    h.add(3, 101)
    assert len(h) == 2 and h.ids() == [3, 5] and h.items() == [(3, 101), (5, 100)]
    assert h.pop(5) == 100 and h.pop(5) is None
    assert h.ids() == [3] and "held=1 taken_total=2" in repr(h)
