"""Metrics without sockets: the RPC observer, quantiles, rates, collectors over real objects."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from loomfs.meta.store.sqlite import SqliteStore
from loomfs.metrics import (
    ClientCollector,
    MetaCollector,
    MgmtdCollector,
    RpcMetrics,
    ServiceMetrics,
    StorageCollector,
    histogram_quantile,
    instrument_engines,
    instrument_meta_store,
    parse_metrics,
)
from loomfs.metrics.scrape import delta_buckets, method_rates, rates
from loomfs.net.buffers import BufferPool
from loomfs.storage.engine.memory import MemoryEngine
from loomfs.storage.engine.types import ChunkKey
from loomfs.storage.target import StorageTarget
from loomfs.wire.status import Status
from loomfs.wire.types import (
    NodeInfo,
    NodeKind,
    NodeState,
    RoutingInfo,
    ScrubStats,
    TargetInfo,
    TargetState,
)


def _scrape(reg: CollectorRegistry, at_s: float = 0.0):  # type: ignore[no-untyped-def]
    return parse_metrics(generate_latest(reg).decode(), at_s)


def test_observer_counts_calls_bytes_errors_and_latency() -> None:
    reg = CollectorRegistry()
    m = RpcMetrics(reg)
    for _ in range(3):
        m.on_call("server", "write", 0, 0.002, 4096, 0)
    m.on_call("server", "read", 0, 0.0004, 0, 65536)
    m.on_call("server", "stat", int(Status.ENOENT), 0.0001, 0, 0)
    m.on_call("client", "write", int(Status.DEADLINE_EXCEEDED), 1.5, 0, 100)
    s = _scrape(reg)
    assert s.total("loomfs_rpc_calls_total", side="server", method="write", status="ok") == 3
    assert s.total("loomfs_rpc_payload_bytes_total", side="server", method="write", direction="in") == 3 * 4096
    assert s.total("loomfs_rpc_payload_bytes_total", side="server", method="read", direction="out") == 65536
    assert s.total("loomfs_rpc_errors_total", side="server", method="stat", status="enoent") == 1
    assert s.total("loomfs_rpc_errors_total", side="server", method="write") == 0
    assert s.total("loomfs_rpc_errors_total", side="client", status="deadline_exceeded") == 1
    assert s.total("loomfs_rpc_latency_seconds_count", side="server") == 5
    # 3 of 5 server calls took 2 ms: the median lands in the (1 ms, 2.5 ms] bucket
    p50 = histogram_quantile(0.5, s.buckets("loomfs_rpc_latency_seconds", side="server"))
    assert 0.001 < p50 <= 0.0025
    assert repr(m) == "RpcMetrics(observed=6 keys=4)"


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    b = [(0.1, 10.0), (0.2, 30.0), (0.5, 40.0), (math.inf, 40.0)]
    assert histogram_quantile(0.25, b) == pytest.approx(0.1)  # rank 10: top of the first bucket
    assert histogram_quantile(0.5, b) == pytest.approx(0.15)  # rank 20: halfway through (0.1, 0.2]
    assert histogram_quantile(0.99, b) == pytest.approx(0.2 + 0.3 * (39.6 - 30) / 10)
    assert math.isnan(histogram_quantile(0.5, []))
    assert histogram_quantile(0.99, [(1.0, 0.0), (math.inf, 5.0)]) == 1.0  # past the last bound


def test_rates_between_two_scrapes_use_only_the_window() -> None:
    reg = CollectorRegistry()
    m = RpcMetrics(reg)
    for _ in range(100):
        m.on_call("server", "read", 0, 0.0001, 0, 4096)  # fast history
    before = _scrape(reg, at_s=10.0)
    for _ in range(20):
        m.on_call("server", "write", 0, 0.2, 1 << 20, 0)  # slow window
    m.on_call("server", "stat", int(Status.ENOENT), 0.2, 0, 0)
    after = _scrape(reg, at_s=12.0)
    r = rates(before, after)
    assert r.ops_per_s == pytest.approx(21 / 2)
    assert r.iops == pytest.approx(20 / 2)
    assert r.bytes_in_per_s == pytest.approx(20 * (1 << 20) / 2)
    assert r.bytes_out_per_s == 0
    assert r.errors_per_s == pytest.approx(0.5)
    assert 0.1 < r.p99_s <= 0.25  # lifetime p99 would be ~0.2 too, but p50 shows the window
    assert 0.1 < r.p50_s <= 0.25
    assert method_rates(before, after) == {"stat": 0.5, "write": 10.0}
    first = rates(None, before)
    assert first.ops_per_s == 0 and first.p50_s <= 0.0001


def test_delta_buckets_after_counter_reset_counts_from_zero() -> None:
    assert delta_buckets([(1.0, 5.0), (math.inf, 9.0)], [(1.0, 7.0), (math.inf, 12.0)]) == [(1.0, 2.0), (math.inf, 3.0)]
    assert delta_buckets([(1.0, 5.0), (math.inf, 9.0)], [(1.0, 1.0), (math.inf, 2.0)]) == [(1.0, 1.0), (math.inf, 2.0)]


class _FakeStorageService:
    def __init__(self, targets: list[StorageTarget]):
        self.targets = {t.target_id: t for t in targets}
        self.forwards_total = 7
        self.reforwards_total = 1
        self.scrub_stats = lambda tid: ScrubStats(checked=10, bad=2, repaired=2, rebuilt=1)


def test_storage_collector_reads_engine_usage_and_progress() -> None:
    eng = MemoryEngine(capacity_bytes=1 << 30)
    key = ChunkKey(5, 0)
    eng.stage_write(key, 1, 0, b"x" * 5000)
    asyncio.run(eng.commit(key, 1))
    t = StorageTarget(3001, eng, "/t")
    reg = CollectorRegistry()
    reg.register(StorageCollector(_FakeStorageService([t]), 3,
                                  progress={"resync": lambda: {3001: (2.0, 8.0)}}))
    hist = instrument_engines([t], reg)
    buf = memoryview(bytearray(5000))
    assert eng.read(key, 0, buf) == 5000
    s = _scrape(reg)
    assert s.total("loomfs_storage_target_used_bytes", target="3001") == 5000
    assert s.total("loomfs_storage_target_free_bytes", node="3") == (1 << 30) - 5000
    assert s.total("loomfs_storage_target_chunks") == 1
    assert s.total("loomfs_storage_forwards_total") == 7
    assert s.total("loomfs_storage_scrub_checked_chunks_total", target="3001") == 10
    assert s.total("loomfs_storage_scrub_rebuilt_chunks_total", node="3") == 1
    assert s.total("loomfs_storage_scrub_repaired_chunks_total") == 2
    assert s.total("loomfs_storage_resync_done_units", target="3001") == 2
    assert s.total("loomfs_storage_resync_total_units", target="3001") == 8
    assert s.total("loomfs_storage_disk_seconds_count", op="read") == 1
    assert hist is not None
    instrument_engines([t], CollectorRegistry())  # wrapping twice does not double-count
    eng.read(key, 0, buf)
    assert _scrape(reg).total("loomfs_storage_disk_seconds_count", op="read") == 2


def test_meta_store_instrumentation_times_and_counts_failed_transactions() -> None:
    store = SqliteStore(":memory:")
    reg = CollectorRegistry()
    reg.register(MetaCollector(store))
    instrument_meta_store(store, reg)

    async def go() -> None:
        async with store.write() as txn:
            await txn.add_counter(1, 1)
        async with store.read():
            pass
        with pytest.raises(RuntimeError):
            async with store.write():
                raise RuntimeError("boom")
        await store.close()

    asyncio.run(go())
    s = _scrape(reg)
    assert s.total("loomfs_meta_store_commits_total") == 1
    assert s.total("loomfs_meta_txn_seconds_count", kind="write") == 2
    assert s.total("loomfs_meta_txn_seconds_count", kind="read") == 1
    assert s.total("loomfs_meta_txn_failed_total", kind="write") == 1


def test_a_transaction_that_cannot_even_start_counts_as_failed() -> None:
    """The store's ``write()`` itself raising (a closed store, a bad argument) is a failed
    transaction, as it was with the generator wrapper: the call happens at ``__aenter__``."""

    class _Closed:
        def read(self) -> Any:
            raise RuntimeError("store closed")

        write = read

    store = _Closed()
    reg = CollectorRegistry()
    instrument_meta_store(store, reg)
    txn = store.write()  # creating the context manager does not call the store yet

    async def go() -> None:
        with pytest.raises(RuntimeError):
            async with txn:
                pass

    asyncio.run(go())
    s = _scrape(reg)
    assert s.total("loomfs_meta_txn_failed_total", kind="write") == 1
    assert s.total("loomfs_meta_txn_seconds_count", kind="write") == 1


class _FakeState:
    def routing(self) -> RoutingInfo:
        return RoutingInfo(
            version=9,
            nodes=[NodeInfo(node_id=1, kind=NodeKind.STORAGE), NodeInfo(node_id=2, kind=NodeKind.STORAGE,
                                                                        state=NodeState.DEAD),
                   NodeInfo(node_id=101, kind=NodeKind.META)],
            targets=[TargetInfo(target_id=1001, used_bytes=10, capacity_bytes=100),
                     TargetInfo(target_id=2001, state=TargetState.OFFLINE, capacity_bytes=100),
                     TargetInfo(target_id=1002, state=TargetState.SYNCING, sync_bytes_left=77)],
        )


def test_mgmtd_collector_summarises_routing() -> None:
    reg = CollectorRegistry()
    reg.register(MgmtdCollector(_FakeState()))
    s = _scrape(reg)
    assert s.total("loomfs_mgmtd_routing_version") == 9
    assert s.total("loomfs_mgmtd_nodes", kind="storage", state="alive") == 1
    assert s.total("loomfs_mgmtd_nodes", kind="storage", state="dead") == 1
    assert s.total("loomfs_mgmtd_targets", state="serving") == 1
    assert s.total("loomfs_mgmtd_targets", state="offline") == 1
    assert s.total("loomfs_mgmtd_targets", state="lastsrv") == 0
    assert s.total("loomfs_mgmtd_target_sync_bytes_left", target="1002") == 77
    assert s.total("loomfs_mgmtd_capacity_bytes") == 100  # one host, same-size file systems: one disk
    assert s.total("loomfs_mgmtd_disks") == 1


class _Cache:
    hits, misses, fetches = 5, 2, 6


class _File:
    _cache = _Cache()


class _Rpc:
    retries_total, calls_total = 3, 40


class _FakeClient:
    def __init__(self) -> None:
        self._open_files = [_File(), _File()]
        self.rpc = _Rpc()


def test_client_collector_sums_caches_and_retries() -> None:
    pool = BufferPool()
    pool.release(pool.acquire(4096))
    pool.acquire(4096)
    reg = CollectorRegistry()
    reg.register(ClientCollector(_FakeClient(), pool))
    s = _scrape(reg)
    assert s.total("loomfs_client_readahead_hits_total") == 10
    assert s.total("loomfs_client_readahead_misses_total") == 4
    assert s.total("loomfs_client_buffer_pool_hits_total") == pool.hits == 1
    assert s.total("loomfs_client_buffer_pool_misses_total") == pool.misses == 1
    assert s.total("loomfs_client_rpc_retries_total") == 3
    assert s.total("loomfs_client_open_files") == 2


def test_service_metrics_renders_info_and_process() -> None:
    m = ServiceMetrics("meta1")
    s = parse_metrics(m.render().decode())
    assert s.total("loomfs_service_info", service="meta1") == 1
    assert s.total("process_resident_memory_bytes") > 0
    assert repr(m).startswith("ServiceMetrics(meta1 port=0")


def test_mgmtd_collector_counts_blank_targets_and_accepted_losses() -> None:
    from types import SimpleNamespace

    state = _FakeState()
    state.targets = {1001: SimpleNamespace(blank=True), 1002: SimpleNamespace(blank=False)}  # type: ignore[attr-defined]
    state.accepted_losses = 2  # type: ignore[attr-defined]
    reg = CollectorRegistry()
    reg.register(MgmtdCollector(state))
    s = _scrape(reg)
    assert s.total("loomfs_mgmtd_blank_targets") == 1
    assert s.total("loomfs_mgmtd_accepted_chain_losses_total") == 2
    reg2 = CollectorRegistry()
    reg2.register(MgmtdCollector(_FakeState()))  # a state without them (a stand-in): zeros
    assert _scrape(reg2).total("loomfs_mgmtd_blank_targets") == 0
