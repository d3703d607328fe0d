"""The codec seam: RS(k, m) encode/decode over equal-length fragment buffers.

Fragments 0..k-1 are data, k..k+m-1 parity. ``encode`` fills the m parity buffers from the k
data buffers; ``decode`` fills any wanted fragments (data or parity) from at least k present
ones. Buffers are anything with the buffer protocol (bytes for inputs, bytearray/memoryview/
numpy for outputs); callers reuse them, the codecs allocate nothing per call on the fast path.
``make_codec`` picks ISA-L when ``libisal.so.2`` loads, else the numpy reference (slow).
"""

from __future__ import annotations

import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

logger = logging.getLogger(__name__)

Buffer = Any  # a buffer-protocol object (bytes, bytearray, memoryview, numpy array)


class Codec(ABC):
    name: str = "?"
    k: int
    m: int

    @abstractmethod
    def encode(self, data: Sequence[Buffer], parity: Sequence[Buffer]) -> None: ...

    @abstractmethod
    def decode(self, present: Mapping[int, Buffer], want: Mapping[int, Buffer]) -> None: ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.k}+{self.m})"


def _len(b: Buffer) -> int:
    return memoryview(b).nbytes


def check_encode(c: Codec, data: Sequence[Buffer], parity: Sequence[Buffer]) -> int:
    if len(data) != c.k or len(parity) != c.m:
        raise ValueError(f"{c!r}: need {c.k} data and {c.m} parity buffers, got {len(data)}+{len(parity)}")
    n = _len(data[0])
    if any(_len(b) != n for b in (*data, *parity)):
        raise ValueError(f"{c!r}: fragment buffers differ in length")
    return n


def check_decode(c: Codec, present: Mapping[int, Buffer], want: Mapping[int, Buffer]) -> list[int]:
    """The k present fragments to decode from (lowest indexes), after checking the request."""
    n_all = c.k + c.m
    if len(present) < c.k:
        raise ValueError(f"{c!r}: {len(present)} fragments present, need {c.k}")
    if any(not 0 <= i < n_all for i in (*present, *want)):
        raise ValueError(f"{c!r}: fragment index out of range")
    use = sorted(present)[: c.k]
    n = _len(present[use[0]])
    if any(_len(present[i]) != n for i in use) or any(_len(b) != n for b in want.values()):
        raise ValueError(f"{c!r}: fragment buffers differ in length")
    return use


_CACHE: dict[tuple[str, int, int], Codec] = {}


def make_codec(k: int, m: int, kind: str = "") -> Codec:
    """A codec for RS(k, m): ``isal``, ``reference`` or ``auto`` (ISA-L if it loads; the
    default, or ``$LOOMFS_EC_CODEC``). Cached."""
    from loomfs.ec.gf256 import ReferenceCodec
    from loomfs.ec.isal import IsalCodec, isal_available

    kind = kind or os.environ.get("LOOMFS_EC_CODEC", "auto")
    if kind == "auto":
        kind = "isal" if isal_available() else "reference"
        if kind == "reference":
            logger.warning("libisal.so.2 not found: erasure coding uses the slow numpy codec")
    key = (kind, k, m)
    c = _CACHE.get(key)
    if c is None:
        if kind == "isal":
            c = IsalCodec(k, m)
        elif kind == "reference":
            c = ReferenceCodec(k, m)
        else:
            raise ValueError(f"unknown codec {kind!r}")
        _CACHE[key] = c
    return c
