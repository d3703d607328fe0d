"""The scrubber's block-level repair (storage/blockrepair.py): rot in a whole block that an
append carried into a version only one replica holds is rebuilt from the other members' copies
of an *older* version, block by block, each block checked against the CRC the rotten replica
stored for it. Three real StorageService instances over the simulated network on virtual time
(no sockets, no sleeps); 128 KiB chunks, so two 64 KiB blocks."""

from __future__ import annotations

from typing import Any

import crc32c
import pytest
from test_replication_defects import CHUNK, KEY, Chain3, run

from loomfs.errors import LoomError
from loomfs.storage.blockrepair import bad_block_indexes, patch_blocks
from loomfs.storage.engine.types import BLOCK_BYTES
from loomfs.storage.scrub import Scrubber
from loomfs.wire.storage import READ, ReadReq

OLD = bytes(range(256)) * 400  # 100 KiB: block 0 whole, block 1 short
APPENDED = b"a" * 20_000


async def _rot_carried_into_a_version_only_the_head_has(c: Chain3) -> tuple[bytes, Scrubber]:
    """v1 on all three; then the head serves alone (2 and 3 waiting: they keep v1), block 0 of
    its copy rots, and an append (which reads only the short last block) makes v2 on top of it."""
    await c.write(1, 0, OLD)
    c.set_chain([1], version=2, waiting=(2, 3))
    c.engine(1).corrupt(KEY, 1_000)
    await c.write(1, len(OLD), APPENDED)
    st = c.engine(1).get(KEY)
    assert st is not None and st.commit_ver == 2
    assert c.engine(1).verify(KEY) == [0]  # the rot was carried, its CRC was not blessed
    assert c.engine(2).get(KEY).commit_ver == 1  # type: ignore[union-attr]
    return OLD + APPENDED, Scrubber(c.nodes[0].service, bytes_per_s=0, interval_s=3600)


def test_rotten_block_rebuilt_from_an_older_version_on_a_waiting_member() -> None:
    async def body(c: Chain3) -> None:
        want, scrub = await _rot_carried_into_a_version_only_the_head_has(c)
        good, _ = await scrub.check_chunk(c.nodes[0].target, KEY)
        assert not good and scrub.repaired == 1
        st = c.engine(1).get(KEY)
        assert st is not None and st.commit_ver == 2 and c.content(1) == want
        assert c.engine(1).verify(KEY) == []
        assert (await scrub.check_chunk(c.nodes[0].target, KEY))[0]  # the next pass finds it good
        assert c.content(2) == OLD  # the source is untouched
        stats = scrub.target_stats(c.tid(1))  # `loomfs admin targets` and /metrics
        assert (stats.bad, stats.repaired, stats.rebuilt) == (1, 1, 1)

    run(body)


def test_a_block_rotten_on_one_source_is_taken_from_the_next() -> None:
    async def body(c: Chain3) -> None:
        want, scrub = await _rot_carried_into_a_version_only_the_head_has(c)
        c.engine(3).corrupt(KEY, 2_000)  # the first member asked (the chain's end) is rotten there too
        c.engine(2).corrupt(KEY, 70_000)  # rot elsewhere (block 1) does not spoil its block 0
        assert (await scrub.check_chunk(c.nodes[0].target, KEY)) == (False, len(want))
        assert scrub.repaired == 1 and c.content(1) == want and c.engine(1).verify(KEY) == []

    run(body)


def test_no_intact_block_anywhere_leaves_the_chunk_as_it_is() -> None:
    async def body(c: Chain3) -> None:
        want, scrub = await _rot_carried_into_a_version_only_the_head_has(c)
        c.engine(2).corrupt(KEY, 1_001)
        c.engine(3).corrupt(KEY, 1_002)
        assert (await scrub.check_chunk(c.nodes[0].target, KEY))[0] is False
        assert scrub.repaired == 0
        st = c.engine(1).get(KEY)
        assert st is not None and st.commit_ver == 2 and c.engine(1).verify(KEY) == [0]  # nothing installed
        assert c.content(1) != want and c.content(1)[BLOCK_BYTES:] == want[BLOCK_BYTES:]

    run(body)


def test_a_pending_version_carrying_the_rot_is_patched_and_kept() -> None:
    """A pending v3 staged on the rotten v2 carries block 0's rot; the repair takes its block 0
    from the repaired v2 (it matches v3's stored block CRC) instead of dropping v3, which may be
    the only copy of a version the old tail committed and served."""

    async def body(c: Chain3) -> None:
        want, scrub = await _rot_carried_into_a_version_only_the_head_has(c)
        c.engine(1).stage_write(KEY, 3, len(want), b"p" * 100)
        assert (await scrub.check_chunk(c.nodes[0].target, KEY))[0] is False
        assert scrub.repaired == 1
        st = c.engine(1).get(KEY)
        assert st is not None and (st.commit_ver, st.pending_ver) == (2, 3)
        buf = bytearray(st.pending_length)
        c.engine(1).read(KEY, 0, memoryview(buf), pending=True)
        assert bytes(buf) == want + b"p" * 100
        await c.engine(1).commit(KEY, 3)
        assert c.engine(1).verify(KEY) == []

    run(body)


