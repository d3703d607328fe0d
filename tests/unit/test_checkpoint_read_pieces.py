"""The checkpoint reader's pieces: never across a chunk boundary, at most piece_bytes; every
file read under a read hold at meta."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from loomfs.checkpoint._holds import HoldLapsed, ReadHolds
from loomfs.checkpoint._reader import PIECE_MAX_BYTES, read_files


class _File:
    def __init__(self, chunk_size: int, log: list[tuple[int, int]], inode: int = 7):
        self.layout = SimpleNamespace(chunk_size=chunk_size)
        self.log = log
        self.inode = inode
        self.inline = False

    async def pread(self, offset: int, view: memoryview) -> int:
        self.log.append((offset, len(view)))
        view[:] = bytes([offset % 251]) * len(view)
        return len(view)

    async def close(self) -> None:
        pass


class _Meta:
    """Read holds as meta keeps them: OPEN with a hold id, CLOSE, RENEW_SESSIONS."""

    def __init__(self, inodes: list[int]):
        self.inodes = inodes  # what the name leads to at each OPEN (the last one repeats)
        self.holds: dict[int, int] = {}
        self.calls: list[str] = []
        self.expire = False

    async def open(self, path: str, flags: int, mode: int, client_id: int, hold_id: int) -> Any:
        inode = self.inodes.pop(0) if len(self.inodes) > 1 else self.inodes[0]
        self.holds[hold_id] = inode
        self.calls.append(f"hold {inode}")
        return SimpleNamespace(attr=SimpleNamespace(inode=inode), session_lease_s=60.0)

    async def close(self, inode: int, hold_id: int, length: int) -> None:
        assert self.holds.pop(hold_id) == inode
        self.calls.append(f"end {inode}")

    async def renew_sessions(self, client_id: int, ids: list[int]) -> int:
        if self.expire:
            self.holds.clear()
        return sum(i in self.holds for i in ids)


class _Client:
    def __init__(self, chunk_size: int, inodes: tuple[int, ...] = (7,)):
        self.chunk_size = chunk_size
        self.log: list[tuple[int, int]] = []
        self.meta = _Meta(list(inodes))
        self.client_id = 1
        self.opened = [inodes[-1]]  # what client.open finds

    async def open(self, path: str, mode: str) -> Any:
        inode = self.opened.pop(0) if len(self.opened) > 1 else self.opened[0]
        self.meta.calls.append(f"open {inode}")
        return _File(self.chunk_size, self.log, inode)


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


def test_every_file_is_read_under_a_hold_taken_before_its_open() -> None:
    c = _Client(4 << 20)
    asyncio.run(read_files(c, {"/f": [(0, memoryview(bytearray(100)))]}, 4))
    assert c.meta.calls == ["hold 7", "open 7", "end 7"] and not c.meta.holds


def test_a_name_renamed_over_between_hold_and_open_is_held_again() -> None:
    """prune(archive_ec=...) renames a converted copy (inode 8) over the file: the open found
    the new file, the hold the old one; both are taken again, on the same inode."""
    c = _Client(4 << 20, inodes=(7, 8))
    asyncio.run(read_files(c, {"/f": [(0, memoryview(bytearray(100)))]}, 4))
    assert c.meta.calls == ["hold 7", "open 8", "end 7", "hold 8", "open 8", "end 8"]


def test_a_hold_that_lapsed_fails_the_load_instead_of_returning_zeros() -> None:
    c = _Client(4 << 20)
    c.meta.expire = True  # meta dropped the hold (this client was cut off past the lease)
    now = [0.0]
    holds = ReadHolds(c, clock=lambda: now[0])
    real = _File.pread

    async def slow(self: _File, offset: int, view: memoryview) -> int:
        now[0] += 61.0  # the read outlasted the 60 s lease without a renewal meta answered
        return await real(self, offset, view)

    _File.pread = slow  # type: ignore[method-assign]
    try:
        with pytest.raises(HoldLapsed):
            asyncio.run(read_files(c, {"/f": [(0, memoryview(bytearray(100)))]}, 4, None, holds))
    finally:
        _File.pread = real  # type: ignore[method-assign]
