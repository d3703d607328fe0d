"""Where ``StorageClient.read_chunk_crc`` sends a chunk's reads: always the same replica for a
chunk (its page cache keeps it hot), the chunks of one file on one chain taking the replicas in
turn, and chunks next to each other on different chains (one row of the stripe: the two 16 MiB
segment chunks of a KV get of 16 x 2 MiB values) at different replica positions, so chains
that list their replicas in the same node order do not have one node serve the whole row."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from loomfs.client import storage_client as sc
from loomfs.client.storage_client import StorageClient
from loomfs.net.rpc_client import Response
from loomfs.wire.storage import ReadRsp
from loomfs.wire.types import Layout


def _prefers(stripe: int, indexes: range, inode: int = 77) -> list[int]:
    client = StorageClient.__new__(StorageClient)
    seen: list[int] = []

    async def read_grant(inode: int) -> bytes:
        return b""

    async def call_chain(chain_id: int, role: str, m: Any, make: Any, *, recv_into: Any = None,
                         prefer: int | None = None, **kw: Any) -> Response[ReadRsp]:
        assert prefer is not None
        seen.append(prefer)
        return Response(ReadRsp(length=0, exists=False), memoryview(b""))

    fake = cast(Any, client)
    fake.read_grant = read_grant
    fake._call_chain = call_chain
    fake.read_grants = None
    layout = Layout(chunk_size=1 << 20, chains=list(range(1, stripe + 1)))

    async def reads() -> None:
        for i in indexes:
            await client.read_chunk_crc(layout, inode, i, 0, 16, memoryview(bytearray(16)))

    asyncio.run(reads())
    return seen


def test_a_row_of_chunks_reads_from_different_positions() -> None:
    replicas = 3
    for stripe in (2, 3, 4):
        prefers = _prefers(stripe, range(4 * stripe))
        for row in range(4):
            positions = [p % replicas for p in prefers[row * stripe : (row + 1) * stripe]]
            assert len(set(positions)) == min(stripe, replicas), (stripe, row, positions)


def test_one_chain_s_chunks_take_the_replicas_in_turn_and_a_chunk_keeps_its_replica() -> None:
    replicas, stripe = 3, 2
    prefers = _prefers(stripe, range(12))
    for chain in range(stripe):
        own = [prefers[i] % replicas for i in range(chain, 12, stripe)]
        assert sorted(set(own)) == [0, 1, 2]
        assert own[:3] == own[3:6]  # every third chunk of the chain: the same replica again
    assert prefers == _prefers(stripe, range(12))  # every client, every time: the same replicas


def test_single_chain_files_read_as_before() -> None:
    assert _prefers(1, range(6)) == [sc.replica_pick(77, i, 1) for i in range(6)]
