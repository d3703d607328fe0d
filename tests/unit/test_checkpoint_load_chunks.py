"""A load reads a chunk it wants whole with one READ into the items that cover it (storage then
sends the stored CRC and checks no blocks); what it wants only part of goes in pieces, by
pread. Fakes, no sockets."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from loomfs.checkpoint._readfiles import WholeChunk, plan_file, read_files
from loomfs.net.scatter import Scatter

MIB = 1 << 20


def _views(*spans: tuple[int, int]) -> list[tuple[int, memoryview]]:
    return [(off, memoryview(bytearray(n))) for off, n in spans]


def _shape(wholes: list[WholeChunk], pieces: list[tuple[int, memoryview]]) -> tuple[list[Any], list[Any]]:
    return (sorted((w.index, w.length, [len(p) for p in w.parts]) for w in wholes),
            sorted((off, len(v)) for off, v in pieces))


def test_items_back_to_back_are_read_as_whole_chunks() -> None:
    # four 8 MiB items in two 16 MiB chunks, the file 32 MiB
    reads = _views((0, 8 * MIB), (8 * MIB, 8 * MIB), (16 * MIB, 8 * MIB), (24 * MIB, 8 * MIB))
    assert _shape(*plan_file(reads, 16 * MIB, 32 * MIB, 4 * MIB)) == (
        [(0, 16 * MIB, [8 * MIB, 8 * MIB]), (1, 16 * MIB, [8 * MIB, 8 * MIB])], [])


def test_an_item_across_chunks_and_a_short_last_chunk() -> None:
    # 10 MiB + 10 MiB + 1 MiB: the second item straddles chunks 0 and 1; the file ends at 21 MiB
    reads = _views((0, 10 * MIB), (10 * MIB, 10 * MIB), (20 * MIB, MIB))
    wholes, pieces = plan_file(reads, 16 * MIB, 21 * MIB, 4 * MIB)
    assert _shape(wholes, pieces) == ([(0, 16 * MIB, [10 * MIB, 6 * MIB]), (1, 5 * MIB, [4 * MIB, MIB])], [])
    # the parts are views of the items' own buffers, in order
    second = reads[1][1]
    w0 = next(w for w in wholes if w.index == 0)
    assert w0.parts[1].obj is second.obj


def test_a_chunk_wanted_in_part_goes_in_aligned_pieces() -> None:
    # a gap (resharding: another rank's item) in chunk 0; chunk 1 whole
    reads = _views((0, 3 * MIB), (6 * MIB, 10 * MIB), (16 * MIB, 16 * MIB))
    assert _shape(*plan_file(reads, 16 * MIB, 32 * MIB, 4 * MIB)) == (
        [(1, 16 * MIB, [16 * MIB])],
        [(0, 3 * MIB), (6 * MIB, 2 * MIB), (8 * MIB, 4 * MIB), (12 * MIB, 4 * MIB)])


def test_overlapping_reads_and_reads_past_the_end_are_pieces() -> None:
    # two load items reading one stored item (each into its own scratch): no whole chunk
    reads = _views((0, 16 * MIB), (0, 16 * MIB))
    wholes, pieces = plan_file(reads, 16 * MIB, 16 * MIB, None)
    assert wholes == [] and sorted((o, len(v)) for o, v in pieces) == [(0, 16 * MIB), (0, 16 * MIB)]
    # the file is shorter than the item says: pread's short read must raise, so no whole chunk
    wholes, _ = plan_file(_views((0, 16 * MIB)), 16 * MIB, 12 * MIB, None)
    assert wholes == []
    # file length unknown (no storage client): pieces only
    wholes, pieces = plan_file(_views((0, 16 * MIB)), 16 * MIB, None, 4 * MIB)
    assert wholes == [] and len(pieces) == 4


class _Storage:
    def __init__(self, content: bytes):
        self.content = content
        self.calls: list[tuple[int, int, int, str]] = []

    async def read_chunk(self, layout: Any, inode: int, index: int, offset: int, length: int, into: Any) -> int:
        self.calls.append((inode, index, length, type(into).__name__))
        start = index * layout.chunk_size + offset
        data = self.content[start:start + length]
        if isinstance(into, Scatter):
            into.write(data)
        else:
            into[:len(data)] = data
        return len(data)


class _File:
    def __init__(self, content: bytes, chunk: int, log: list[tuple[int, int]], *, inline: bool = False, ec_k: int = 0):
        self.layout = SimpleNamespace(chunk_size=chunk, ec_k=ec_k)
        self.content, self.log, self.inline = content, log, inline
        self.inode, self.length = 7, len(content)

    async def pread(self, offset: int, view: memoryview) -> int:
        self.log.append((offset, len(view)))
        data = self.content[offset:offset + len(view)]
        view[:len(data)] = data
        return len(data)

    async def close(self) -> None:
        pass


class _Meta:
    async def open(self, path: str, flags: int, mode: int, client_id: int, hold_id: int) -> Any:
        return SimpleNamespace(attr=SimpleNamespace(inode=7), session_lease_s=60.0)

    async def close(self, inode: int, hold_id: int, length: int) -> None:
        pass


class _Client:
    def __init__(self, file: _File, storage: _Storage | None):
        self.file, self.meta, self.client_id = file, _Meta(), 1
        if storage is not None:
            self.storage = storage

    async def open(self, path: str, mode: str) -> Any:
        return self.file


def _load(content: bytes, spans: list[tuple[int, int]], *, storage: bool = True, **kw: Any
          ) -> tuple[list[bytes], _Storage, list[tuple[int, int]]]:
    log: list[tuple[int, int]] = []
    st = _Storage(content)
    client = _Client(_File(content, 4 * MIB, log, **kw), st if storage else None)
    bufs = [bytearray(n) for _o, n in spans]
    asyncio.run(read_files(client, {"/f": [(o, memoryview(b)) for (o, _n), b in zip(spans, bufs, strict=True)]},
                           4, MIB))
    return [bytes(b) for b in bufs], st, log


CONTENT = bytes(range(256)) * (10 * MIB // 256)  # 10 MiB, 4 MiB chunks: 4 + 4 + 2


def test_read_files_reads_whole_chunks_into_the_items_and_the_rest_by_pread() -> None:
    spans = [(0, 3 * MIB), (3 * MIB, MIB), (4 * MIB, 4 * MIB), (8 * MIB, MIB)]  # chunk 2 wanted in part
    got, st, log = _load(CONTENT, spans)
    assert got == [CONTENT[o:o + n] for o, n in spans]
    assert sorted(st.calls) == [(7, 0, 4 * MIB, "Scatter"), (7, 1, 4 * MIB, "memoryview")]
    assert log == [(8 * MIB, MIB)]


def test_the_last_short_chunk_is_read_whole_to_the_files_end() -> None:
    spans = [(8 * MIB, 2 * MIB)]
    got, st, log = _load(CONTENT, spans)
    assert got == [CONTENT[8 * MIB:]] and st.calls == [(7, 2, 2 * MIB, "memoryview")] and log == []


def test_inline_erasure_coded_or_no_storage_client_read_by_pread_only() -> None:
    spans = [(0, 4 * MIB), (4 * MIB, 4 * MIB)]
    for kw in ({"inline": True}, {"ec_k": 4}, {"storage": False}):
        got, st, log = _load(CONTENT, spans, **kw)
        assert got == [CONTENT[:4 * MIB], CONTENT[4 * MIB:8 * MIB]], kw
        assert st.calls == [] and sorted(log) == [(i * MIB, MIB) for i in range(8)], kw
