"""Stripe math and fragment headers (pure).

An EC file of layout ``ec(k, m, chunk_size)`` is cut into stripes of ``k * chunk_size`` data
bytes. Data fragment j of stripe s holds the stripe's bytes ``[j*cs, (j+1)*cs)`` (contiguous,
so a read touches only the data fragments covering its range); parity fragments k..k+m-1 are
RS(k, m) of the data fragments zero-padded to the longest one. Fragment j of stripe s is the
ordinary chunk ``s*(k+m) + (j+s) % (k+m)`` of the inode; the file's layout has exactly k+m
chains (a group of single-replica chains on distinct nodes), so it lands on
``chains[(j+s) % (k+m)]``: data and parity rotate over the group stripe by stripe.
An overwrite first stages the whole new stripe in the *shadow* stripe ``SHADOW_STRIPE_BASE + s``.

Every fragment chunk ends with a 64-byte header (a trailer, so payload offsets stay aligned): magic, code, fragment index, stripe
index, the stripe *version* (writer-unique, increasing), the stripe's data length, the
payload length and the payload's CRC32C. Decoders group fragments by (version, stripe
length) and never combine two versions.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

import crc32c

MAGIC = 0x4C4D4543  # "LMEC"
HEADER_BYTES = 64
SHADOW_STRIPE_BASE = 1 << 40  # shadow stripe s is stored as stripe SHADOW_STRIPE_BASE + s
# magic, format, k, m, fragment, stripe, version, stripe_len, payload_len, crc, pad
_HDR = struct.Struct("<IHBBHxxQQQII20x")
assert _HDR.size == HEADER_BYTES


@dataclass(frozen=True, slots=True)
class FragmentHeader:
    k: int
    m: int
    fragment: int
    stripe: int
    version: int
    stripe_len: int  # data bytes in the stripe (<= k * chunk_size)
    payload_len: int
    crc: int  # CRC32C of the payload

    def pack(self) -> bytes:
        return _HDR.pack(MAGIC, 1, self.k, self.m, self.fragment, self.stripe, self.version, self.stripe_len,
                         self.payload_len, self.crc)

    @classmethod
    def unpack(cls, raw: bytes | memoryview) -> FragmentHeader | None:
        """The header, or None if ``raw`` is not one (short, wrong magic or format)."""
        if len(raw) < HEADER_BYTES:
            return None
        magic, fmt, k, m, frag, stripe, ver, slen, plen, crc = _HDR.unpack_from(raw)
        if magic != MAGIC or fmt != 1:
            return None
        return cls(k, m, frag, stripe, ver, slen, plen, crc)

    def key(self) -> tuple[int, int]:
        """What fragments must agree on to be decoded together."""
        return (self.version, self.stripe_len)


@dataclass(frozen=True, slots=True)
class Geometry:
    k: int
    m: int
    chunk_size: int  # bytes of data per data fragment

    @property
    def width(self) -> int:
        return self.k + self.m

    @property
    def stripe_bytes(self) -> int:
        return self.k * self.chunk_size

    def chunk_index(self, stripe: int, fragment: int, *, shadow: bool = False) -> int:
        """Fragment ``fragment`` of stripe ``stripe`` is chunk ``stripe*(k+m) + (fragment+stripe) % (k+m)``:
        on ``chains[(fragment + stripe) % (k+m)]``, so data and parity rotate over the group's
        chains stripe by stripe and a large read uses every server of the group (the shadow
        stripe's fragments sit on the same chains as the live ones)."""
        base = (SHADOW_STRIPE_BASE if shadow else 0) + stripe
        return base * self.width + (fragment + stripe) % self.width

    def stripe_chunks(self, stripe: int, *, shadow: bool = False) -> range:
        """The chunk indexes of one stripe's k+m fragments (contiguous, in rotated order)."""
        base = ((SHADOW_STRIPE_BASE if shadow else 0) + stripe) * self.width
        return range(base, base + self.width)

    def chain_slot(self, stripe: int, fragment: int) -> int:
        """Index into the layout's chains of the chain holding this fragment."""
        return (fragment + stripe) % self.width

    def data_len(self, stripe_len: int, fragment: int) -> int:
        """Real bytes data fragment ``fragment`` holds in a stripe of ``stripe_len`` bytes."""
        return max(0, min(self.chunk_size, stripe_len - fragment * self.chunk_size))

    def parity_len(self, stripe_len: int) -> int:
        return min(self.chunk_size, stripe_len)

    def payload_len(self, stripe_len: int, fragment: int) -> int:
        return self.data_len(stripe_len, fragment) if fragment < self.k else self.parity_len(stripe_len)

    def stripes(self, file_len: int) -> int:
        return -(-file_len // self.stripe_bytes) if file_len > 0 else 0

    def stripe_len(self, stripe: int, file_len: int) -> int:
        return max(0, min(self.stripe_bytes, file_len - stripe * self.stripe_bytes))


@dataclass(frozen=True, slots=True)
class FragPiece:
    """The part of a file range in one data fragment."""

    stripe: int
    fragment: int
    offset: int  # inside the fragment's payload
    length: int
    buffer_offset: int


def split_range(g: Geometry, offset: int, length: int) -> Iterator[FragPiece]:
    """``[offset, offset+length)`` of the file as pieces of data fragments, in file order."""
    if offset < 0 or length < 0:
        raise ValueError(f"bad range offset={offset} length={length}")
    pos, end = offset, offset + length
    cs = g.chunk_size
    while pos < end:
        stripe, in_stripe = divmod(pos, g.stripe_bytes)
        frag, off = divmod(in_stripe, cs)
        n = min(cs - off, end - pos)
        yield FragPiece(stripe, frag, off, n, pos - offset)
        pos += n


def payload_crc(payload: bytes | bytearray | memoryview) -> int:
    return crc32c.crc32c(payload)
