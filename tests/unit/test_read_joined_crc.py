"""A read of whole blocks of a chunk (not the whole chunk) is checked block by block against the
stored block CRCs by the engine, and its reply carries those CRCs joined: storage does not hash
the bytes a second time. Three real StorageServices over the simulated network, virtual time."""

from __future__ import annotations

import os

import crc32c
import pytest
from test_replication_defects import CHUNK, KEY, Chain3, run

from loomfs.errors import LoomError
from loomfs.storage.engine.types import BLOCK_BYTES
from loomfs.storage.reads import aligned_blocks
from loomfs.wire.status import Status
from loomfs.wire.storage import READ, WRITE, ReadReq, RequestTag, WriteReq

CHUNK_BYTES = 4 * BLOCK_BYTES


def test_aligned_blocks() -> None:
    assert aligned_blocks(0, BLOCK_BYTES) == (0, 1)
    assert aligned_blocks(BLOCK_BYTES, 2 * BLOCK_BYTES) == (1, 3)
    assert aligned_blocks(1, BLOCK_BYTES) is None and aligned_blocks(0, BLOCK_BYTES + 1) is None
    assert aligned_blocks(0, 0) is None


def test_aligned_part_reply_crc_is_the_stored_block_crcs_joined() -> None:
    data = os.urandom(CHUNK_BYTES)

    async def body(c: Chain3) -> None:
        crc = crc32c.crc32c(data)
        req = WriteReq(chain_id=1, chain_version=c.version, chunk=CHUNK, offset=0, length=len(data),
                       chunk_size=CHUNK_BYTES, data_crc=crc, tag=RequestTag(client_id=1, request_id=1))
        await c.client.call(c.nodes[0].address, WRITE, req, payload=memoryview(data), payload_crc=crc)
        node = c.nodes[1]

        async def read(offset: int, length: int) -> tuple[bytes, int]:
            r = ReadReq(chain_id=1, chain_version=c.version, chunk=CHUNK, offset=offset, length=length,
                        target_id=node.target.target_id)
            rsp = await c.client.call(node.address, READ, r)
            return bytes(rsp.payload), rsp.payload_crc

        got, wire_crc = await read(BLOCK_BYTES, 2 * BLOCK_BYTES)
        part = data[BLOCK_BYTES : 3 * BLOCK_BYTES]
        assert got == part and wire_crc == crc32c.crc32c(part)
        assert node.service.joined_crc_reads_total == 1
        got, wire_crc = await read(100, BLOCK_BYTES)  # not whole blocks: hashed as before
        assert got == data[100 : 100 + BLOCK_BYTES] and wire_crc == crc32c.crc32c(got)
        assert node.service.joined_crc_reads_total == 1
        # a rotten block inside an aligned part: the engine's check refuses it (nothing joined)
        c.engine(2).corrupt(KEY, 2 * BLOCK_BYTES + 5)
        with pytest.raises(LoomError) as err:
            await read(BLOCK_BYTES, 2 * BLOCK_BYTES)
        assert err.value.status is Status.CHECKSUM_MISMATCH
        assert node.service.joined_crc_reads_total == 1

    run(body)
