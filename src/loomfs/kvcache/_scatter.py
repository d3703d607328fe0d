"""Runs of big values received straight into their destinations (a scatter receive).

A whole-chunk run (``_reads.whole_chunk_runs``: two 2 MiB values of a 4 MiB chunk, eight of a
16 MiB one) used to be received into a pooled scratch buffer and each value copied out of it:
a memory copy of every byte on the event loop (~0.26 CPU-s/GiB on this VM, 4 GB/s), and the
last run's copy is serial with the batch. ``scatter_plan`` lays the run's byte range out as the
values' own destinations (the caller's ``into=`` buffers, or a fresh ``bytearray`` per value)
with small throwaway buffers for the gaps between them, and the read lands there directly
(``net.scatter.Scatter``). The frame's CRC32C still covers the whole range, checked on arrival;
the values' CRCs must combine to it (``_crccat``), else each value is hashed on its own.

Only runs of big values (more than ``SCATTER_VALUE_MIN_BYTES`` each) are scattered: a run of
small values would be received in pieces of one value per ``recv`` (64 x 16 KiB for a 1 MiB
run), dearer than one copy. Values that overlap (a key asked twice) keep the scratch.
``LOOMFS_KV_SCATTER=0`` turns it off (A/B).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from loomfs.kvcache import _entry as E
from loomfs.kvcache._reads import COALESCE_VALUE_MAX_BYTES, Run
from loomfs.kvcache._values import Target
from loomfs.net.scatter import Scatter

SCATTER_RUNS = os.environ.get("LOOMFS_KV_SCATTER", "1") == "1"
SCATTER_VALUE_MIN_BYTES = COALESCE_VALUE_MAX_BYTES + 1


@dataclass(slots=True)
class ScatterPlan:
    scatter: Scatter
    # (index into the caller's entries, the value's bytes once read, what get hands back)
    values: list[tuple[int, memoryview, Callable[[], Any]]]


def scatter_plan(r: Run, entries: Sequence[E.Entry | None], targets: Sequence[Target | None],
                 rebuild: Callable[[E.Entry, bytearray], Any]) -> ScatterPlan | None:
    """The destinations of run ``r``'s range, in order; None when it is not a run of big,
    non-overlapping values. Raises ``InvalidArgument`` when a caller's buffer is too small."""
    parts: list[memoryview] = []
    values: list[tuple[int, memoryview, Callable[[], Any]]] = []
    at = r.start
    for i in r.members:  # in chunk order (``plan_reads``)
        e = entries[i]
        if e is None or e.value_bytes < SCATTER_VALUE_MIN_BYTES:
            return None
        off = e.seg_offset % e.chunk_size
        if off < at:
            return None  # overlaps the one before
        if off > at:
            parts.append(memoryview(bytearray(off - at)))  # a gap: read and thrown away
        t = targets[i]
        if t is not None:
            view = t.fit(e.value_bytes)
            values.append((i, view, _target_result(t, e.value_bytes)))
        else:
            buf = bytearray(e.value_bytes)
            view = memoryview(buf)
            values.append((i, view, _fresh_result(e, buf, rebuild)))
        parts.append(view)
        at = off + e.value_bytes
    if at > r.end:
        return None
    if at < r.end:
        parts.append(memoryview(bytearray(r.end - at)))
    return ScatterPlan(Scatter(parts), values)


def _target_result(t: Target, nbytes: int) -> Callable[[], Any]:
    return lambda: t.result(nbytes)


def _fresh_result(e: E.Entry, buf: bytearray, rebuild: Callable[[E.Entry, bytearray], Any]) -> Callable[[], Any]:
    return lambda: buf if e.kind == E.KIND_BYTES else rebuild(e, buf)
