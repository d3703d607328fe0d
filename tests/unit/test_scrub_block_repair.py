"""The scrubber's block-level repair (storage/blockrepair.py): rot in a whole block that an
append carried into a version only one replica holds is rebuilt from the other members' copies
of an *older* version, block by block, each block checked against the CRC the rotten replica
stored for it. Three real StorageService instances over the simulated network on virtual time
(no sockets, no sleeps); 128 KiB chunks, so two 64 KiB blocks."""

from __future__ import annotations

from test_replication_defects import KEY, Chain3, run

from loomfs.storage.blockrepair import bad_block_indexes, patch_blocks
from loomfs.storage.engine.types import BLOCK_BYTES
from loomfs.storage.scrub import Scrubber

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
