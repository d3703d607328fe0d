"""Read planning: big values that together fill a whole chunk are one whole-chunk read (unless
LOOMFS_KV_WHOLE_RUNS=0: each read in place)."""

from __future__ import annotations

from loomfs.kvcache import _entry as E
from loomfs.kvcache._reads import plan_reads

CS = 4 << 20
HALF = 2 << 20


def seg(off: int, n: int = HALF, inode: int = 5) -> E.Entry:
    return E.Entry(key=b"k", touched_s=0, value_bytes=n, value_crc=0, seg_name="s", seg_inode=inode,
                   seg_offset=off, chunk_size=CS, chains=(1,))


def test_two_halves_of_a_chunk_are_one_whole_chunk_read() -> None:
    entries = [seg(CS + HALF), seg(0), seg(HALF), seg(CS), seg(2 * CS)]  # chunk 2: only one half
    alone, runs = plan_reads(entries, whole_chunk_runs=True)
    assert alone == [4]
    got = sorted((r.seg_inode, r.chunk_index, r.start, r.end, r.members) for r in runs)
    assert got == [(5, 0, 0, CS, [1, 2]), (5, 1, 0, CS, [3, 0])]


def test_big_values_not_filling_their_chunk_are_read_alone() -> None:
    third = CS // 3
    entries = [seg(0, third), seg(third, third),  # a third of the chunk is not asked for
               seg(CS, HALF - (256 << 10)), seg(CS + HALF, HALF),  # a 256 KiB hole: too big a gap
               seg(2 * CS + 10, HALF - 10), seg(2 * CS + HALF, HALF),  # does not start at byte 0
               seg(3 * CS, HALF, inode=6), seg(3 * CS + HALF, HALF, inode=7)]  # other segments
    alone, runs = plan_reads(entries, whole_chunk_runs=True)
    assert alone == list(range(8)) and runs == []


def test_whole_chunk_runs_can_be_turned_off() -> None:
    alone, runs = plan_reads([seg(0), seg(HALF)], whole_chunk_runs=False)
    assert alone == [0, 1] and runs == []  # each big value read in place
    alone, runs = plan_reads([seg(0), seg(HALF)], whole_chunk_runs=True)
    assert alone == [] and [(r.start, r.end) for r in runs] == [(0, CS)]


def test_crc_of_a_concatenation_from_its_parts() -> None:
    import os

    import crc32c

    from loomfs.kvcache._crccat import crc_cat

    for la, lb in [(0, 0), (1, 1), (5, 3), (1000, 70_000), (3, (1 << 20) + 5), (HALF, HALF)]:
        a, b = os.urandom(la), os.urandom(lb)
        assert crc_cat(crc32c.crc32c(a), crc32c.crc32c(b), lb) == crc32c.crc32c(a + b)


def test_tiled_crc_only_for_big_values_back_to_back() -> None:
    import dataclasses
    import os
    import time

    import crc32c

    from loomfs.kvcache import _crccat
    from loomfs.kvcache._reads import Run

    a, b = os.urandom(HALF), os.urandom(HALF)
    ea = dataclasses.replace(seg(0), value_crc=crc32c.crc32c(a))
    eb = dataclasses.replace(seg(HALF), value_crc=crc32c.crc32c(b))
    whole = Run(5, 0, 0, CS, [1, 0])
    _crccat._TABLES.pop(HALF, None)
    _crccat._WARMING.discard(HALF)
    assert _crccat.tiled_crc(whole, [eb, ea]) is None  # the 2 MiB table is being computed
    deadline = time.monotonic() + 30
    while HALF not in _crccat._TABLES:  # a background thread computes it
        assert time.monotonic() < deadline, "the 2 MiB shift table was never computed"
        time.sleep(0.01)
    assert _crccat.tiled_crc(whole, [eb, ea]) == crc32c.crc32c(a + b)
    assert _crccat.tiled_crc(Run(5, 0, 0, CS, [0, 0]), [ea]) is None  # the same value twice
    gap = dataclasses.replace(eb, seg_offset=HALF + 4096, value_bytes=HALF - 4096)
    assert _crccat.tiled_crc(Run(5, 0, 0, CS, [0, 1]), [ea, gap]) is None
    assert _crccat.tiled_crc(Run(5, 0, 0, CS, [0]), [ea]) is None  # does not reach the run's end
    small = [dataclasses.replace(seg(i * 4096, 4096), value_crc=0) for i in range(2)]
    assert _crccat.tiled_crc(Run(5, 0, 0, 8192, [0, 1]), small) is None  # small values: hashed


def test_small_values_of_one_chunk_are_several_runs_read_at_once() -> None:
    """A batch of 256 x 16 KiB values filling a chunk: runs of at most ``span_max_bytes``
    (four 1 MiB reads in flight, not one 4 MiB read), every value in exactly one run."""
    small = 16 << 10
    entries = [seg(i * small, small) for i in range(256)]
    alone, runs = plan_reads(entries, span_max_bytes=1 << 20)
    assert alone == []
    assert sorted((r.start, r.end, len(r.members)) for r in runs) == [
        (i << 20, (i + 1) << 20, 64) for i in range(4)]
    assert sorted(m for r in runs for m in r.members) == list(range(256))
    _, one = plan_reads(entries, span_max_bytes=CS)
    assert [(r.start, r.end, len(r.members)) for r in one] == [(0, CS, 256)]
