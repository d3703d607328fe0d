"""Capacity counts each disk once; spare targets are named ``spare`` (issue 15 item 11)."""

from __future__ import annotations

import dataclasses

from rich.console import Console

from loomfs.cli.top import render
from loomfs.dashboard.model import build_view
from loomfs.metrics.capacity import cluster_capacity, target_state_name
from loomfs.wire.types import ChainInfo, NodeInfo, NodeKind, RoutingInfo, TargetInfo, TargetState

GIB = 1 << 30


def _local(spare: bool = False) -> RoutingInfo:
    """3 storage nodes x 2 targets on one 252 GiB disk (a local cluster), 2 chains of 3."""
    nodes = [NodeInfo(node_id=i, kind=NodeKind.STORAGE, host="127.0.0.1", port=8009 + i) for i in (1, 2, 3)]
    targets = [TargetInfo(target_id=i * 1000 + j, node_id=i, chain_id=j, used_bytes=GIB,
                          capacity_bytes=252 * GIB) for i in (1, 2, 3) for j in (1, 2)]
    if spare:
        nodes.append(NodeInfo(node_id=4, kind=NodeKind.STORAGE, host="127.0.0.1", port=8013))
        targets.append(TargetInfo(target_id=4001, node_id=4, chain_id=0, capacity_bytes=252 * GIB))
    chains = [ChainInfo(chain_id=j, targets=[1000 + j, 2000 + j, 3000 + j]) for j in (1, 2)]
    return RoutingInfo(version=1, nodes=nodes, targets=targets, chains=chains)


def test_targets_on_one_disk_count_once() -> None:
    cap = cluster_capacity(_local())
    assert cap.capacity_bytes == 252 * GIB and cap.disks == 1  # was 6 x 252 GiB = "1.5 TiB"
    assert cap.used_bytes == 6 * GIB and cap.free_bytes == 246 * GIB


def test_hosts_and_disk_ids_are_separate_disks() -> None:
    r = _local()
    r = dataclasses.replace(r, nodes=[dataclasses.replace(n, host=f"10.0.0.{n.node_id}") for n in r.nodes])
    assert cluster_capacity(r).capacity_bytes == 3 * 252 * GIB
    one_host = [TargetInfo(target_id=1001 + i, node_id=1, capacity_bytes=252 * GIB, disk_id=d, chain_id=1)
                for i, d in enumerate(("2049", "2050", "2049"))]
    both = RoutingInfo(nodes=[NodeInfo(node_id=1, host="h")], targets=one_host)
    cap = cluster_capacity(both)
    assert cap.disks == 2 and cap.capacity_bytes == 2 * 252 * GIB  # equal sizes, two st_devs


def test_spare_targets_are_spare_everywhere() -> None:
    r = _local(spare=True)
    spare = next(t for t in r.targets if t.target_id == 4001)
    assert target_state_name(spare) == "spare"
    assert target_state_name(r.targets[0]) == "serving"
    assert target_state_name(dataclasses.replace(spare, state=TargetState.OFFLINE)) == "offline"
    v = build_view(r, {}, {}, now_s=1.0)
    assert {x["target_id"]: x["state"] for x in v["targets"]}[4001] == "spare"
    t = v["totals"]
    assert (t["targets_serving"], t["targets"], t["targets_spare"]) == (6, 6, 1)
    assert t["capacity_bytes"] == 252 * GIB
    console = Console(width=200, record=True)
    console.print(render(v))
    text = console.export_text()
    assert "6/6 serving, 1 spare" in text and "of 252.0 GiB (1 disk)" in text and "1.5 TiB" not in text
