"""The CRC32C of a concatenation from the CRCs of its parts, without reading the bytes again.

CRC32C is affine over GF(2): ``crc32c(B, v) = L_n(v) ^ crc32c(B, 0)`` where ``L_n`` (the
register pushed through ``n = len(B)`` bytes) depends only on ``n``. So
``crc(A + B) = crc32c(B, crc(A)) = L_n(crc(A)) ^ crc(B)``, and ``L_n`` of a 32-bit value is the
XOR of ``L_n`` of its set bits: 32 numbers per length, found by hashing ``n`` zero bytes 33
times (for 2 MiB, ~66 MiB of CRC32C: worth it only for a length that recurs).

A run read at once (``_reads.plan_reads``: big values filling a whole chunk, or small values
back to back in up to 1 MiB of one) arrives with its CRC checked on the wire; when the values'
own CRCs combine to it, every value is intact and none is hashed again. Combining takes four
lookups per value in byte tables of ``L_n`` (``byte_tables``), ~0.3 us in Python against
~1-2 us to hash a 16 KiB value again (the second pass over a 1 MiB run of 64 of them). Values
of at least ``MIN_LENGTH_BYTES`` (KV blocks of a fixed size) use it: the first time a length is
seen its tables are computed on a background thread (at most ``WARM_LENGTHS_MAX`` lengths per
process, ~40 KB each) and the values are hashed as before; from then on the tables serve.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import crc32c

from loomfs.kvcache._entry import Entry
from loomfs.kvcache._reads import Run

MIN_LENGTH_BYTES = 8 << 10  # smaller values are hashed (as cheap as four table lookups)
WARM_LENGTHS_MAX = 64  # lengths whose tables a process computes, ever (bounded memory and work)
_ZEROS = bytes(1 << 20)
Tables = tuple[list[int], list[int], list[int], list[int]]
_TABLES: dict[int, Tables] = {}
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


def byte_tables(n: int) -> Tables:
    """``L_n`` of every value of each byte of a 32-bit register: ``L_n(v)`` is
    ``t[0][v & 255] ^ t[1][(v >> 8) & 255] ^ t[2][(v >> 16) & 255] ^ t[3][v >> 24]``."""
    bits = shift_table(n)
    out = []
    for k in range(4):
        t = [0] * 256
        for b in range(1, 256):
            low = b & -b
            t[b] = t[b ^ low] ^ bits[8 * k + low.bit_length() - 1]
        out.append(t)
    return out[0], out[1], out[2], out[3]


def _warm(n: int) -> None:
    """Compute the tables of length ``n`` on a background thread (once; bounded)."""
    with _LOCK:
        if n in _TABLES or n in _WARMING or len(_WARMING) >= WARM_LENGTHS_MAX:
            return
        _WARMING.add(n)

    def compute() -> None:
        _TABLES[n] = byte_tables(n)

    threading.Thread(target=compute, name="loomfs-crc-table", daemon=True).start()


def crc_cat(crc_a: int, crc_b: int, len_b: int, tables: Tables | None = None) -> int:
    """CRC32C of ``A + B`` from ``crc(A)``, ``crc(B)`` and ``len(B)`` (``tables``: its
    ``byte_tables``, computed here when not given)."""
    t0, t1, t2, t3 = byte_tables(len_b) if tables is None else tables
    return crc_b ^ t0[crc_a & 255] ^ t1[(crc_a >> 8) & 255] ^ t2[(crc_a >> 16) & 255] ^ t3[crc_a >> 24]


def tiled_crc(r: Run, entries: Sequence[Entry | None]) -> int | None:
    """The CRC32C of the run's range from its values' CRCs, when values of at least
    ``MIN_LENGTH_BYTES`` tile it exactly in the order of ``r.members`` (chunk order, as
    ``plan_reads`` lists them: back to back, no gap, no value twice) and the tables of their
    lengths are ready; None otherwise (the values are hashed one by one)."""
    start = pos = r.start
    crc = 0
    tables: Tables | None = None
    tables_n = -1
    for i in r.members:
        e = entries[i]
        if e is None:
            return None
        n = e.value_bytes
        if n < MIN_LENGTH_BYTES or e.seg_offset % e.chunk_size != pos:
            return None
        if pos == start:
            crc = e.value_crc
        else:
            if n != tables_n:
                tables = _TABLES.get(n)
                if tables is None:
                    _warm(n)
                    return None
                tables_n = n
            assert tables is not None
            t0, t1, t2, t3 = tables
            crc = e.value_crc ^ t0[crc & 255] ^ t1[(crc >> 8) & 255] ^ t2[(crc >> 16) & 255] ^ t3[crc >> 24]
        pos += n
    return crc if pos == r.end and r.members else None
