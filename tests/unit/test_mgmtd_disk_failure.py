"""mgmtd: a target its node reports OFFLINE (a failed fsync took it out of service,
storage.engine.diskfail) leaves its chain at once, without a revocation round (the node stopped
serving it already), stays out while the node keeps reporting it so, and comes back only as a
restarted target: waiting, then syncing from the chain (no I/O)."""

from __future__ import annotations

import pytest

from loomfs.mgmtd.state import ClusterState
from loomfs.wire.types import NodeKind, TargetInfo, TargetState

S = TargetState
LEASE_S = 1.0


def _info(tid: int, state: TargetState = S.SERVING) -> TargetInfo:
    return TargetInfo(target_id=tid, path="/t", state=state)


def _cluster() -> ClusterState:
    st = ClusterState(lease_s=LEASE_S)
    for n in (1, 2, 3):
        st.register(node_id=n, kind=NodeKind.STORAGE, host="127.0.0.1", port=9000 + n,
                    targets=[_info(n * 1000 + 1)], now_s=0.0)
    st.create_chain_table(replicas=3)
    return st


@pytest.mark.parametrize("position", [0, 1, 2])
def test_reported_failure_takes_the_target_out_at_once_and_it_returns_by_resync(position: int) -> None:
    st = _cluster()
    for n in (1, 2, 3):
        st.heartbeat(n, [_info(n * 1000 + 1)], 0.2)
    v, rv = st.chains[1].version, st.version
    t = st.chains[1].targets[position]
    node = t // 1000
    assert st.heartbeat(node, [_info(t, S.OFFLINE)], 0.3) == []  # nothing to revoke: it stopped already
    assert st.version == rv + 1 and st.chains[1].version == v + 1
    assert st.targets[t].state == S.OFFLINE and st.targets[t].failed
    serving = [x for x in st.chains[1].targets if st.targets[x].state == S.SERVING]
    assert t not in serving and len(serving) == 2
    if position == 0:
        assert st.chains[1].targets[0] != t  # a new head
    # it stays out while its node (alive, heartbeating) reports it so
    for now in (0.6, 1.0, 1.4, 3.0):
        st.heartbeat(node, [_info(t, S.OFFLINE)], now)
        for n in {1, 2, 3} - {node}:
            st.heartbeat(n, [_info(n * 1000 + 1)], now)
        st.tick(now)
        assert st.targets[t].state == S.OFFLINE
    # a new process verified it and registers it serving: it rejoins through resync
    st.register(node_id=node, kind=NodeKind.STORAGE, host="127.0.0.1", port=9000 + node,
                targets=[_info(t)], now_s=3.2)
    assert not st.targets[t].failed
    assert st.targets[t].state == S.SYNCING
    assert st.chains[1].targets[-1] == t  # the write tail, fed by the last serving member
    st.sync_report(target_id=t, chain_id=1, chain_version=st.chains[1].version, chunks_left=0, bytes_left=0,
                   done=True, now_s=3.3)
    assert st.targets[t].state == S.SERVING


def test_a_failed_last_serving_member_is_kept_as_lastsrv() -> None:
    """The only serving replica fails: the chain keeps it as LASTSRV (it holds the newest
    data; a new process verifies it before it serves again) rather than serve from nothing."""
    st = _cluster()
    h, m, tail = st.chains[1].targets
    for n in (1, 2):
        st.heartbeat(n, [_info(n * 1000 + 1)], 1.05)
    st.heartbeat(3, [_info(3001, S.OFFLINE)], 1.05)
    st.tick(1.05)
    states = {x: st.targets[x].state for x in (h, m, tail)}
    assert states[3001] == S.OFFLINE
    for n in (1, 2):
        st.heartbeat(n, [_info(n * 1000 + 1, S.OFFLINE)], 1.1)
    assert sorted(st.targets[x].state for x in (1001, 2001)).count(S.LASTSRV) == 1
    assert not any(st.targets[x].state == S.SERVING for x in (1001, 2001, 3001))
