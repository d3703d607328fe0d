"""The checkpoint reader's pieces: never across a chunk boundary, at most piece_bytes."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from loomfs.checkpoint._reader import PIECE_MAX_BYTES, read_files


class _File:
    def __init__(self, chunk_size: int, log: list[tuple[int, int]]):
        self.layout = SimpleNamespace(chunk_size=chunk_size)
        self.log = log

    async def pread(self, offset: int, view: memoryview) -> int:
        self.log.append((offset, len(view)))
        view[:] = bytes([offset % 251]) * len(view)
        return len(view)

    async def close(self) -> None:
        pass


class _Client:
    def __init__(self, chunk_size: int):
        self.chunk_size = chunk_size
        self.log: list[tuple[int, int]] = []

    async def open(self, path: str, mode: str) -> Any:
        return _File(self.chunk_size, self.log)


def _pieces(chunk: int, piece: int | None, offset: int, length: int) -> list[tuple[int, int]]:
    c = _Client(chunk)
    buf = bytearray(length)
    asyncio.run(read_files(c, {"/f": [(offset, memoryview(buf))]}, 4, piece))
    return sorted(c.log)


def test_big_chunks_are_read_in_aligned_parts() -> None:
    mib = 1 << 20
    assert PIECE_MAX_BYTES == 4 * mib
    got = _pieces(16 * mib, PIECE_MAX_BYTES, 3 * mib, 14 * mib)
    assert got == [(3 * mib, mib), (4 * mib, 4 * mib), (8 * mib, 4 * mib), (12 * mib, 4 * mib), (16 * mib, mib)]


def test_whole_chunk_pieces_without_a_cap() -> None:
    mib = 1 << 20
    assert _pieces(16 * mib, None, 3 * mib, 14 * mib) == [(3 * mib, 13 * mib), (16 * mib, mib)]


def test_a_cap_that_does_not_divide_the_chunk_is_ignored() -> None:
    mib = 1 << 20
    assert _pieces(4 * mib, 3 * mib, 0, 6 * mib) == [(0, 4 * mib), (4 * mib, 2 * mib)]
