"""kill -9 storage servers under a continuous write+read workload (3 replicas)."""

from __future__ import annotations

import time

import pytest
from faultkit import LEASE_S, Workload, start_cluster

import loomfs
from loomfs.testing import LocalCluster
from loomfs.wire.types import TargetState

pytestmark = [pytest.mark.integration]


def _node_targets(r: object, node_id: int) -> list[int]:
    return [t.target_id for t in r.targets if t.node_id == node_id]  # type: ignore[attr-defined]


def _state_of(c: LocalCluster, target_id: int) -> int:
    return next(t.state for t in c.routing().targets if t.target_id == target_id)


def _run_workload(fs: loomfs.LoomFS, base: str, seed: int) -> Workload:
    fs.makedirs(base, exist_ok=True)
    fs.set_layout(base, chunk_size=128 << 10, stripe=4)
    return Workload(fs, base, seed).start()


@pytest.mark.timeout(180)
def test_kill9_one_storage_rebuilds_onto_spare(make_cluster: list[LocalCluster], seed: int) -> None:
    c = start_cluster("kill9spare", replace_after_s=2.0)
    make_cluster.append(c)
    c.add_storage_node()  # storage4: its targets are spares
    fs = loomfs.connect(str(c.root))
    try:
        w = _run_workload(fs, "/w", seed)
        time.sleep(2.0)
        victim = c.services["storage2"]
        lost = _node_targets(c.routing(), victim.node_id)
        t_kill = time.monotonic()
        c.kill_service("storage2")
        c.wait_routing(lambda r: all(t.state != TargetState.SERVING for t in r.targets if t.target_id in lost),
                       10 * LEASE_S, "the dead node's targets leaving service")
        t_detect = time.monotonic() - t_kill
        c.wait_routing(lambda r: c.fully_replicated(r) and not any(t.chain_id for t in r.targets
                                                                    if t.target_id in lost),
                       90, "rebuild onto the spares")
        t_full = time.monotonic() - t_kill
        time.sleep(1.0)
        stats = w.stop()
        print(f"[fault] kill -9: detected in {t_detect:.2f}s, full redundancy (spares rebuilt) after {t_full:.2f}s; "
              f"workload {stats.writes} writes / {stats.reads} reads, longest op {stats.max_op_s:.2f}s, "
              f"errors {len(stats.errors)}")
        assert stats.errors == []
        assert stats.writes > 5 and stats.reads > 2
        assert w.verify_all() == []
        r = c.routing()
        spares = _node_targets(r, 4)
        assert all(t.chain_id for t in r.targets if t.target_id in spares)
    finally:
        fs.close()


@pytest.mark.timeout(180)
def test_kill9_then_restart_resyncs(make_cluster: list[LocalCluster], seed: int) -> None:
    c = start_cluster("kill9resync")
    make_cluster.append(c)
    fs = loomfs.connect(str(c.root))
    try:
        w = _run_workload(fs, "/w", seed)
        time.sleep(2.0)
        lost = _node_targets(c.routing(), 3)
        t_kill = time.monotonic()
        c.kill_service("storage3")
        c.wait_routing(lambda r: all(t.state == TargetState.OFFLINE for t in r.targets if t.target_id in lost),
                       10 * LEASE_S, "offline")
        t_detect = time.monotonic() - t_kill
        time.sleep(1.5)  # writes continue on two replicas
        t_back = time.monotonic()
        c.start_service("storage3")
        c.wait_routing(c.fully_replicated, 90, "resync back to 3 serving replicas")
        t_full = time.monotonic() - t_back
        stats = w.stop()
        print(f"[fault] kill -9 + restart: detected in {t_detect:.2f}s, resynced {t_full:.2f}s after restart; "
              f"workload {stats.writes} writes / {stats.reads} reads, longest op {stats.max_op_s:.2f}s")
        assert stats.errors == []
        assert w.verify_all() == []
        # every replica of every chain agrees on every chunk (the resync copied what was missed)
        _assert_replicas_agree(c)
    finally:
        fs.close()


def _assert_replicas_agree(c: LocalCluster) -> None:
    r = c.routing()
    chain_of = {t.target_id: t.chain_id for t in r.targets}
    by_chain: dict[int, dict[int, set[tuple[int, int, int, int]]]] = {}
    for tid, meta in c.chunks_of(0):
        if chain_of.get(tid):
            key = (meta.chunk.inode, meta.chunk.index, meta.commit_ver, meta.crc)
            by_chain.setdefault(chain_of[tid], {}).setdefault(tid, set()).add(key)
    for chain_id, per_target in by_chain.items():
        sets = list(per_target.values())
        assert all(s == sets[0] for s in sets), f"chain {chain_id} replicas differ"
