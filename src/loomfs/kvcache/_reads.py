"""Coalesced value reads (pure planning): small values that sit close together in one chunk
of one segment (a batch put lays them out back to back) are read with one chunk read.

``plan_reads`` groups the entries of a ``get_many`` into runs: each run is one chunk range
``[start, end)`` of one segment and the entries inside it. A value bigger than
``coalesce_value_max_bytes``, or alone in its range, is a run of its own (read straight into
the caller's buffer); a run of several is read into one scratch buffer and sliced.

Big values that together fill a whole chunk (two 2 MiB values of a 4 MiB chunk) are one run
too (``whole_chunk_runs``): storage serves a whole chunk with its stored CRC, without checking
block CRCs and hashing the reply as it must for a part of a chunk, and it is one request
instead of several; the values' CRCs combined must equal the chunk CRC checked on arrival, and
the run is received straight into the values' buffers (``_scatter.py``), not copied out of a
scratch.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from loomfs.kvcache._entry import Entry

COALESCE_VALUE_MAX_BYTES = 256 << 10
COALESCE_GAP_MAX_BYTES = 64 << 10  # bytes of other values read and thrown away to join two reads
# a run of small values spans at most this much: a batch of 256 x 16 KiB (one whole 4 MiB chunk)
# is several reads in flight at once (replicas and disk queues in parallel) instead of one
RUN_SPAN_MAX_BYTES = int(os.environ.get("LOOMFS_KV_RUN_SPAN", 1 << 20))
# big values filling a chunk: one whole-chunk read, copied out ("1", the default), or each read
# in place straight into its caller's buffer ("0"; storage joins the stored block CRCs of an
# aligned part and serves it from its page cache once hot). Measured on hot 2 MiB gets (CPU-s
# per GiB, client + storage, 3 pairs): whole 1.14-1.17, in place 1.32-1.44: a request costs more
# than the copy it saves (docs/kvcache.md). LOOMFS_KV_WHOLE_RUNS for A/B
WHOLE_CHUNK_RUNS = os.environ.get("LOOMFS_KV_WHOLE_RUNS", "1") == "1"


@dataclass
class Run:
    seg_inode: int
    chunk_index: int
    start: int  # offset in the chunk
    end: int
    members: list[int] = field(default_factory=list)  # indexes into the caller's entries


def plan_reads(entries: Sequence[Entry | None], *, value_max_bytes: int = COALESCE_VALUE_MAX_BYTES,
               gap_max_bytes: int = COALESCE_GAP_MAX_BYTES, span_max_bytes: int | None = None,
               whole_chunk_runs: bool | None = None) -> tuple[list[int], list[Run]]:
    """(indexes read alone, runs of two or more) for the segment entries among ``entries``
    (None and inline entries are left out)."""
    whole = WHOLE_CHUNK_RUNS if whole_chunk_runs is None else whole_chunk_runs
    span_max = RUN_SPAN_MAX_BYTES if span_max_bytes is None else span_max_bytes
    alone: list[int] = []
    by_chunk: dict[tuple[int, int], list[int]] = defaultdict(list)
    big_by_chunk: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, e in enumerate(entries):
        if e is None or e.inline is not None:
            continue
        index, off = divmod(e.seg_offset, e.chunk_size)
        if e.value_bytes == 0 or off + e.value_bytes > e.chunk_size:
            alone.append(i)
        elif e.value_bytes > value_max_bytes:
            (big_by_chunk[(e.seg_inode, index)] if whole else alone).append(i)
        else:
            by_chunk[(e.seg_inode, index)].append(i)
    runs: list[Run] = []
    for (inode, index), members in big_by_chunk.items():
        run = _whole_chunk_run(entries, inode, index, members, gap_max_bytes)
        if run is None:
            alone += members
        else:
            runs.append(run)
    for (inode, index), members in by_chunk.items():
        members.sort(key=lambda i: entries[i].seg_offset % entries[i].chunk_size)  # type: ignore[union-attr]
        cur: Run | None = None
        for i in members:
            e = entries[i]
            assert e is not None
            off = e.seg_offset % e.chunk_size
            if cur is not None and off - cur.end <= gap_max_bytes and off + e.value_bytes - cur.start <= span_max:
                cur.end = max(cur.end, off + e.value_bytes)
                cur.members.append(i)
                continue
            if cur is not None:
                runs.append(cur)
            cur = Run(inode, index, off, off + e.value_bytes, [i])
        if cur is not None:
            runs.append(cur)
    alone += [r.members[0] for r in runs if len(r.members) == 1]
    return sorted(alone), [r for r in runs if len(r.members) > 1]


def _whole_chunk_run(entries: Sequence[Entry | None], inode: int, index: int, members: list[int],
                     gap_max_bytes: int) -> Run | None:
    """One run of ``members`` (big values of one chunk) when together they fill the chunk from
    its first byte to its last (gaps of at most ``gap_max_bytes`` read and thrown away)."""
    if len(members) < 2:
        return None
    spans = sorted((e.seg_offset % e.chunk_size, e.seg_offset % e.chunk_size + e.value_bytes, i)
                   for i in members if (e := entries[i]) is not None)
    first = entries[members[0]]
    assert first is not None
    end = 0
    for start, stop, _ in spans:
        if start - end > gap_max_bytes:
            return None
        end = max(end, stop)
    if spans[0][0] != 0 or end != first.chunk_size:
        return None
    return Run(inode, index, 0, end, [i for _, _, i in spans])
