"""StorageClient replica choice and retries against a scripted RPC client and routing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import crc32c
import pytest

from loomfs.client.storage_client import StorageClient
from loomfs.common.routing import Routing
from loomfs.errors import ConnectionFailed, NotFound, TimedOut, from_status
from loomfs.net.rpc import Response
from loomfs.net.transport import Address
from loomfs.wire import storage as ws
from loomfs.wire.status import Status
from loomfs.wire.types import ChainInfo, NodeInfo, NodeKind, RoutingInfo, TargetInfo, TargetState

LAYOUT_CHAINS = [1, 2]


def routing_info(version: int, chain1: list[int], chain_version: int = 1) -> RoutingInfo:
    nodes = [NodeInfo(node_id=n, kind=NodeKind.STORAGE, host=f"10.0.0.{n}", port=9000) for n in (1, 2, 3)]
    targets = [TargetInfo(target_id=100 + n, node_id=n, state=TargetState.SERVING) for n in (1, 2, 3)]
    chains = [
        ChainInfo(chain_id=1, version=chain_version, targets=chain1),
        ChainInfo(chain_id=2, version=1, targets=[102, 103]),
    ]
    return RoutingInfo(version=version, nodes=nodes, targets=targets, chains=chains)


class FakeRouting:
    def __init__(self, infos: list[RoutingInfo]):
        self.infos = infos  # what successive refreshes return
        self.current = Routing(infos.pop(0))
        self.refreshes = 0

    async def get(self) -> Routing:
        return self.current

    async def refresh(self, min_version: int = 0) -> Routing:
        self.refreshes += 1
        if self.infos:
            self.current = Routing(self.infos.pop(0))
        return self.current


Handler = Callable[[Address, Any, Any, dict[str, Any]], Response[Any]]


class FakeRpc:
    def __init__(self, handler: Handler):
        self.handler = handler
        self.calls: list[tuple[Address, str, Any, dict[str, Any]]] = []

    async def call(self, address: Address, m: Any, req: Any, **kw: Any) -> Response[Any]:
        self.calls.append((address, m.name, req, kw))
        return self.handler(address, m, req, kw)


def make(handler: Handler, infos: list[RoutingInfo] | None = None) -> tuple[StorageClient, FakeRpc, FakeRouting]:
    rpc = FakeRpc(handler)
    routing = FakeRouting(infos or [routing_info(1, [101, 102, 103])])
    sc = StorageClient(rpc, routing, client_id=77, backoff_initial_s=0.0, call_timeout_s=5.0)  # type: ignore[arg-type]
    return sc, rpc, routing


def layout() -> Any:
    from loomfs.wire.types import Layout

    return Layout(chunk_size=1 << 20, chains=LAYOUT_CHAINS)


def test_read_lands_in_callers_buffer_and_short_chunks_zero_fill() -> None:
    def handler(addr: Address, m: Any, req: ws.ReadReq, kw: dict[str, Any]) -> Response[Any]:
        into: memoryview = kw["recv_into"]
        into[:4] = b"data"
        return Response(ws.ReadRsp(length=4, chunk_length=4 + req.offset), into[:4])

    sc, rpc, _ = make(handler)
    buf = bytearray(b"\xff" * 10)
    assert asyncio.run(sc.read_chunk(layout(), 9, 0, 3, 10, memoryview(buf))) == 4
    assert buf == b"data" + bytes(6)
    _, name, req, kw = rpc.calls[0]
    assert name == "read" and req.chunk == ws.ChunkId(inode=9, index=0) and req.offset == 3
    assert req.chain_id == 1 and req.chain_version == 1 and req.target_id in (101, 102, 103)


def test_missing_chunk_reads_zeros() -> None:
    sc, _, _ = make(lambda a, m, r, kw: Response(ws.ReadRsp(exists=False), memoryview(b"")))
    buf = bytearray(b"\xff" * 8)
    assert asyncio.run(sc.read_chunk(layout(), 9, 1, 0, 8, memoryview(buf))) == 0
    assert buf == bytes(8)


def test_reads_spread_over_replicas_one_replica_per_chunk() -> None:
    """Chunks spread over the replicas; every read of one chunk goes to the same replica (its
    page cache holds it), from any client."""
    sc, rpc, _ = make(lambda a, m, r, kw: Response(ws.ReadRsp(exists=False), memoryview(b"")))
    other, rpc2, _ = make(lambda a, m, r, kw: Response(ws.ReadRsp(exists=False), memoryview(b"")))

    async def many() -> None:
        for index in range(60):
            for _ in range(3):
                await sc.read_chunk(layout(), 9, index, 0, 4, memoryview(bytearray(4)))
            await other.read_chunk(layout(), 9, index, 0, 4, memoryview(bytearray(4)))

    asyncio.run(many())
    assert {c[0].host for c in rpc.calls} == {"10.0.0.1", "10.0.0.2", "10.0.0.3"}
    by_chunk: dict[int, set[str]] = {}
    for c in rpc.calls + rpc2.calls:
        by_chunk.setdefault(c[2].chunk.index, set()).add(c[0].host)
    assert len(by_chunk) == 60 and all(len(hosts) == 1 for hosts in by_chunk.values())
    counts = [sum(1 for hosts in by_chunk.values() if h in hosts) for h in ("10.0.0.1", "10.0.0.2", "10.0.0.3")]
    assert min(counts) >= 10, counts  # about 20 each


def test_not_committed_retries_at_the_tail() -> None:
    def handler(addr: Address, m: Any, req: ws.ReadReq, kw: dict[str, Any]) -> Response[Any]:
        if req.target_id != 103:
            raise from_status(Status.NOT_COMMITTED)
        return Response(ws.ReadRsp(exists=False), memoryview(b""))

    sc, rpc, routing = make(handler)
    sc._rng.seed(0)
    for _ in range(5):
        asyncio.run(sc.read_chunk(layout(), 9, 0, 0, 4, memoryview(bytearray(4))))
    assert rpc.calls[-1][2].target_id == 103
    assert routing.refreshes == 0
    assert all(c[2].target_id == 103 for i, c in enumerate(rpc.calls) if i and rpc.calls[i - 1][2].target_id != 103)


def test_write_goes_to_head_with_crc_and_a_fixed_tag_across_retries() -> None:
    seen: list[ws.WriteReq] = []

    def handler(addr: Address, m: Any, req: ws.WriteReq, kw: dict[str, Any]) -> Response[Any]:
        seen.append(req)
        if len(seen) == 1:
            raise from_status(Status.STALE_CHAIN_VERSION)
        if len(seen) == 2:
            raise ConnectionFailed("reset")
        return Response(ws.WriteRsp(commit_ver=1), memoryview(b""))

    infos = [routing_info(1, [101, 102, 103]), routing_info(2, [102, 103], chain_version=2), routing_info(3, [102, 103], chain_version=2)]
    sc, rpc, routing = make(handler, infos)
    data = memoryview(b"hello world")
    asyncio.run(sc.write_chunk(layout(), 9, 4, 100, data))
    assert len(seen) == 3 and routing.refreshes == 2
    assert {r.tag for r in seen} == {ws.RequestTag(client_id=77, request_id=1)}
    assert [c[0].host for c in rpc.calls] == ["10.0.0.1", "10.0.0.2", "10.0.0.2"]  # the new head
    assert [r.chain_version for r in seen] == [1, 2, 2]
    crc = crc32c.crc32c(b"hello world")
    assert seen[-1].data_crc == crc and rpc.calls[-1][3]["payload_crc"] == crc
    assert seen[-1].chunk == ws.ChunkId(inode=9, index=4) and seen[-1].length == 11
    # index 4 lives on chains[4 % 2] == chain 1; a new write gets a new tag
    asyncio.run(sc.write_chunk(layout(), 9, 4, 0, data))
    assert seen[-1].tag == ws.RequestTag(client_id=77, request_id=2)


def test_errno_statuses_are_not_retried() -> None:
    def handler(addr: Address, m: Any, req: Any, kw: dict[str, Any]) -> Response[Any]:
        raise from_status(Status.ENOENT)

    sc, rpc, _ = make(handler)
    with pytest.raises(NotFound):
        asyncio.run(sc.write_chunk(layout(), 9, 0, 0, memoryview(b"x")))
    assert len(rpc.calls) == 1


def test_gives_up_at_the_deadline() -> None:
    def handler(addr: Address, m: Any, req: Any, kw: dict[str, Any]) -> Response[Any]:
        raise from_status(Status.CHAIN_UNAVAILABLE)

    sc, rpc, _ = make(handler)
    sc.call_timeout_s = 0.05
    sc.backoff_initial_s = sc.backoff_max_s = 0.0
    with pytest.raises(TimedOut):
        asyncio.run(sc.truncate_chunk(layout(), 9, 0, 10))
    assert len(rpc.calls) > 1


def test_remove_file_chunks_hits_every_chain_head() -> None:
    sc, rpc, _ = make(lambda a, m, r, kw: Response(ws.RemoveChunksRsp(removed=1), memoryview(b"")))
    asyncio.run(sc.remove_file_chunks(9, layout(), 5 << 20))
    reqs = sorted((c[2].chain_id, c[0].host, c[2].index_begin) for c in rpc.calls)
    assert reqs == [(1, "10.0.0.1", 0), (2, "10.0.0.2", 0)]
    assert all(c[2].inode == 9 and c[2].index_end >= 5 for c in rpc.calls)


def test_fenced_trim_looks_again_when_a_chunk_was_written_meanwhile() -> None:
    versions = {0: 3}
    sent: list[list[int]] = []

    def handler(addr: Address, m: Any, req: Any, kw: dict[str, Any]) -> Response[Any]:
        if m.name == "query_chunks":
            metas = [ws.ChunkMeta(chunk=ws.ChunkId(inode=9, index=i), commit_ver=v, update_ver=v)
                     for i, v in versions.items() if req.index_begin <= i < req.index_end]
            return Response(ws.QueryChunksRsp(chunks=metas), memoryview(b""))
        assert req.fenced and req.keep_versions
        sent.append(list(req.expect_vers))
        if len(sent) == 1:
            versions[0] = 4  # a stale writer's bytes landed after the first look
            raise from_status(Status.VERSION_MISMATCH)
        return Response(ws.RemoveChunksRsp(removed=1), memoryview(b""))

    sc, _, _ = make(handler)
    asyncio.run(sc.remove_chunks(layout().__class__(chunk_size=1 << 20, chains=[1]), 9, 0, keep_versions=True,
                                 fenced=True))
    assert sent == [[0, 3], [0, 4]]


def test_gc_removals_are_one_request_per_chain_for_many_files() -> None:
    """Issue 15 item 20: GC sent one removal per chain per deleted file."""
    sc, rpc, _ = make(lambda a, m, r, kw: Response(ws.RemoveChunksRsp(removed=1), memoryview(b"")))
    files = [(100 + i, layout()) for i in range(50)]
    asyncio.run(sc.remove_files_chunks(files))
    assert sorted(c[2].chain_id for c in rpc.calls) == [1, 2]
    for c in rpc.calls:
        assert sorted([c[2].inode, *c[2].more_inodes]) == [100 + i for i in range(50)]
