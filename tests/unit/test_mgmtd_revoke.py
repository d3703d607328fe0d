"""mgmtd: a SERVING target of a live node leaves its chain only after the node stopped serving
it (no I/O).

Without this, a fenced tail that still heartbeats keeps serving reads under its lease with
routing that says it is the tail, while the new tail commits newer versions: a stale read
after an acknowledged write (found while building the simulator for issue 8)."""

from __future__ import annotations

from loomfs.mgmtd.state import ClusterState
from loomfs.wire.types import NodeKind, TargetInfo, TargetState

S = TargetState
LEASE_S = 1.0


def _cluster() -> ClusterState:
    st = ClusterState(lease_s=LEASE_S)
    for n in (1, 2, 3):
        st.register(node_id=n, kind=NodeKind.STORAGE, host="127.0.0.1", port=9000 + n,
                    targets=[TargetInfo(target_id=n * 1000 + 1, path="/t")], now_s=0.0)
    st.create_chain_table(replicas=3)
    return st


def _fence_tail(st: ClusterState, now_s: float) -> int:
    h, m, t = st.chains[1].targets
    assert st.report_unreachable(reporter_node=m // 1000, reporter_target=m, suspect_target=t, chain_id=1,
                                 chain_version=st.chains[1].version, suspect_reachable=True, now_s=now_s) == t
    return t


def test_fence_waits_for_the_node_to_stop_serving() -> None:
    st = _cluster()
    for n in (1, 2, 3):
        st.heartbeat(n, [], 0.4)
    v, rv = st.chains[1].version, st.version
    t = _fence_tail(st, 0.5)
    # nothing published yet: the fenced tail may still serve reads under its lease
    assert st.chains[1].version == v and st.version == rv and st.targets[t].state == S.SERVING
    # its node's next heartbeat reply tells it to stop serving the target
    assert st.heartbeat(3, [], 0.6) == [t]
    assert st.targets[t].state == S.SERVING
    # the next heartbeat says it stopped: now the chain changes
    assert st.heartbeat(3, [], 0.9, revoked_acked=[t], routing_version=rv) == [t]
    assert st.chains[1].version == v + 1 and st.targets[t].state == S.OFFLINE
    assert st.targets[t].revoke_version == st.version
    # the revocation stays until the node serves by the routing that took the target out
    assert st.heartbeat(3, [], 1.2, routing_version=st.version - 1) == [t]
    assert st.heartbeat(3, [], 1.5, routing_version=st.version) == []


def test_without_an_answer_the_change_waits_out_the_lease_granted_before() -> None:
    st = _cluster()
    for n in (1, 2, 3):
        st.heartbeat(n, [], 0.4)
    v = st.chains[1].version
    t = _fence_tail(st, 0.5)
    assert st.targets[t].revoke_deadline_s == 0.4 + LEASE_S
    for now in (0.8, 1.2, 1.35):
        for n in (1, 2):
            st.heartbeat(n, [], now)
        st.tick(now)
        assert st.chains[1].version == v
    for n in (1, 2):
        st.heartbeat(n, [], 1.45)
    st.tick(1.45)
    assert st.chains[1].version == v + 1 and st.targets[t].state == S.OFFLINE


def test_a_dead_node_is_not_waited_for() -> None:
    st = _cluster()
    v = st.chains[1].version
    for n in (1, 2):
        st.heartbeat(n, [], 1.05)
    st.tick(1.05)  # node 3 silent for over a lease: dead, its lease ran out too
    assert st.chains[1].version == v + 1
    assert st.targets[3001].state == S.OFFLINE and st.targets[3001].revoke_deadline_s == 0.0


def test_a_revocation_no_longer_needed_is_dropped() -> None:
    st = _cluster()
    for n in (1, 2, 3):
        st.heartbeat(n, [], 0.4)
    t = _fence_tail(st, 0.5)
    assert st.revoked_targets(3) == [t]
    st.targets[t].fenced_until_s = 0.55  # say the fence is lifted before the node answered
    st.tick(0.6)
    assert st.revoked_targets(3) == [] and st.targets[t].state == S.SERVING


