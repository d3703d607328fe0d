"""/metrics scraped over HTTP and checked against the work done.

In-process: a real StorageService behind a real RpcServer on 127.0.0.1, a real RpcClient;
bytes written through WRITE RPCs must equal the bytes the endpoint counts. End to end: a
LocalCluster whose services advertise a metrics port (skips until the mains start them).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import crc32c
import pytest

from loomfs.metrics import (
    ClientCollector,
    StorageCollector,
    instrument_engines,
    start_service_metrics,
)
from loomfs.metrics.scrape import scrape
from loomfs.net.rpc import RpcClient, RpcServer
from loomfs.net.tcp import TcpTransport
from loomfs.net.transport import Address
from loomfs.storage.engine.memory import MemoryEngine
from loomfs.storage.service import StorageService
from loomfs.storage.target import StorageTarget
from loomfs.testing.routing import StaticRouting
from loomfs.wire.storage import READ, WRITE, ChunkId, ReadReq, WriteReq
from loomfs.wire.types import ChainInfo, NodeInfo, NodeKind, RoutingInfo, TargetInfo

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CHUNK_SIZE = 1 << 20


def test_bytes_written_equal_bytes_counted() -> None:
    async def go() -> None:
        target = StorageTarget(1001, MemoryEngine(), "/mem")
        routing = StaticRouting(RoutingInfo())
        fwd = RpcClient(TcpTransport())
        service = StorageService([target], routing, fwd)
        server = RpcServer("storage1", TcpTransport())
        server.add_service(service)
        addr = await server.start(Address("127.0.0.1", 0))
        routing.set(RoutingInfo(
            version=1, nodes=[NodeInfo(node_id=1, kind=NodeKind.STORAGE, host=addr.host, port=addr.port)],
            targets=[TargetInfo(target_id=1001, node_id=1, chain_id=1)],
            chains=[ChainInfo(chain_id=1, version=1, targets=[1001])],
        ))
        srv_metrics = await start_service_metrics("storage1", server, fwd, port=0,
                                                  collectors=[StorageCollector(service, 1)])
        instrument_engines([target], srv_metrics.registry)
        client = RpcClient(TcpTransport())
        cli_metrics = await start_service_metrics("client", None, client, port=0)
        try:
            sizes = [1, 4096, 65536, 300_000, CHUNK_SIZE]
            for i, n in enumerate(sizes):
                data = os.urandom(n)
                req = WriteReq(chain_id=1, chain_version=1, chunk=ChunkId(inode=9, index=i), length=n,
                               chunk_size=CHUNK_SIZE, data_crc=crc32c.crc32c(data))
                await client.call(addr, WRITE, req, payload=data)
            into = memoryview(bytearray(CHUNK_SIZE))
            await client.call(addr, READ, ReadReq(chain_id=1, chain_version=1, chunk=ChunkId(inode=9, index=4),
                                                  length=CHUNK_SIZE, target_id=1001), recv_into=into)
            s = await scrape("127.0.0.1", srv_metrics.port)
            c = await scrape("127.0.0.1", cli_metrics.port)
        finally:
            await client.close()
            await cli_metrics.close()
            await srv_metrics.close()
            await server.close()
            await fwd.close()
        written = sum(sizes)
        assert s.total("loomfs_rpc_payload_bytes_total", side="server", method="write", direction="in") == written
        assert s.total("loomfs_rpc_calls_total", side="server", method="write", status="ok") == len(sizes)
        assert s.total("loomfs_rpc_payload_bytes_total", side="server", method="read", direction="out") == CHUNK_SIZE
        assert s.total("loomfs_storage_target_used_bytes", target="1001") == written
        assert s.total("loomfs_storage_target_chunks", target="1001") == len(sizes)
        assert s.total("loomfs_storage_disk_seconds_count", op="stage_write") == len(sizes)
        assert s.total("loomfs_rpc_errors_total") == 0
        assert c.total("loomfs_rpc_payload_bytes_total", side="client", method="write", direction="out") == written
        assert c.total("loomfs_rpc_payload_bytes_total", side="client", method="read", direction="in") == CHUNK_SIZE
        assert c.total("loomfs_rpc_latency_seconds_count", side="client") == len(sizes) + 1

    asyncio.run(go())


def test_client_collector_through_a_real_client(fs) -> None:  # type: ignore[no-untyped-def]
    """The client's caches and retries as /metrics shows them, on the shared cluster."""
    from prometheus_client import CollectorRegistry, generate_latest

    from loomfs.metrics import parse_metrics

    reg = CollectorRegistry()
    reg.register(ClientCollector(fs.client))
    fs.makedirs("/metrics_client", exist_ok=True)
    fs.pipe("/metrics_client/a", b"z" * 100_000)
    assert fs.cat("/metrics_client/a") == b"z" * 100_000
    s = parse_metrics(generate_latest(reg).decode())
    assert s.total("loomfs_client_rpc_attempts_total") > 0
    assert s.total("loomfs_client_buffer_pool_hits_total") + s.total("loomfs_client_buffer_pool_misses_total") > 0
    fs.rmtree("/metrics_client")


