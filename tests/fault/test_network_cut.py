"""Network cuts between services that all stay alive (a userspace fault hook in the
transport: the kernel here has no netem). The workload must see no error, every acknowledged
byte must survive, the cluster must route around the cut and heal by itself afterwards."""

from __future__ import annotations

import time

import pytest
from faultkit import LEASE_S, start_cluster
from test_storage_kill import _assert_replicas_agree, _run_workload

import loomfs
from loomfs.testing import LocalCluster
from loomfs.wire.types import RoutingInfo, TargetState

pytestmark = [pytest.mark.integration]

WRITE_PATH = (TargetState.SERVING, TargetState.SYNCING)


def _write_paths(r: RoutingInfo) -> list[list[int]]:
    """Each chain's write path as node ids (serving then syncing members, in order)."""
    node_of = {t.target_id: t.node_id for t in r.targets}
    state = {t.target_id: t.state for t in r.targets}
    return [[node_of[t] for t in c.targets if state.get(t) in WRITE_PATH] for c in r.chains]


def _adjacent(r: RoutingInfo, a: int, b: int) -> bool:
    return any({x, y} == {a, b} for path in _write_paths(r) for x, y in zip(path, path[1:], strict=False))


@pytest.mark.timeout(240)
def test_cut_between_two_storage_nodes(make_cluster: list[LocalCluster], seed: int) -> None:
    """The head cannot reach its successor, yet both heartbeat to mgmtd: the head reports
    it, mgmtd (which can reach both) fences the successor, the chain goes on without it."""
    c = start_cluster("netcut", fault_injection=True, storage_config={"suspect_after_s": 1.0})
    make_cluster.append(c)
    fs = loomfs.connect(str(c.root))
    try:
        w = _run_workload(fs, "/w", seed)
        time.sleep(1.5)
        path = _write_paths(c.routing())[0]
        a, b = path[0], path[1]  # the first chain's head and its successor
        name = {s.node_id: s.name for s in c.services.values() if s.kind == "storage"}
        t_cut = time.monotonic()
        c.cut(name[a], name[b])
        c.wait_routing(lambda r: not _adjacent(r, a, b), 30, f"chains routing around the cut {a}-{b}")
        t_route = time.monotonic() - t_cut
        time.sleep(4 * LEASE_S)  # the cut stays: fenced targets that come back are fenced again
        during = c.routing()
        assert not _adjacent(during, a, b)
        full_during = c.fully_replicated(during)
        t_heal = time.monotonic()
        c.heal()
        c.wait_routing(c.fully_replicated, 90, "full redundancy after the cut healed")
        t_full = time.monotonic() - t_heal
        time.sleep(0.5)
        stats = w.stop()
        print(f"[fault] cut storage{a} <-> storage{b}: routed around in {t_route:.2f}s; fully replicated "
              f"during the cut: {full_during}; full redundancy {t_full:.2f}s after healing; workload {stats.writes} writes / {stats.reads} reads, longest op "
              f"{stats.max_op_s:.2f}s, errors {len(stats.errors)}")
        assert stats.errors == []
        assert stats.writes > 5 and stats.reads > 2
        assert w.verify_all() == []
        _assert_replicas_agree(c)
    finally:
        fs.close()


@pytest.mark.timeout(240)
def test_storage_cut_off_from_mgmtd(make_cluster: list[LocalCluster], seed: int) -> None:
    """A storage node that keeps running but cannot reach mgmtd stops taking writes after half
    a lease, is declared dead after a lease, and resyncs when the cut heals."""
    c = start_cluster("mgmtdcut", fault_injection=True, storage_config={"suspect_after_s": 1.0})
    make_cluster.append(c)
    fs = loomfs.connect(str(c.root))
    try:
        w = _run_workload(fs, "/w", seed)
        time.sleep(1.5)
        node = c.services["storage3"].node_id
        mine = [t.target_id for t in c.routing().targets if t.node_id == node]
        t_cut = time.monotonic()
        c.cut("storage3", "mgmtd", both_ways=False)  # mgmtd never calls out, except probes
        c.cut("mgmtd", "storage3", both_ways=False)
        c.wait_routing(lambda r: all(t.state == TargetState.OFFLINE for t in r.targets if t.target_id in mine),
                       10 * LEASE_S, "the isolated node's targets leaving service")
        t_detect = time.monotonic() - t_cut
        time.sleep(LEASE_S)
        t_heal = time.monotonic()
        c.heal()
        c.wait_routing(c.fully_replicated, 90, "full redundancy after the cut healed")
        t_full = time.monotonic() - t_heal
        stats = w.stop()
        print(f"[fault] storage3 cut off from mgmtd: out of service in {t_detect:.2f}s; full redundancy "
              f"{t_full:.2f}s after healing; workload {stats.writes} writes / {stats.reads} reads, longest op "
              f"{stats.max_op_s:.2f}s, errors {len(stats.errors)}")
        assert stats.errors == []
        assert w.verify_all() == []
        _assert_replicas_agree(c)
    finally:
        fs.close()
