"""A degraded read's fragment repair racing an overwrite of the stripe (client/ec_stripe.py),
over an in-memory fragment store with chunk versions (no sockets): the repair writes the
version it decoded only where the fragment still lacks it and was not written after the
repair looked (a fenced write), so a healthy read never mixes the old version's bytes into
the new one (review, session 13, known defect 1)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from loomfs.client import ec_stripe as es
from loomfs.client.ec_file import STATS
from loomfs.client.ec_io import FragmentUnavailable
from loomfs.client.storage_client import zero_fill
from loomfs.ec.codec import make_codec
from loomfs.ec.stripe import Geometry
from loomfs.errors import StatusError
from loomfs.net.buffers import BufferPool
from loomfs.wire.status import Status

K, M, CS = 4, 2, 4096
G = Geometry(K, M, CS)
SB = G.stripe_bytes
CODEC = make_codec(K, M)


class VersionedIO:
    """Fragment chunks as (bytes, version); a write bumps the version; ``if_ver_le`` fences."""

    def __init__(self) -> None:
        self.geometry = G
        self.inode = 7
        self.chunks: dict[int, tuple[bytes, int]] = {}
        self.after_read: Callable[[int], Any] | None = None  # runs after a read of that chunk
        self.refused: set[int] = set()  # chunks their server refuses as corrupt (until rewritten)
        self.down_chunks: set[int] = set()

    def down(self, index: int) -> bool:
        return index in self.down_chunks

    async def head_version(self, index: int) -> int:
        return self.chunks.get(index, (b"", 0))[1]

    async def write(self, index: int, data: Any, *, exact: bool = False, if_ver_le: int = -1) -> None:
        old, ver = self.chunks.get(index, (b"", 0))
        if if_ver_le >= 0 and ver > if_ver_le:
            raise StatusError(Status.VERSION_MISMATCH, f"chunk {index} at v{ver}, saw v{if_ver_le}")
        d = bytes(data)
        self.chunks[index] = (d if exact else d + old[len(d):], ver + 1)
        self.refused.discard(index)

    async def remove_all(self, begin: int, end: int) -> None:
        for i in range(begin, end):
            if i in self.chunks:
                self.chunks[i] = (b"", self.chunks[i][1] + 1)

    async def read(self, index: int, offset: int, length: int, into: memoryview) -> int | None:
        into = into[:length]
        if index in self.refused:
            err = FragmentUnavailable("checksum mismatch")
            err.corrupt = True
            raise err
        c = self.chunks.get(index)
        if c is None:
            zero_fill(into)
            return None
        part = c[0][offset : offset + length]
        into[: len(part)] = part
        zero_fill(into[len(part):])
        hook, self.after_read = self.after_read, None
        if hook is not None:
            await hook(index)
        return len(c[0])

    def rot(self, index: int) -> None:
        data, ver = self.chunks[index]
        self.chunks[index] = (bytes([data[0] ^ 0xFF]) + data[1:], ver)


async def write_full(io: VersionedIO, fill: bytes, *, overwrite: bool) -> None:
    """A whole-stripe write, as ``EcFileIO`` sends one (it loads nothing: no version to exceed)."""
    buf = bytearray(es.stripe_buffer_bytes(G))
    for j in range(K):
        es.payload(G, buf, j)[:] = fill * CS
    await es.write_stripe(io, CODEC, STATS, 0, buf, SB, valid_lo=0, valid_hi=SB,  # type: ignore[arg-type]
                          overwrite=overwrite)


async def healthy_read(io: VersionedIO) -> bytes:
    got = bytearray(SB)
    await es.read_range(io, CODEC, STATS, BufferPool(), 0, memoryview(got))  # type: ignore[arg-type]
    return bytes(got)


async def decode_with_bad_fragment(io: VersionedIO) -> tuple[bytearray, es.Resolved]:
    """What a degraded read of the stripe holds when it starts its repair of fragment 0."""
    buf = bytearray(es.stripe_buffer_bytes(G))
    res = await es.resolve(io, CODEC, STATS, 0, buf, repair=False, full=True)  # type: ignore[arg-type]
    assert res is not None and res.bad == [0]
    return buf, res


def test_a_repair_after_an_overwrite_leaves_the_new_version() -> None:
    async def main() -> None:
        io = VersionedIO()
        await write_full(io, b"1", overwrite=False)
        io.rot(G.chunk_index(0, 0))
        buf, res = await decode_with_bad_fragment(io)  # decoded version 1
        await write_full(io, b"2", overwrite=True)  # the overwrite finished before the repair ran
        await es.repair_fragments(io, STATS, 0, buf, res)  # type: ignore[arg-type]
        assert await healthy_read(io) == b"2" * SB

    asyncio.run(main())


def test_an_overwrite_by_a_writer_whose_clock_is_behind_is_kept() -> None:
    """The fence is the chunk version the decode read, not the stripe versions (wall clocks
    of different processes): a whole-stripe overwrite stamped below the decoded version by a
    writer whose clock is behind is still never undone by the repair (review, session 14)."""
    async def main() -> None:
        io = VersionedIO()
        saved = es._last_version
        try:
            es._last_version = time.time_ns() + 50_000_000  # writer A's clock: 50 ms ahead
            await write_full(io, b"1", overwrite=False)
            io.rot(G.chunk_index(0, 0))
            buf, res = await decode_with_bad_fragment(io)  # the reader decodes A's version
            es._last_version = 0  # writer B, another process: its clock is behind A's
            await write_full(io, b"2", overwrite=True)
        finally:
            es._last_version = max(saved, es._last_version)
        assert await healthy_read(io) == b"2" * SB
        await es.repair_fragments(io, STATS, 0, buf, res)  # type: ignore[arg-type]
        assert await healthy_read(io) == b"2" * SB

    asyncio.run(main())


def test_a_fragment_refused_as_corrupt_written_after_the_look_is_kept() -> None:
    """A fragment its server refused as corrupt has no version read: the repair looks at its
    head version, then at its content; an overwrite landing right after that look is fenced off."""
    async def main() -> None:
        io = VersionedIO()
        await write_full(io, b"1", overwrite=False)
        io.refused.add(G.chunk_index(0, 0))
        buf, res = await decode_with_bad_fragment(io)
        assert res.was[0] == es.BAD

        async def overwrite(index: int) -> None:  # right after the repair's look at fragment 0
            await write_full(io, b"2", overwrite=True)

        io.refused.discard(G.chunk_index(0, 0))  # (the look reads it: answer with its bad bytes)
        io.rot(G.chunk_index(0, 0))
        io.after_read = overwrite
        assert await es.repair_fragments(io, STATS, 0, buf, res) == []  # type: ignore[arg-type]
        assert await healthy_read(io) == b"2" * SB

    asyncio.run(main())


def test_a_repair_with_no_overwrite_restores_the_fragment() -> None:
    async def main() -> None:
        io = VersionedIO()
        await write_full(io, b"1", overwrite=False)
        io.rot(G.chunk_index(0, 0))
        buf, res = await decode_with_bad_fragment(io)
        before = STATS.repaired_fragments_total
        assert await es.repair_fragments(io, STATS, 0, buf, res) == [0]  # type: ignore[arg-type]
        assert STATS.repaired_fragments_total == before + 1
        got = await es.resolve(io, CODEC, STATS, 0, bytearray(es.stripe_buffer_bytes(G)),  # type: ignore[arg-type]
                               repair=False, full=True)
        assert got is not None and got.bad == [] and got.version == res.version
        assert await healthy_read(io) == b"1" * SB

    asyncio.run(main())


def test_a_fragment_on_a_down_chain_is_not_rewritten_and_the_others_are() -> None:
    """Review (session 14): a from-shadow repair stopped at the first fragment whose server
    did not answer; now a fragment on a chain known down is skipped and the rest repaired."""
    async def main() -> None:
        io = VersionedIO()
        await write_full(io, b"1", overwrite=False)
        for j in (0, 1):
            io.rot(G.chunk_index(0, j))
        buf = bytearray(es.stripe_buffer_bytes(G))
        res = await es.resolve(io, CODEC, STATS, 0, buf, repair=False, full=True)  # type: ignore[arg-type]
        assert res is not None and res.bad == [0, 1]
        io.down_chunks.add(G.chunk_index(0, 0))
        assert await es.repair_fragments(io, STATS, 0, buf, res) == [1]  # type: ignore[arg-type]

    asyncio.run(main())


def test_an_overwrite_on_a_spare_swapped_in_is_kept() -> None:
    """Review (session 14): chunk versions are per target, and a spare swapped in for a dead
    fragment server starts afresh: a writer's fragment there can have a version below the one
    the decode read on the old server, so a fence on that version let the old stripe in. The
    repair looks at the fragment's content again: changed since the decode, left alone."""
    async def main() -> None:
        io = VersionedIO()
        await write_full(io, b"1", overwrite=False)
        for _ in range(5):  # fragment 0's old server: a few versions in
            data, ver = io.chunks[G.chunk_index(0, 0)]
            io.chunks[G.chunk_index(0, 0)] = (data, ver + 1)
        io.rot(G.chunk_index(0, 0))
        buf, res = await decode_with_bad_fragment(io)
        await write_full(io, b"2", overwrite=True)  # lands fragment 0 on the spare...
        data, _ = io.chunks[G.chunk_index(0, 0)]
        io.chunks[G.chunk_index(0, 0)] = (data, 1)  # ...whose versions start at 1
        assert await es.repair_fragments(io, STATS, 0, buf, res) == []  # type: ignore[arg-type]
        assert await healthy_read(io) == b"2" * SB

    asyncio.run(main())
