"""Gray failures (SIGSTOP past the lease), losing two of three replicas, mgmtd restarts."""

from __future__ import annotations

import time

import pytest
from faultkit import LEASE_S, start_cluster
from test_storage_kill import _assert_replicas_agree, _node_targets, _run_workload

import loomfs
from loomfs.testing import LocalCluster
from loomfs.wire.types import TargetState

pytestmark = [pytest.mark.integration]


@pytest.mark.timeout(180)
def test_sigstop_past_lease_then_sigcont(make_cluster: list[LocalCluster], seed: int) -> None:
    c = start_cluster("sigstop")
    make_cluster.append(c)
    fs = loomfs.connect(str(c.root))
    try:
        w = _run_workload(fs, "/w", seed)
        time.sleep(1.5)
        hung = _node_targets(c.routing(), 1)
        t0 = time.monotonic()
        c.pause_service("storage1")
        c.wait_routing(lambda r: all(t.state == TargetState.OFFLINE for t in r.targets if t.target_id in hung),
                       10 * LEASE_S, "the hung node detected")
        detect_s = time.monotonic() - t0
        time.sleep(LEASE_S)  # well past the lease
        t1 = time.monotonic()
        c.resume_service("storage1")
        c.wait_routing(c.fully_replicated, 90, "the resumed node resynced")
        back_s = time.monotonic() - t1
        stats = w.stop()
        print(f"[fault] SIGSTOP: detected in {detect_s:.2f}s; resynced {back_s:.2f}s after SIGCONT; longest op "
              f"{stats.max_op_s:.2f}s; {stats.writes} writes / {stats.reads} reads")
        assert stats.errors == []
        assert w.verify_all() == []
        _assert_replicas_agree(c)
    finally:
        fs.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("resync_between", [True, False])
def test_kill_two_of_three(make_cluster: list[LocalCluster], seed: int, resync_between: bool) -> None:
    c = start_cluster("killtwo")
    make_cluster.append(c)
    fs = loomfs.connect(str(c.root))
    try:
        w = _run_workload(fs, "/w", seed)
        time.sleep(1.5)
        c.kill_service("storage1")
        if resync_between:
            c.wait_routing(lambda r: any(t.state == TargetState.OFFLINE for t in r.targets), 10 * LEASE_S, "offline")
            c.start_service("storage1")
            c.wait_routing(c.fully_replicated, 90, "storage1 resynced")
        else:
            time.sleep(0.5)
        c.kill_service("storage2")
        c.wait_routing(lambda r: all(t.state != TargetState.SERVING for t in r.targets if t.node_id == 2),
                       10 * LEASE_S, "storage2 out of service")
        time.sleep(1.0)  # the survivors keep serving: one replica per chain left at worst
        stats = w.stop()
        assert stats.errors == [], stats.errors[:5]
        assert w.verify_all() == []
        t0 = time.monotonic()
        for name in ("storage1", "storage2"):
            c.start_service(name)
        c.wait_routing(c.fully_replicated, 120, "all back to 3 serving replicas")
        print(f"[fault] kill 2 of 3 (resync between: {resync_between}): longest op {stats.max_op_s:.2f}s; "
              f"full redundancy {time.monotonic() - t0:.2f}s after restarting both")
        assert w.verify_all() == []
        _assert_replicas_agree(c)
    finally:
        fs.close()


@pytest.mark.timeout(180)
def test_mgmtd_restart_keeps_serving(make_cluster: list[LocalCluster], seed: int) -> None:
    c = start_cluster("mgmtd")
    make_cluster.append(c)
    fs = loomfs.connect(str(c.root))
    try:
        w = _run_workload(fs, "/w", seed)
        time.sleep(1.0)
        v0 = c.routing().version
        c.kill_service("mgmtd")
        time.sleep(1.0)  # reads keep going on the routing clients hold; writes wait for a lease
        c.start_service("mgmtd")
        c.wait_listening("mgmtd")
        time.sleep(2.0)
        stats = w.stop()
        r = c.routing()
        print(f"[fault] mgmtd kill -9 + restart: longest op {stats.max_op_s:.2f}s, routing v{v0} -> v{r.version}")
        assert stats.errors == []
        assert w.verify_all() == []
        assert c.fully_replicated(r)
    finally:
        fs.close()


