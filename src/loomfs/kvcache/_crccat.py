"""The CRC32C of a concatenation from the CRCs of its parts, without reading the bytes again.

CRC32C is affine over GF(2): ``crc32c(B, v) = L_n(v) ^ crc32c(B, 0)`` where ``L_n`` (the
register pushed through ``n = len(B)`` bytes) depends only on ``n``. So
``crc(A + B) = crc32c(B, crc(A)) = L_n(crc(A)) ^ crc(B)``, and ``L_n`` of a 32-bit value is the
XOR of ``L_n`` of its set bits: 32 numbers per length, found by hashing ``n`` zero bytes 33
times (for 2 MiB, ~66 MiB of CRC32C: worth it only for a length that recurs).

A whole-chunk read of several values (``_reads.plan_reads``) arrives with the chunk's CRC
checked on the wire; when the values' own CRCs combine to it, every value is intact and none
is hashed again. Only big values (KV blocks of a fixed size) use it: the first time a length
is seen its table is computed on a background thread (at most ``WARM_LENGTHS_MAX`` lengths per
process) and the values are hashed as before; from then on the table serves.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import crc32c

from loomfs.kvcache._entry import Entry
from loomfs.kvcache._reads import Run

MIN_LENGTH_BYTES = 256 << 10  # smaller values are hashed (cheaper than a table per length)
WARM_LENGTHS_MAX = 64  # lengths whose tables a process computes, ever (bounded memory and work)
_ZEROS = bytes(1 << 20)
_TABLES: dict[int, tuple[int, ...]] = {}
_WARMING: set[int] = set()
_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    global _LOCK
    _LOCK = threading.Lock()  # a parent thread may have held it at the fork
    _WARMING.difference_update(set(_WARMING) - set(_TABLES))  # those threads are not here


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _crc_of_zeros(n: int, value: int) -> int:
    crc, left = value, n
    while left:
        k = min(left, len(_ZEROS))
        crc = crc32c.crc32c(memoryview(_ZEROS)[:k], crc)
        left -= k
    return crc


def shift_table(n: int) -> tuple[int, ...]:
    """``L_n`` of each bit 0..31."""
    base = _crc_of_zeros(n, 0)
    return tuple(_crc_of_zeros(n, 1 << i) ^ base for i in range(32))


def _warm(n: int) -> None:
    """Compute the table of length ``n`` on a background thread (once; bounded)."""
    with _LOCK:
        if n in _TABLES or n in _WARMING or len(_WARMING) >= WARM_LENGTHS_MAX:
            return
        _WARMING.add(n)

    def compute() -> None:
        _TABLES[n] = shift_table(n)

    threading.Thread(target=compute, name="loomfs-crc-table", daemon=True).start()


def crc_cat(crc_a: int, crc_b: int, len_b: int, table: tuple[int, ...] | None = None) -> int:
    """CRC32C of ``A + B`` from ``crc(A)``, ``crc(B)`` and ``len(B)`` (``table``: its
    ``shift_table``, computed here when not given)."""
    if table is None:
        table = shift_table(len_b)
    out = crc_b
    v, i = crc_a, 0
    while v:
        if v & 1:
            out ^= table[i]
        v >>= 1
        i += 1
    return out


def tiled_crc(r: Run, entries: Sequence[Entry | None]) -> int | None:
    """The CRC32C of the run's range from its values' CRCs, when big values tile it exactly
    (back to back, no gap, no value twice) and the tables of their lengths are ready; None
    otherwise (the values are hashed one by one)."""
    spans = sorted((e.seg_offset % e.chunk_size, e.value_bytes, e.value_crc)
                   for i in r.members if (e := entries[i]) is not None)
    pos, crc = r.start, 0
    for start, n, value_crc in spans:
        if start != pos or n < MIN_LENGTH_BYTES:
            return None
        if pos == r.start:
            crc = value_crc
        else:
            table = _TABLES.get(n)
            if table is None:
                _warm(n)
                return None
            crc = crc_cat(crc, value_crc, n, table)
        pos += n
    return crc if pos == r.end and spans else None
