"""mgmtd cluster state machine: registration, leases, chain tables (no I/O)."""

from __future__ import annotations

import pytest

from loomfs.errors import InvalidArgument, StatusError
from loomfs.mgmtd.state import ClusterState, plan_chains
from loomfs.mgmtd.store import MgmtdStore
from loomfs.wire.status import Status
from loomfs.wire.types import NodeKind, NodeState, TargetInfo, TargetState


def _cluster(nodes: int = 3, targets: int = 2, lease_s: float = 5.0) -> ClusterState:
    st = ClusterState(lease_s=lease_s)
    for n in range(1, nodes + 1):
        st.register(node_id=n, kind=NodeKind.STORAGE, host="127.0.0.1", port=9000 + n,
                    targets=[TargetInfo(target_id=n * 1000 + i + 1, path=f"/t{i}") for i in range(targets)],
                    now_s=0.0)
    return st


def test_plan_chains_distinct_nodes_and_balanced() -> None:
    free = {n: [n * 1000 + i for i in range(1, 5)] for n in range(1, 6)}
    chains = plan_chains(free, 3)
    assert len(chains) == (5 * 4) // 3
    used = [t for c in chains for t in c]
    assert len(used) == len(set(used))
    for c in chains:
        assert len({t // 1000 for t in c}) == 3
    heads = [c[0] // 1000 for c in chains]
    assert max(heads.count(n) for n in set(heads)) - min(heads.count(n) for n in set(heads)) <= 2


def test_plan_chains_not_enough_nodes() -> None:
    assert plan_chains({1: [1001, 1002], 2: [2001]}, 3) == []


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_create_chain_table(replicas: int) -> None:
    st = _cluster()
    v0 = st.version
    table = st.create_chain_table(replicas=replicas)
    assert st.version > v0
    assert table.table_id == 1 and table.replicas == replicas
    assert len(table.chain_ids) == 6 // replicas
    r = st.routing()
    assert r.version == st.version
    for c in r.chains:
        assert len(c.targets) == replicas
        assert len({st.targets[t].node_id for t in c.targets}) == replicas
    with pytest.raises(StatusError) as ei:
        st.create_chain_table(replicas=replicas, table_id=1)
    assert ei.value.status is Status.EEXIST


def test_chain_table_needs_enough_nodes() -> None:
    st = _cluster(nodes=2)
    with pytest.raises(StatusError) as ei:
        st.create_chain_table(replicas=3)
    assert ei.value.status is Status.NO_CHAIN_TABLE


def test_lease_expiry_marks_dead_and_lastsrv() -> None:
    st = _cluster(lease_s=5.0)
    st.create_chain_table(replicas=3)
    for n in (1, 2):
        st.heartbeat(n, [], 4.0)
    assert not st.tick(4.9)
    v = st.version
    assert st.tick(5.5)  # node 3 silent since t=0
    assert st.version > v
    assert st.nodes[3].state == NodeState.DEAD
    for t in st.targets.values():
        want = TargetState.OFFLINE if t.node_id == 3 else TargetState.SERVING
        assert t.state == want
    assert all(c.version == 2 for c in st.chains.values())
    # node 3 returns: its targets need resync because the chains kept serving
    st.heartbeat(3, [], 6.0)
    assert st.nodes[3].state == NodeState.ALIVE
    back = [t for t in st.targets.values() if t.node_id == 3]
    assert all(t.state in (TargetState.WAITING, TargetState.SYNCING) for t in back)
    for t in back:  # one sync per chain: each chain has one node-3 target, so all sync now
        assert t.state == TargetState.SYNCING
        chain = st.chains[t.chain_id]
        assert chain.targets[-1] == t.target_id  # the syncing target is the write tail
        assert st.sync_report(target_id=t.target_id, chain_id=t.chain_id, chain_version=chain.version,
                              chunks_left=0, bytes_left=0, done=True, now_s=7.0)
    assert all(t.state == TargetState.SERVING for t in st.targets.values())


def test_whole_cluster_down_comes_back_serving() -> None:
    st = _cluster()
    st.create_chain_table(replicas=3)
    assert st.tick(100.0)
    for c in st.chains.values():  # the first member of each chain holds the newest data
        assert [st.targets[t].state for t in c.targets] == [TargetState.LASTSRV] + [TargetState.OFFLINE] * 2
    for n in (1, 2, 3):
        st.heartbeat(n, [], 101.0)
    for _ in range(3):  # sync the others one at a time
        for t in [t for t in st.targets.values() if t.state == TargetState.SYNCING]:
            c = st.chains[t.chain_id]
            st.sync_report(target_id=t.target_id, chain_id=c.chain_id, chain_version=c.version,
                           chunks_left=0, bytes_left=0, done=True, now_s=102.0)
    assert all(t.state == TargetState.SERVING for t in st.targets.values())


def test_register_validation_and_auto_ids() -> None:
    st = ClusterState(lease_s=5)
    with pytest.raises(InvalidArgument):
        st.register(node_id=0, kind=99, host="h", port=1, targets=[], now_s=0)
    with pytest.raises(InvalidArgument):
        st.register(node_id=0, kind=NodeKind.META, host="", port=1, targets=[], now_s=0)
    a = st.register(node_id=0, kind=NodeKind.META, host="h", port=1, targets=[], now_s=0)
    b = st.register(node_id=0, kind=NodeKind.META, host="h", port=1, targets=[], now_s=0)
    c = st.register(node_id=0, kind=NodeKind.META, host="h", port=2, targets=[], now_s=0)
    assert a == b != c
    with pytest.raises(StatusError):
        st.heartbeat(12345, [], 0)


def test_store_roundtrip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    st = _cluster()
    st.create_chain_table(replicas=2)
    store = MgmtdStore(f"sqlite:///{tmp_path}/m.db")
    store.save(st)
    store.close()
    st2 = ClusterState(lease_s=5)
    MgmtdStore(f"sqlite:///{tmp_path}/m.db").load(st2, now_s=50.0)
    assert st2.version > st.version
    assert st2.routing().chains == st.routing().chains
    assert st2.routing().tables == st.routing().tables
    assert {n: r.last_heartbeat_s for n, r in st2.nodes.items()} == {1: 50.0, 2: 50.0, 3: 50.0}


def test_usage_updates_show_without_version_bump() -> None:
    st = _cluster()
    v = st.version
    assert st.routing().targets[0].used_bytes == 0
    st.heartbeat(1, [TargetInfo(target_id=1001, used_bytes=123, capacity_bytes=1000, chunk_count=2)], 1.0)
    r = st.routing()
    assert r.version == v
    t = next(t for t in r.targets if t.target_id == 1001)
    assert (t.used_bytes, t.capacity_bytes, t.chunk_count) == (123, 1000, 2)


def test_targets_disk_ids_reach_the_routing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Issue 15 item 11: capacity counts each disk once; nodes say which file system each
    target lives on and mgmtd passes it on (and keeps it across its own restart)."""
    from loomfs.storage.engine.memory import MemoryEngine
    from loomfs.storage.target import StorageTarget

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    ta, tb = StorageTarget(1001, MemoryEngine(), str(a)), StorageTarget(1002, MemoryEngine(), str(b))
    assert ta.disk_id and ta.disk_id == tb.disk_id  # one file system
    assert StorageTarget(1003, MemoryEngine()).disk_id == ""
    st = ClusterState(lease_s=5.0)
    st.register(node_id=1, kind=NodeKind.STORAGE, host="h", port=1, now_s=0.0,
                targets=[TargetInfo(target_id=t.target_id, path=t.path, disk_id=t.disk_id) for t in (ta, tb)])
    assert {t.disk_id for t in st.routing().targets} == {ta.disk_id}


def test_a_restart_mgmtd_heard_of_survives_mgmtd_dying_before_acting_on_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Simulator seed 100649: a head restarted (its pending versions lost) and re-registered
    with a mgmtd that was holding the chain's change behind a revocation; that mgmtd died
    before acting, the next one never learnt of the restart, the head kept serving and reused a
    version number another member had committed with other bytes. The restart is now saved
    (a new routing version) before the node hears back."""
    st = _cluster(nodes=3, targets=1)
    st.create_chain_table(replicas=3)
    head = st.chains[next(iter(st.chains))].targets[0]
    node = st.targets[head].node_id
    v = st.version
    st.register(node_id=node, kind=NodeKind.STORAGE, host="127.0.0.1", port=9000 + node,
                targets=[TargetInfo(target_id=head, path="/t0")], now_s=1.0)
    assert st.version > v  # the service persists on a version change
    store = MgmtdStore(f"sqlite:///{tmp_path}/m.db")
    store.save(st)
    store.close()
    st2 = ClusterState(lease_s=5)
    MgmtdStore(f"sqlite:///{tmp_path}/m.db").load(st2, now_s=2.0)
    st2.reconcile(2.0)
    assert st2.targets[head].state in (TargetState.WAITING, TargetState.SYNCING)  # resynced, not serving
