"""Chunk math (pure): which chunks, chains and buffer slices a byte range touches."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from loomfs.wire.types import Layout


@dataclass(frozen=True, slots=True)
class Piece:
    """The part of a byte range that falls in one chunk."""

    index: int  # chunk index in the file
    chain_id: int
    offset: int  # inside the chunk
    length: int
    buffer_offset: int  # where these bytes sit in the caller's buffer


def chain_of(layout: Layout, index: int) -> int:
    if not layout.chains:
        raise ValueError("layout has no chains")
    return layout.chains[index % len(layout.chains)]


def split_range(layout: Layout, offset: int, length: int) -> Iterator[Piece]:
    """Split ``[offset, offset + length)`` of a file into per-chunk pieces, in order."""
    if offset < 0 or length < 0:
        raise ValueError(f"bad range offset={offset} length={length}")
    cs = layout.chunk_size
    if cs <= 0:
        raise ValueError(f"bad chunk size {cs}")
    pos, end = offset, offset + length
    while pos < end:
        index, off = divmod(pos, cs)
        n = min(cs - off, end - pos)
        yield Piece(index, chain_of(layout, index), off, n, pos - offset)
        pos += n


def chunk_count(layout: Layout, length: int) -> int:
    """Chunks needed to hold ``length`` bytes."""
    return -(-length // layout.chunk_size) if length > 0 else 0


def chunk_range(layout: Layout, offset: int, length: int) -> range:
    """Indexes of the chunks ``[offset, offset + length)`` touches."""
    if length <= 0:
        return range(0)
    cs = layout.chunk_size
    return range(offset // cs, (offset + length - 1) // cs + 1)
