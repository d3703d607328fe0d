"""mgmtd's EC groups (no I/O): a single-replica table beside a replicated one; a lost
single-replica chain gets an empty spare, preferring a node outside the table."""

from __future__ import annotations

from loomfs.mgmtd.ec import replace_lost_ec_targets
from loomfs.mgmtd.state import ClusterState
from loomfs.wire.types import NodeKind, NodeState, TargetInfo, TargetState


def _register(st: ClusterState, n: int, targets: int, now_s: float) -> None:
    st.register(node_id=n, kind=NodeKind.STORAGE, host="127.0.0.1", port=9000 + n,
                targets=[TargetInfo(target_id=n * 1000 + i + 1, path=f"/t{i}") for i in range(targets)],
                now_s=now_s)


def _state() -> ClusterState:
    st = ClusterState(lease_s=2.0, replace_after_s=5.0)
    for n in range(1, 7):
        _register(st, n, 3, 0.0)
    st.create_chain_table(replicas=3, targets_per_node=2)
    st.create_chain_table(replicas=1, targets_per_node=1)
    return st


def test_ec_table_one_chain_per_node() -> None:
    st = _state()
    ec = st.tables[2]
    assert ec.replicas == 1 and len(ec.chain_ids) == 6
    nodes = [st.targets[st.chains[c].targets[0]].node_id for c in ec.chain_ids]
    assert sorted(nodes) == [1, 2, 3, 4, 5, 6]
    assert len(st.tables[1].chain_ids) == 4  # 12 targets in chains of 3


def test_lost_ec_chain_gets_a_spare_after_replace_after_s() -> None:
    st = _state()
    ec_chain = next(c for c in st.tables[2].chain_ids if st.targets[st.chains[c].targets[0]].node_id == 3)
    lost = st.chains[ec_chain].targets[0]
    _register(st, 7, 1, 0.0)  # a fresh node: its target is a spare outside the EC table
    for t_s in (1.0, 2.0):
        for n in (1, 2, 4, 5, 6, 7):
            st.heartbeat(n, [], t_s)
        st.tick(t_s)
    st.heartbeat(3, [], 0.5)
    for n in (1, 2, 4, 5, 6, 7):
        st.heartbeat(n, [], 3.0)
    st.tick(3.0)
    assert st.nodes[3].state == NodeState.DEAD
    assert replace_lost_ec_targets(st, 4.0) == []  # not for replace_after_s yet
    for n in (1, 2, 4, 5, 6, 7):
        st.heartbeat(n, [], 8.0)
    v = st.chains[ec_chain].version
    swaps = replace_lost_ec_targets(st, 8.0)
    assert swaps == [(ec_chain, lost, 7001)]
    assert st.chains[ec_chain].targets == [7001] and st.chains[ec_chain].version == v + 1
    assert st.targets[7001].state == TargetState.SERVING and st.targets[lost].chain_id == 0
    assert replace_lost_ec_targets(st, 9.0) == []  # done: nothing more to swap
    # replicated chains are not this module's business
    assert all(len(st.chains[c].targets) == 3 for c in st.tables[1].chain_ids)
