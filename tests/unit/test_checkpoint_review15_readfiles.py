"""Review of the whole-chunk load reads (78aa4f1) and the one-batch load (bbb3e6c).

- A load without resharding is one ``read_files`` call now: its first failed read must end
  the load (the reads still waiting not started, those in flight cancelled), not after every
  other read of the whole checkpoint ran (a dead chain: each of its reads waits out the call
  timeout, ``inflight`` at a time).
- A hold that lapsed mid-load stops the reads not started yet (``HoldLapsed``), not after the
  whole load read zeros.
- A whole chunk that storage holds fewer bytes of than the file's length says (a lost or cut
  chunk of a data file whose items lie back to back) fails the load, instead of loading zeros.
- ``plan_file`` edge cases: zero-length items, chunk size unknown.

Fakes of ``test_checkpoint_load_chunks``, no sockets."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_checkpoint_load_chunks import CONTENT, MIB, _Client, _File, _Storage

from loomfs.checkpoint._holds import HoldLapsed, ReadHolds
from loomfs.checkpoint._readfiles import plan_file, read_files
from loomfs.net.scatter import Scatter

# CONTENT: 10 MiB in 4 MiB chunks (the fake file's chunk size): chunks 0, 1 whole, 2 of 2 MiB
SPANS = [(0, 4 * MIB), (4 * MIB, 4 * MIB), (8 * MIB, 2 * MIB)]


class _HangingStorage(_Storage):
    """Chunk ``bad`` fails at once; every other read waits for ever (a dead chain's reads
    waiting out their timeout)."""

    def __init__(self, content: bytes, bad: int):
        super().__init__(content)
        self.bad = bad
        self.started: list[int] = []
        self.cancelled = 0

    async def read_chunk(self, layout: Any, inode: int, index: int, offset: int, length: int, into: Any) -> int:
        self.started.append(index)
        if index == self.bad:
            raise OSError(5, f"chunk {index}: storage failed")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return 0


def _reads(bufs: list[bytearray]) -> dict[str, list[tuple[int, memoryview]]]:
    return {"/f": [(o, memoryview(b)) for (o, _n), b in zip(SPANS, bufs, strict=True)]}


def test_the_first_failed_read_ends_the_load_at_once() -> None:
    content = CONTENT * 4  # 40 MiB: 10 chunks of 4 MiB
    spans = [(i * 4 * MIB, 4 * MIB) for i in range(10)]
    st = _HangingStorage(content, bad=9)  # the last chunk: read first
    client = _Client(_File(content, 4 * MIB, []), st)
    bufs = [bytearray(n) for _o, n in spans]
    reads = {"/f": [(o, memoryview(b)) for (o, _n), b in zip(spans, bufs, strict=True)]}

    async def main() -> None:
        await asyncio.wait_for(read_files(client, reads, 3, MIB), 5.0)

    with pytest.raises(OSError, match="chunk 9: storage failed"):
        asyncio.run(main())
    assert len(st.started) <= 3, st.started  # no read started after the failure
    assert st.cancelled == len(st.started) - 1  # those in flight were cancelled


class _ShortStorage(_Storage):
    """Chunk ``short`` holds only ``keep`` bytes; the rest reads as zeros (``read_chunk``'s
    contract)."""

    def __init__(self, content: bytes, short: int, keep: int):
        super().__init__(content)
        self.short, self.keep = short, keep

    async def read_chunk(self, layout: Any, inode: int, index: int, offset: int, length: int, into: Any) -> int:
        n = await super().read_chunk(layout, inode, index, offset, length, into)
        if index != self.short:
            return n
        got = max(0, min(n, self.keep - offset))
        if isinstance(into, Scatter):
            into.zero_from(got)
        else:
            into[got:length] = bytes(length - got)
        return got


@pytest.mark.parametrize("index", [1, 2])  # a whole 4 MiB chunk; the file's short last chunk
def test_a_chunk_shorter_than_the_file_says_fails_the_load(index: int) -> None:
    st = _ShortStorage(CONTENT, short=index, keep=MIB)
    client = _Client(_File(CONTENT, 4 * MIB, []), st)
    bufs = [bytearray(n) for _o, n in SPANS]
    with pytest.raises(EOFError, match=f"chunk {index}"):
        asyncio.run(read_files(client, _reads(bufs), 4, MIB))


def test_a_missing_chunk_fails_the_load() -> None:
    st = _ShortStorage(CONTENT, short=0, keep=0)  # storage has no such chunk: all zeros
    client = _Client(_File(CONTENT, 4 * MIB, []), st)
    bufs = [bytearray(n) for _o, n in SPANS]
    with pytest.raises(EOFError, match="chunk 0"):
        asyncio.run(read_files(client, _reads(bufs), 4, MIB))


class _LapsingStorage(_Storage):
    """After its first read, the renewal finds the load's hold gone."""

    holds: ReadHolds | None = None

    async def read_chunk(self, layout: Any, inode: int, index: int, offset: int, length: int, into: Any) -> int:
        n = await super().read_chunk(layout, inode, index, offset, length, into)
        assert self.holds is not None
        self.holds.lost.append("/f")
        return n


def test_a_hold_lapsed_mid_load_stops_the_reads_left() -> None:
    content = CONTENT * 4
    spans = [(i * 4 * MIB, 4 * MIB) for i in range(10)]
    st = _LapsingStorage(content)
    client = _Client(_File(content, 4 * MIB, []), st)
    bufs = [bytearray(n) for _o, n in spans]
    reads = {"/f": [(o, memoryview(b)) for (o, _n), b in zip(spans, bufs, strict=True)]}

    async def main() -> None:
        holds = st.holds = ReadHolds(client)
        await holds.open_all(reads)
        try:
            await read_files(client, reads, 1, MIB, holds)
        finally:
            await holds.close()

    with pytest.raises(HoldLapsed):
        asyncio.run(main())
    assert len(st.calls) == 1, st.calls


def test_plan_file_zero_length_items_and_unknown_chunk_size() -> None:
    bufs = [bytearray(4 * MIB), bytearray(0), bytearray(4 * MIB), bytearray(0)]
    reads = [(0, memoryview(bufs[0])), (4 * MIB, memoryview(bufs[1])), (4 * MIB, memoryview(bufs[2])),
             (8 * MIB, memoryview(bufs[3]))]
    wholes, pieces = plan_file(reads, 4 * MIB, 8 * MIB, MIB)
    assert sorted((w.index, w.length, len(w.parts)) for w in wholes) == [(0, 4 * MIB, 1), (1, 4 * MIB, 1)]
    assert pieces == []
    # chunk size unknown (0): pieces only, none across a 4 MiB boundary
    wholes, pieces = plan_file(reads, 0, 8 * MIB, None)
    assert wholes == [] and sorted((o, len(v)) for o, v in pieces) == [(0, 4 * MIB), (4 * MIB, 4 * MIB)]
    # two items sharing chunk 0 in part each, with a gap between them: pieces
    a, b = bytearray(MIB), bytearray(2 * MIB)
    wholes, pieces = plan_file([(0, memoryview(a)), (2 * MIB, memoryview(b))], 4 * MIB, 8 * MIB, MIB)
    assert wholes == [] and sorted((o, len(v)) for o, v in pieces) == [(0, MIB), (2 * MIB, MIB), (3 * MIB, MIB)]
