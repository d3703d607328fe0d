"""The index cache (pure): a read in flight across this process's own put or delete of a key
does not bring back what it read for that key; the per-key marks stay bounded."""

from __future__ import annotations

from loomfs.kvcache._entry import Entry
from loomfs.kvcache._icache import IndexCache


def _e(key: bytes, crc: int = 1) -> Entry:
    return Entry(key=key, touched_s=0.0, value_bytes=4, value_crc=crc, seg_name="s", seg_inode=9, chunk_size=64,
                 chains=(1,))


def test_read_in_flight_across_own_change_is_not_learned() -> None:
    c = IndexCache(60.0, monotonic_s=lambda: 0.0)
    since = c.gen  # a get's read begins
    c.changed(b"k")  # this process deletes k meanwhile
    c.learn(_e(b"k"), since)
    c.learn(_e(b"other"), since)
    assert c.get(b"k") is None and c.get(b"other") is not None
    c.learn(_e(b"k"), c.gen)  # a read begun after the delete
    assert c.get(b"k") is not None


def test_change_marks_are_bounded() -> None:
    c = IndexCache(60.0, entries_max=4, monotonic_s=lambda: 0.0)
    since = c.gen
    for i in range(10):
        c.changed(b"k%d" % i)
    assert len(c._changed_at) <= 4
    c.learn(_e(b"k0"), since)  # its mark was dropped: a read that old learns nothing
    c.learn(_e(b"new"), since)
    assert c.get(b"k0") is None and c.get(b"new") is None
    c.learn(_e(b"new"), c.gen)
    assert c.get(b"new") is not None
