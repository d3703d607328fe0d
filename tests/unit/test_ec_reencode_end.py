"""The re-encode of a truncated EC file's last stripe (``ec_file.reencode_end``, run by meta's
trimmer) over the in-memory versioned fragment store of test_ec_repair_race (no sockets)."""

from __future__ import annotations

import asyncio

import pytest
from test_ec_repair_race import CS, SB, VersionedIO, healthy_read, write_full

from loomfs.client import ec_stripe as es
from loomfs.client.ec_file import reencode_end
from loomfs.ec.stripe import Geometry

G = Geometry(4, 2, CS)


def test_the_bytes_past_the_cut_read_zeros_after_the_reencode() -> None:
    async def main() -> None:
        io = VersionedIO()
        await write_full(io, b"1", overwrite=False)
        await reencode_end(io, 100)  # type: ignore[arg-type]
        got = await healthy_read(io)
        assert got[:100] == b"1" * 100 and got[100:] == bytes(SB - 100)
        shadow = [io.chunks.get(G.chunk_index(0, j, shadow=True), (b"", 0))[0] for j in range(G.width)]
        assert all(c == b"" for c in shadow)  # staged through the shadow, emptied after

    asyncio.run(main())


def test_a_stripe_lost_for_good_is_left_as_it_is() -> None:
    """Review (session 14): a truncate into a stripe with fewer than k good fragments (every
    fragment answered) failed its trim for ever, and every later write open of the file with
    it; it now leaves the stripe as it is (EIO to read, as before)."""
    async def main() -> None:
        io = VersionedIO()
        await write_full(io, b"1", overwrite=False)
        for j in range(G.m + 1):
            io.rot(G.chunk_index(0, j))
        before = dict(io.chunks)
        await reencode_end(io, 100)  # type: ignore[arg-type]
        assert io.chunks == before

    asyncio.run(main())


def test_fragments_unreachable_now_fail_the_reencode_to_be_retried() -> None:
    async def main() -> None:
        io = VersionedIO()
        await write_full(io, b"1", overwrite=False)
        for j in range(G.m + 1):
            io.down_chunks.add(G.chunk_index(0, j))
        real_read = io.read

        async def read(index: int, offset: int, length: int, into: memoryview, **kw: object) -> int | None:
            if index in io.down_chunks:
                raise es.FragmentUnavailable("down")
            return await real_read(index, offset, length, into, **kw)  # type: ignore[arg-type]

        io.read = read  # type: ignore[method-assign]
        with pytest.raises(es.LoomError) as err:
            await reencode_end(io, 100)  # type: ignore[arg-type]
        assert not isinstance(err.value, es.StripeLost)

    asyncio.run(main())


def test_a_stripe_whose_shadow_did_not_answer_is_not_lost() -> None:
    """Review (session 14): an overwrite cut short left 3 new and 3 old fragments in place
    (4+2) and the new version whole in the shadow; with shadow reads timing out, the stripe
    was called lost for good and the re-encode dropped, so once the shadow answered again the
    old bytes past the cut came back. Lost needs every fragment to answer, shadow included."""
    async def main() -> None:
        io = VersionedIO()
        await write_full(io, b"2", overwrite=False)
        new = dict(io.chunks)
        io.chunks.clear()
        await write_full(io, b"1", overwrite=False)
        for j in range(G.width):
            io.chunks[G.chunk_index(0, j, shadow=True)] = new[G.chunk_index(0, j)]
        for j in (0, 1, 2):
            io.chunks[G.chunk_index(0, j)] = new[G.chunk_index(0, j)]
        shadow_down = {G.chunk_index(0, j, shadow=True) for j in (3, 4, 5)}
        real_read = io.read

        async def read(index: int, offset: int, length: int, into: memoryview) -> int | None:
            if index in shadow_down:
                raise es.FragmentUnavailable("timeout")
            return await real_read(index, offset, length, into)

        io.read = read  # type: ignore[method-assign]
        with pytest.raises(es.LoomError) as err:
            await reencode_end(io, 100)  # type: ignore[arg-type]
        assert not isinstance(err.value, es.StripeLost)  # the trim stays, to be retried
        shadow_down.clear()
        await reencode_end(io, 100)  # type: ignore[arg-type]
        got = await healthy_read(io)
        assert got[:100] == b"2" * 100 and got[100:] == bytes(SB - 100)

    asyncio.run(main())
