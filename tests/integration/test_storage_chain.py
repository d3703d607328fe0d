"""Three StorageService instances in one process, chained over real RPC on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import crc32c
import pytest

from loomfs.errors import LoomError
from loomfs.net.rpc import RetryPolicy, RpcClient, RpcServer
from loomfs.net.tcp import TcpTransport
from loomfs.net.transport import Address
from loomfs.storage.engine.file import FileEngine
from loomfs.storage.engine.types import ChunkKey
from loomfs.storage.service import StorageService
from loomfs.storage.target import StorageTarget, target_id_for
from loomfs.testing.routing import StaticRouting
from loomfs.wire.status import Status
from loomfs.wire.storage import (
    QUERY_CHUNKS,
    READ,
    REMOVE_CHUNKS,
    TRUNCATE,
    WRITE,
    ChunkId,
    QueryChunksReq,
    ReadReq,
    RemoveChunksReq,
    RequestTag,
    TruncateReq,
    WriteReq,
)
from loomfs.wire.types import ChainInfo, NodeInfo, NodeKind, RoutingInfo, TargetInfo

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

CHUNK_SIZE = 1 << 20
CHUNK = ChunkId(inode=42, index=3)
KEY = ChunkKey(42, 3)


@dataclass
class Node:
    node_id: int
    server: RpcServer
    service: StorageService
    target: StorageTarget
    address: Address


class Cluster:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.routing = StaticRouting(RoutingInfo())
        self.nodes: list[Node] = []
        self.client = RpcClient(TcpTransport(), call_timeout_s=10.0)
        self.forwarder = RpcClient(TcpTransport(), retry=RetryPolicy(attempts_max=2, backoff_initial_s=0.01))

    async def start(self, n: int = 3) -> None:
        for node_id in range(1, n + 1):
            tid = target_id_for(node_id, 0)
            target = StorageTarget(tid, FileEngine(self.tmp / f"n{node_id}"), str(self.tmp / f"n{node_id}"))
            service = StorageService([target], self.routing, self.forwarder, max_chunk_size_bytes=4 << 20,
                                     reconfig_wait_s=0.1)
            server = RpcServer(f"storage{node_id}", TcpTransport())
            server.add_service(service)
            addr = await server.start(Address("127.0.0.1", 0))
            self.nodes.append(Node(node_id, server, service, target, addr))
        self.set_chain([n.target.target_id for n in self.nodes], version=1)

    def set_chain(self, targets: list[int], version: int) -> None:
        self.routing.set(
            RoutingInfo(
                version=version,
                nodes=[NodeInfo(node_id=n.node_id, kind=NodeKind.STORAGE, host=n.address.host, port=n.address.port)
                       for n in self.nodes],
                targets=[TargetInfo(target_id=n.target.target_id, node_id=n.node_id, chain_id=1) for n in self.nodes],
                chains=[ChainInfo(chain_id=1, version=version, targets=targets)],
            )
        )

    async def stop(self) -> None:
        await self.client.close()
        await self.forwarder.close()
        for n in self.nodes:
            await n.server.close()
            n.target.engine.close()

    async def write(self, node: int, data: bytes, offset: int = 0, *, version: int = 1,
                    tag: RequestTag | None = None, crc: int | None = None):  # type: ignore[no-untyped-def]
        req = WriteReq(chain_id=1, chain_version=version, chunk=CHUNK, offset=offset, length=len(data),
                       chunk_size=CHUNK_SIZE, data_crc=crc32c.crc32c(data) if crc is None else crc, tag=tag)
        return (await self.client.call(self.nodes[node].address, WRITE, req, payload=data, retry=False)).body

    async def read(self, node: int, offset: int = 0, length: int = CHUNK_SIZE, version: int = 1) -> tuple[bytes, int, bool]:
        req = ReadReq(chain_id=1, chain_version=version, chunk=CHUNK, offset=offset, length=length,
                      target_id=self.nodes[node].target.target_id)
        buf = bytearray(length)
        rsp = await self.client.call(self.nodes[node].address, READ, req, recv_into=memoryview(buf), retry=False)
        return bytes(rsp.payload), rsp.body.commit_ver, rsp.body.exists

    async def all_replicas(self) -> list[bytes]:
        return [(await self.read(i))[0] for i in range(len(self.nodes))]


def with_cluster(fn: Callable[[Cluster], Awaitable[None]], tmp: Path) -> None:
    async def main() -> None:
        c = Cluster(tmp)
        await c.start()
        try:
            await fn(c)
        finally:
            await c.stop()

    asyncio.run(main())


async def expect_status(status: Status, coro: Awaitable[object]) -> None:
    with pytest.raises(LoomError) as ei:
        await coro
    assert ei.value.status is status, ei.value


def test_write_read_overwrite_truncate_remove(tmp_path: Path) -> None:
    async def body(c: Cluster) -> None:
        data = os.urandom(CHUNK_SIZE)
        rsp = await c.write(0, data)
        assert (rsp.commit_ver, rsp.chunk_length, rsp.chunk_crc) == (1, CHUNK_SIZE, crc32c.crc32c(data))
        assert await c.all_replicas() == [data] * 3
        # partial read, short read at the end, missing chunk
        assert (await c.read(1, offset=100, length=50))[0] == data[100:150]
        assert (await c.read(2, offset=CHUNK_SIZE - 10, length=100))[0] == data[-10:]
        missing = ReadReq(chain_id=1, chain_version=1, chunk=ChunkId(inode=42, index=99), length=10)
        r = await c.client.call(c.nodes[2].address, READ, missing)
        assert (r.body.exists, r.body.length, len(r.payload)) == (False, 0, 0)
        # overwrite mid-chunk
        patch = b"P" * 4096
        rsp = await c.write(0, patch, offset=5000)
        expect = data[:5000] + patch + data[5000 + 4096 :]
        assert rsp.commit_ver == 2 and rsp.chunk_crc == crc32c.crc32c(expect)
        assert await c.all_replicas() == [expect] * 3
        # truncate through the chain
        t = TruncateReq(chain_id=1, chain_version=1, chunk=CHUNK, length=1000, chunk_size=CHUNK_SIZE)
        trsp = (await c.client.call(c.nodes[0].address, TRUNCATE, t)).body
        assert (trsp.commit_ver, trsp.chunk_length) == (3, 1000)
        assert await c.all_replicas() == [expect[:1000]] * 3
        # every replica's metadata agrees
        for n in c.nodes:
            q = (await c.client.call(n.address, QUERY_CHUNKS, QueryChunksReq(target_id=n.target.target_id))).body
            assert [(m.chunk.index, m.commit_ver, m.length, m.update_ver) for m in q.chunks] == [(3, 3, 1000, 0)]
        # remove
        rm = RemoveChunksReq(chain_id=1, chain_version=1, inode=42)
        assert (await c.client.call(c.nodes[0].address, REMOVE_CHUNKS, rm)).body.removed == 1
        for i in range(3):
            assert (await c.read(i)) == (b"", 0, False)
        assert c.nodes[2].target.engine.get(KEY) is None

    with_cluster(body, tmp_path)


def test_duplicate_tag_applied_once(tmp_path: Path) -> None:
    async def body(c: Cluster) -> None:
        tag = RequestTag(client_id=7, request_id=1)
        first = await c.write(0, b"a" * 100, tag=tag)
        again = await c.write(0, b"a" * 100, tag=tag)
        assert first == again and first.commit_ver == 1
        # concurrent copies of one new request: one application, same answer for all
        tag2 = RequestTag(client_id=7, request_id=2)
        rsps = await asyncio.gather(*(c.write(0, b"b" * 10, offset=100, tag=tag2) for _ in range(4)))
        assert {r.commit_ver for r in rsps} == {2}
        assert (await c.read(2))[1] == 2
        assert c.nodes[0].service.tags.hits >= 4

    with_cluster(body, tmp_path)


def test_routing_and_role_errors(tmp_path: Path) -> None:
    async def body(c: Cluster) -> None:
        await c.write(0, b"x" * 10)
        await expect_status(Status.STALE_CHAIN_VERSION, c.write(0, b"y", version=0))
        await expect_status(Status.STALE_CHAIN_VERSION, c.read(1, version=0))
        await expect_status(Status.NOT_HEAD, c.write(1, b"y"))
        await expect_status(Status.NOT_HEAD, c.write(2, b"y"))
        await expect_status(Status.CHECKSUM_MISMATCH, c.write(0, b"y", crc=123))
        await expect_status(Status.EINVAL, c.write(0, b"y", offset=CHUNK_SIZE))
        big = WriteReq(chain_id=1, chain_version=1, chunk=CHUNK, length=1, chunk_size=64 << 20, data_crc=crc32c.crc32c(b"y"))
        await expect_status(Status.EINVAL, c.client.call(c.nodes[0].address, WRITE, big, payload=b"y", retry=False))
        # nothing above changed the chunk
        assert await c.all_replicas() == [b"x" * 10] * 3

    with_cluster(body, tmp_path)


def test_not_committed_read_and_recovery(tmp_path: Path) -> None:
    async def body(c: Cluster) -> None:
        await c.write(0, b"old" * 10)
        middle = c.nodes[1].target.engine
        middle.stage_write(KEY, 2, 0, b"NEW")  # as if a forward were in flight
        await expect_status(Status.NOT_COMMITTED, c.read(1))
        assert (await c.read(2))[0] == b"old" * 10  # the tail answers with the committed data
        assert (await c.read(0))[0] == b"old" * 10  # the head has nothing pending
        rsp = await c.write(0, b"new", offset=30)  # the head's v2 replaces the middle's pending v2
        assert rsp.commit_ver == 2
        assert await c.all_replicas() == [b"old" * 10 + b"new"] * 3

    with_cluster(body, tmp_path)


def test_successor_down_then_chain_shrinks_and_reforwards(tmp_path: Path) -> None:
    async def body(c: Cluster) -> None:
        await c.write(0, b"1" * 100)
        await c.nodes[2].server.close()  # the tail dies
        await expect_status(Status.CHAIN_UNAVAILABLE, c.write(0, b"2" * 100, offset=100))
        head = c.nodes[0].target.engine.get(KEY)
        assert head is not None and (head.commit_ver, head.pending_ver) == (1, 2)
        await expect_status(Status.NOT_COMMITTED, c.read(0))
        # mgmtd drops the tail: chain v2 = [head, middle]; the next write pushes v2 first
        c.set_chain([c.nodes[0].target.target_id, c.nodes[1].target.target_id], version=2)
        rsp = await c.write(0, b"3" * 100, offset=200, version=2)
        assert rsp.commit_ver == 3
        want = b"1" * 100 + b"2" * 100 + b"3" * 100
        assert [(await c.read(i, version=2))[0] for i in (0, 1)] == [want, want]
        assert c.nodes[0].service.reforwards_total == 1

    with_cluster(body, tmp_path)
