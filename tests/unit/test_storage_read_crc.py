"""A big partial chunk read (storage/reads.py) carries its payload CRC, computed off the event
loop, so the frame encoder does not hash it on the loop; small partial reads leave it to the
encoder; whole-chunk reads send the stored CRC. Handlers called directly (no sockets)."""

from __future__ import annotations

import os

import crc32c
from test_storage_tenant_check import SHARED, Node, _ctx, _run

from loomfs.common.identity import SERVICE
from loomfs.net.rpc import Reply
from loomfs.storage.reads import CRC_OFF_LOOP_BYTES
from loomfs.wire.storage import ChunkId, ReadReq, WriteReq

CHUNK = 4 << 20


def test_partial_read_crcs() -> None:
    data = os.urandom(CHUNK)

    async def body(n: Node) -> None:
        req = WriteReq(chain_id=1, chain_version=1, chunk=ChunkId(inode=SHARED), length=len(data),
                       chunk_size=CHUNK, data_crc=crc32c.crc32c(data))
        await n.svc.write(req, _ctx(SERVICE, data))
        for offset, length, computed in ((4096, 2 << 20, True), (4096, CRC_OFF_LOOP_BYTES - 1, False),
                                         (0, CHUNK, True)):
            rsp = await n.svc.read(ReadReq(chain_id=1, chain_version=1, chunk=ChunkId(inode=SHARED), offset=offset,
                                           length=length, target_id=n.svc.targets[next(iter(n.svc.targets))].target_id),
                                   _ctx(SERVICE))
            assert isinstance(rsp, Reply) and rsp.payload is not None and rsp.on_sent is not None
            got = bytes(rsp.payload)
            assert got == data[offset:offset + length]
            if computed:
                assert rsp.payload_crc == crc32c.crc32c(got)
            else:
                assert rsp.payload_crc is None  # the encoder hashes it (small: not worth a thread hop)
            rsp.on_sent()

    _run(body)
