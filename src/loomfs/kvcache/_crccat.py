"""The CRC32C of a concatenation from the CRCs of its parts, without reading the bytes again.

CRC32C is affine over GF(2): ``crc32c(B, v) = L_n(v) ^ crc32c(B, 0)`` where ``L_n`` (the
register pushed through ``n = len(B)`` bytes) depends only on ``n``. So
``crc(A + B) = crc32c(B, crc(A)) = L_n(crc(A)) ^ crc(B)``, and ``L_n`` of a 32-bit value is the
XOR of ``L_n`` of its set bits: 32 numbers per length, each found once by hashing ``n`` zero
bytes (a 2 MiB value length costs ~33 passes over 2 MiB of zeros, once per process).

A whole-chunk read of several values (``_reads.plan_reads``) arrives with the chunk's CRC
checked on the wire; when the values' own CRCs combine to it, every value is intact and none
is hashed again.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import crc32c

from loomfs.kvcache._entry import Entry
from loomfs.kvcache._reads import Run

LENGTHS_CACHED = 16  # value lengths whose shift tables are kept
_ZEROS = bytes(1 << 20)


def _crc_of_zeros(n: int, value: int) -> int:
    crc, left = value, n
    while left:
        k = min(left, len(_ZEROS))
        crc = crc32c.crc32c(memoryview(_ZEROS)[:k], crc)
        left -= k
    return crc


@functools.lru_cache(maxsize=LENGTHS_CACHED)
def _shift_table(n: int) -> tuple[int, ...]:
    """``L_n`` of each bit 0..31."""
    base = _crc_of_zeros(n, 0)
    return tuple(_crc_of_zeros(n, 1 << i) ^ base for i in range(32))


def crc_cat(crc_a: int, crc_b: int, len_b: int) -> int:
    """CRC32C of ``A + B`` from ``crc(A)``, ``crc(B)`` and ``len(B)``."""
    table = _shift_table(len_b)
    out = crc_b
    v, i = crc_a, 0
    while v:
        if v & 1:
            out ^= table[i]
        v >>= 1
        i += 1
    return out


def tiled_crc(r: Run, entries: Sequence[Entry | None]) -> int | None:
    """The CRC32C of the run's range from its values' CRCs, when the values tile it exactly
    (back to back, no gap, no value twice); None otherwise."""
    spans = sorted((e.seg_offset % e.chunk_size, e.value_bytes, e.value_crc)
                   for i in r.members if (e := entries[i]) is not None)
    pos, crc = r.start, 0
    for start, n, value_crc in spans:
        if start != pos:
            return None
        crc = value_crc if pos == r.start else crc_cat(crc, value_crc, n)
        pos += n
    return crc if pos == r.end and spans else None