def test_a_restarted_node_is_not_revoked() -> None:
    """A re-registered process serves nothing before it has the new routing (storage side)."""
    st = _cluster()
    v = st.chains[1].version
    st.register(node_id=3, kind=NodeKind.STORAGE, host="127.0.0.1", port=9003,
                targets=[TargetInfo(target_id=3001, path="/t")], now_s=0.5)
    assert st.chains[1].version == v + 1 and st.targets[3001].state == S.SYNCING
    assert st.revoked_targets(3) == []


def test_a_stalled_mgmtd_does_not_judge_nodes_on_its_own_silence() -> None:
    """Found by the simulator (seed 620): mgmtd paused past a lease marked every node dead at
    its next tick, before reading the heartbeats that had waited for it."""
    st = _cluster()
    for n in (1, 2, 3):
        st.heartbeat(n, [], 0.4)
    st.tick(0.5)
    v = st.chains[1].version
    st.tick(3.0)  # no tick for 2.5 s: mgmtd itself was stalled
    assert st.chains[1].version == v and all(st.targets[t].state == S.SERVING for t in st.chains[1].targets)
    for n in (1, 2):
        st.heartbeat(n, [], 3.1)
    st.tick(3.2)
    st.tick(3.6)  # node 3 stays silent past the grace (half a lease): now it is dead
    assert st.targets[3001].state == S.OFFLINE


def test_a_restart_held_behind_a_revocation_is_not_served() -> None:
    """Found by the simulator (seed 5146): the head's process restarted (losing a pending
    version the tail had committed) while a revocation held its chain's change; its routing
    still named it the serving head, and it gave the lost version number to other bytes."""
    st = _cluster()
    for n in (1, 2, 3):
        st.heartbeat(n, [], 0.4)
    t = _fence_tail(st, 0.5)
    v = st.chains[1].version
    st.register(node_id=1, kind=NodeKind.STORAGE, host="127.0.0.1", port=9001,
                targets=[TargetInfo(target_id=1001, path="/t")], now_s=0.6)
    assert st.chains[1].version == v  # still held by the revocation of the tail
    assert st.revoked_targets(1) == [1001]  # the restarted head serves nothing meanwhile
    st.heartbeat(3, [], 0.7, revoked_acked=[t])
    assert st.chains[1].version > v and st.targets[1001].state != S.SERVING
    assert st.revoked_targets(1) == []


def test_reports_of_a_restarted_process_are_dropped() -> None:
    """A pending unreachability report from a process that has since restarted says nothing
    about the suspect any more (its forwards died with it)."""
    st = _cluster()
    h, m, t = st.chains[1].targets
    assert st.report_unreachable(reporter_node=h // 1000, reporter_target=h, suspect_target=m, chain_id=1,
                                 chain_version=st.chains[1].version, suspect_reachable=True, now_s=0.5) == 0
    assert h in st.suspicions[1]
    st.register(node_id=h // 1000, kind=NodeKind.STORAGE, host="127.0.0.1", port=9000 + h // 1000,
                targets=[TargetInfo(target_id=h, path="/t")], now_s=0.6)
    assert h not in st.suspicions.get(1, {})
    st.tick(1.5)
    assert st.targets[m].fence_count == 0


def test_an_echo_report_is_not_acted_on_while_the_fence_waits_for_its_revocation() -> None:
    """Found in review (simulator seed 20292): the tail's fence waited for its revocation, so
    the chain version did not move and the head's echo report about the healthy middle stayed
    current and got the middle fenced too half a lease later."""
    st = _cluster()
    for n in (1, 2, 3):
        st.heartbeat(n, [], 0.4)
    h, m, t = st.chains[1].targets
    v = st.chains[1].version
    assert _fence_tail(st, 0.5) == t  # decided; its revocation holds the change
    assert st.report_unreachable(reporter_node=h // 1000, reporter_target=h, suspect_target=m, chain_id=1,
                                 chain_version=v, suspect_reachable=True, now_s=0.55) == 0
    for now in (0.8, 1.2):
        st.heartbeat(1, [], now)
        st.heartbeat(2, [], now)
        st.tick(now)
    assert st.targets[m].fence_count == 0 and st.targets[m].state == S.SERVING
    st.heartbeat(3, [], 1.3, revoked_acked=[t])
    assert st.targets[t].state == S.OFFLINE and st.chains[1].version > v
    st.tick(2.0)
    assert st.targets[m].fence_count == 0 and st.targets[m].state == S.SERVING