def test_block_helpers() -> None:
    data = bytearray(OLD)
    stored = [0, 0]
    from loomfs.storage.engine.blocks import block_crcs_of, unpack_blocks

    stored = unpack_blocks(block_crcs_of(OLD))
    assert bad_block_indexes(data, stored) == []
    data[5] ^= 1
    data[BLOCK_BYTES + 5] ^= 1
    assert bad_block_indexes(data, stored) == [0, 1]
    assert bad_block_indexes(data[:BLOCK_BYTES], stored) == [0, 1]  # a missing block is bad
    source = bytearray(OLD)
    source[BLOCK_BYTES + 6] ^= 1  # the source's block 1 is rotten: only block 0 is taken
    assert patch_blocks(data, len(data), [0, 1], stored, source) == [1]
    assert data[:BLOCK_BYTES] == OLD[:BLOCK_BYTES]
    assert patch_blocks(data, len(data), [1], stored, OLD[:BLOCK_BYTES]) == [1]  # too short to cover it
    assert patch_blocks(data, len(data), [1], stored, OLD) == [] and data == OLD


def test_a_commit_while_blocks_are_fetched_is_not_overwritten() -> None:
    """The rebuild fetches without the chunk lock; a write that commits v3 meanwhile wins (the
    install re-checks the chunk under the lock) and the next pass deals with v3."""

    async def body(c: Chain3) -> None:
        want, scrub = await _rot_carried_into_a_version_only_the_head_has(c)
        svc = c.nodes[0].service
        orig = svc.rpc.call
        wrote: list[int] = []

        async def call(addr: Any, method: Any, req: Any, **kw: Any) -> Any:
            if method is READ and req.exact_ver and req.length < len(want) and not wrote:
                wrote.append(1)
                await c.write(1, len(want), b"z" * 10)  # v3 commits while a block is fetched
            return await orig(addr, method, req, **kw)

        svc.rpc.call = call  # type: ignore[method-assign]
        assert (await scrub.check_chunk(c.nodes[0].target, KEY))[0] is False
        assert wrote and scrub.repaired == 0
        st = c.engine(1).get(KEY)
        assert st is not None and st.commit_ver == 3 and c.engine(1).verify(KEY) == [0]

    run(body)


def test_a_block_is_taken_from_an_out_of_service_members_pending_version() -> None:
    async def body(c: Chain3) -> None:
        want, scrub = await _rot_carried_into_a_version_only_the_head_has(c)
        c.engine(3).corrupt(KEY, 3_000)
        c.engine(2).corrupt(KEY, 3_001)  # both committed copies rotten in block 0 ...
        c.engine(2).stage_write(KEY, 9, 0, OLD, full_replace=True, data_crc=crc32c.crc32c(OLD))  # ... a pending one not
        assert (await scrub.check_chunk(c.nodes[0].target, KEY))[0] is False
        assert scrub.repaired == 1 and c.content(1) == want and c.engine(1).verify(KEY) == []

    run(body)


def test_an_unreachable_member_is_asked_once() -> None:
    """A member whose block read times out is left out of the rebuild after that first failure
    (not asked again per block and version: each wait is a fetch timeout); the next one is."""

    async def body(c: Chain3) -> None:
        want, scrub = await _rot_carried_into_a_version_only_the_head_has(c)
        c.engine(3).stage_write(KEY, 9, 0, OLD, full_replace=True, data_crc=crc32c.crc32c(OLD))  # two versions there
        svc = c.nodes[0].service
        orig = svc.rpc.call
        block_reads: list[int] = []

        async def call(addr: Any, method: Any, req: Any, **kw: Any) -> Any:
            if method is READ and req.target_id == c.tid(3) and req.exact_ver and req.length < len(want):
                block_reads.append(req.exact_ver)
                raise TimeoutError("no answer")
            return await orig(addr, method, req, **kw)

        svc.rpc.call = call  # type: ignore[method-assign]
        c.engine(2).corrupt(KEY, 70_000)  # node 2: only its block 0 helps
        assert (await scrub.check_chunk(c.nodes[0].target, KEY))[0] is False
        assert scrub.repaired == 1 and c.content(1) == want
        assert block_reads == [1]  # node 3 (asked first: the chain's end): its v1, not its v9 after

    run(body)


def test_repair_reads_of_ranges() -> None:
    """``ReadReq.exact_ver`` with a length: that range of the version; a rotten block in it fails
    alone; a whole rotten version is refused by its stored CRC; a serving member's pending
    version is never handed out."""

    async def body(c: Chain3) -> None:
        await c.write(1, 0, OLD)
        st = c.engine(2).get(KEY)
        assert st is not None

        async def rd(off: int, length: int, node: int = 2, ver: int = 0) -> bytes:
            req = ReadReq(chain_id=1, chain_version=c.version, chunk=CHUNK, offset=off, length=length,
                          target_id=c.tid(node), exact_ver=ver or st.commit_ver)
            return bytes((await c.client.call(c.nodes[node - 1].address, READ, req)).payload)

        assert await rd(BLOCK_BYTES, BLOCK_BYTES) == OLD[BLOCK_BYTES:]  # the last, short block
        assert await rd(len(OLD) + 5, 10) == b""
        assert await rd(0, 0) == OLD
        c.engine(2).corrupt(KEY, BLOCK_BYTES + 3)
        with pytest.raises(LoomError):
            await rd(BLOCK_BYTES, 100)
        assert await rd(0, BLOCK_BYTES) == OLD[:BLOCK_BYTES]
        with pytest.raises(LoomError):
            await rd(0, 0)
        c.engine(3).stage_write(KEY, 7, 0, b"q" * 10)
        with pytest.raises(LoomError):
            await rd(0, 5, node=3, ver=7)

    run(body)
