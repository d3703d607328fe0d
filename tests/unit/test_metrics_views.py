"""The cluster view behind `loomfs top` and the dashboard: health, totals, per-node rates."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from rich.console import Console

from loomfs.cli.top import render
from loomfs.dashboard.model import History, build_view, health_of
from loomfs.metrics import RpcMetrics, parse_metrics
from loomfs.wire.types import (
    ChainInfo,
    NodeInfo,
    NodeKind,
    NodeState,
    RoutingInfo,
    TargetInfo,
    TargetState,
)


def _routing(dead: bool = False, chain_states: tuple[int, int] = (TargetState.SERVING, TargetState.SERVING)) -> RoutingInfo:
    return RoutingInfo(
        version=3,
        nodes=[NodeInfo(node_id=101, kind=NodeKind.META, host="127.0.0.1", port=9),
               NodeInfo(node_id=1, kind=NodeKind.STORAGE, host="127.0.0.1", port=10),
               NodeInfo(node_id=2, kind=NodeKind.STORAGE, host="127.0.0.1", port=11,
                        state=NodeState.DEAD if dead else NodeState.ALIVE)],
        targets=[TargetInfo(target_id=1001, node_id=1, chain_id=1, state=chain_states[0], used_bytes=5,
                            capacity_bytes=100),
                 TargetInfo(target_id=2001, node_id=2, chain_id=1, state=chain_states[1], capacity_bytes=100,
                            sync_bytes_left=40)],
        chains=[ChainInfo(chain_id=1, targets=[1001, 2001])],
    )


def test_health() -> None:
    assert health_of(_routing()) == "ok"
    assert health_of(_routing(dead=True)) == "degraded"
    assert health_of(_routing(chain_states=(TargetState.SERVING, TargetState.SYNCING))) == "degraded"
    assert health_of(_routing(chain_states=(TargetState.OFFLINE, TargetState.OFFLINE))) == "down"


def _scrape(m: RpcMetrics, reg: CollectorRegistry, at: float):  # type: ignore[no-untyped-def]
    return parse_metrics(generate_latest(reg).decode(), at)


def test_view_totals_and_rates_from_scrapes() -> None:
    reg, meta_reg = CollectorRegistry(), CollectorRegistry()
    m, mm = RpcMetrics(reg), RpcMetrics(meta_reg)
    prev = {1: _scrape(m, reg, 0.0), 101: _scrape(mm, meta_reg, 0.0)}
    for _ in range(10):
        m.on_call("server", "write", 0, 0.01, 1 << 20, 0)
    for _ in range(30):
        mm.on_call("server", "stat", 0, 0.0005, 0, 0)
    cur = {1: _scrape(m, reg, 2.0), 101: _scrape(mm, meta_reg, 2.0)}
    v = build_view(_routing(chain_states=(TargetState.SERVING, TargetState.SYNCING)), cur, prev, now_s=123.0)
    t = v["totals"]
    assert v["health"] == "degraded" and v["routing_version"] == 3
    assert t["storage_in_Bps"] == 5 * (1 << 20) and t["storage_iops"] == 5
    assert t["meta_ops_per_s"] == 15 and t["meta_ops_by_method"] == {"stat": 15}
    assert t["recovery_bytes_left"] == 40 and t["recovering_targets"] == 1
    assert t["used_bytes"] == 5 and t["metrics_nodes"] == 2
    assert t["capacity_bytes"] == 100 and t["disks"] == 1  # both targets on 127.0.0.1, same size: one disk
    assert 5 < t["p99_ms_max"] <= 10
    node1 = next(n for n in v["nodes"] if n["node_id"] == 1)
    assert node1["scraped"] and node1["iops"] == 5
    assert not next(n for n in v["nodes"] if n["node_id"] == 2)["scraped"]
    assert v["chains"][0]["targets"] == [{"target_id": 1001, "state": "serving", "blank": False},
                                         {"target_id": 2001, "state": "syncing", "blank": False}]
    h = History(points_max=2)
    for _ in range(3):
        h.add(v)
    assert len(h.points) == 2 and h.points[-1]["in_Bps"] == 5 * (1 << 20)
    assert repr(h) == "History(2/2)"
    console = Console(width=160, record=True)
    console.print(render(v))
    text = console.export_text()
    assert "health degraded" in text and "stat 15" in text and "2001(syncing)" in text


def test_routing_only_view_says_metrics_missing() -> None:
    v = build_view(_routing(dead=True), {}, {}, now_s=0.0)
    assert v["totals"]["metrics_nodes"] == 0 and v["totals"]["storage_nodes_alive"] == 1
    console = Console(width=160, record=True)
    console.print(render(v))
    assert "no node serves /metrics yet" in console.export_text()