def _metrics_port(node: object) -> int:
    return int(getattr(node, "metrics_port", 0) or 0)


def _storage_total(cluster, name: str, **labels: str) -> float:  # type: ignore[no-untyped-def]
    """``name`` summed over every storage node's /metrics."""
    nodes = cluster.routing().nodes

    async def go() -> float:
        total = 0.0
        for n in nodes:
            if n.kind == NodeKind.STORAGE and _metrics_port(n):
                total += (await scrape(n.host, _metrics_port(n))).total(name, **labels)
        return total

    return asyncio.run(go())


def test_cluster_services_serve_metrics(fs, cluster) -> None:  # type: ignore[no-untyped-def]
    """Every node in routing advertises a metrics port; the storage nodes' counted write bytes
    add up to (file bytes x replicas)."""
    routing = cluster.routing()
    if not routing.nodes or not any(_metrics_port(n) for n in routing.nodes):
        pytest.skip("services do not advertise metrics yet (NodeInfo.metrics_port missing or 0); "
                    "see docs/observability.md 'Wiring'")

    def storage_write_bytes() -> float:
        return _storage_total(cluster, "loomfs_rpc_payload_bytes_total", side="server", method="write",
                              direction="in")

    before = storage_write_bytes()
    fs.makedirs("/metrics_e2e", exist_ok=True)
    size = 8 << 20
    with fs.open("/metrics_e2e/f", "wb") as f:
        f.write(os.urandom(size))
    replicas = cluster.replicas
    deadline = time.monotonic() + 10
    while storage_write_bytes() - before < size * replicas and time.monotonic() < deadline:
        time.sleep(0.2)
    assert storage_write_bytes() - before == size * replicas
    fs.rmtree("/metrics_e2e")
    assert Path(cluster.root).exists()


def test_blocking_client_serves_its_own_metrics(cluster) -> None:  # type: ignore[no-untyped-def]
    import loomfs

    fs = loomfs.connect(str(cluster.root))
    try:
        port = fs.serve_metrics()
        fs.makedirs("/metrics_own", exist_ok=True)
        data = os.urandom(3 << 20)
        fs.pipe("/metrics_own/f", data)
        assert fs.cat("/metrics_own/f") == data
        s = asyncio.run(scrape("127.0.0.1", port))
        assert s.total("loomfs_rpc_payload_bytes_total", side="client", method="write", direction="out") == len(data)
        assert s.total("loomfs_rpc_payload_bytes_total", side="client", method="read", direction="in") == len(data)
        fs.rmtree("/metrics_own")
    finally:
        fs.close()


def test_a_durable_directory_fsyncs_every_replica(fs, cluster) -> None:  # type: ignore[no-untyped-def]
    """Issue 10: files under a directory with the ``durable`` layout flag are fsynced by every
    replica before the ack (the storage nodes run with fsync_on_commit off)."""

    def durable_commits() -> float:
        return _storage_total(cluster, "loomfs_storage_durable_commits_total")

    fs.makedirs("/durable_e2e/plain", exist_ok=True)
    fs.set_layout("/durable_e2e", durable=True)
    assert fs.get_layout("/durable_e2e").durable
    before = durable_commits()
    with fs.open("/durable_e2e/plain/x", "wb") as f:  # created before? no: inherits at create
        f.write(os.urandom(1 << 20))
    with fs.open("/durable_e2e/f", "wb") as f:
        f.write(os.urandom(1 << 20))
    assert fs.get_layout("/durable_e2e/f").durable
    assert durable_commits() - before >= cluster.replicas  # every replica of the chunk fsynced it
    fs.set_layout("/durable_e2e", durable=False)
    mid = durable_commits()
    with fs.open("/durable_e2e/g", "wb") as f:
        f.write(os.urandom(1 << 20))
    assert not fs.get_layout("/durable_e2e/g").durable and durable_commits() == mid
    fs.rmtree("/durable_e2e")
