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


def _info(tid: int, state: TargetState = S.SERVING, *, verified: bool = False) -> TargetInfo:
    return TargetInfo(target_id=tid, path="/t", state=state, verified=verified)


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
                targets=[_info(t, verified=True)], now_s=3.2)
    assert st.verify_targets(node) == []
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


def _fail_and_save(tmp_path, t: int):  # type: ignore[no-untyped-def]
    """Target ``t`` reported failed; mgmtd's state saved and loaded by a new mgmtd process."""
    from loomfs.mgmtd.store import MgmtdStore

    st = _cluster()
    st.heartbeat(t // 1000, [_info(t, S.OFFLINE)], 0.3)
    store = MgmtdStore(f"sqlite:///{tmp_path}/mgmtd.db")
    store.save(st)
    again = ClusterState(lease_s=LEASE_S)
    store.load(again, 10.0)
    store.close()
    return again


@pytest.mark.parametrize("how", ["register", "heartbeat"])
def test_a_failed_target_serves_again_only_once_its_node_verified_it(tmp_path, how: str) -> None:  # type: ignore[no-untyped-def]
    """Reviewer's R5: the FSYNC_FAILED marker that makes a new process verify a target is best
    effort (the failing disk may refuse it too); mgmtd forgot the failure when the restarted
    process registered the target SERVING, so its rotten chunks counted as replicas (resync
    finds equal rows and copies nothing). mgmtd keeps the failure (across its own restarts:
    the store), asks the node to verify, and lets the target back only once it says verified."""
    st = _fail_and_save(tmp_path, 2001)
    assert st.targets[2001].failed and st.targets[2001].state == S.OFFLINE
    # the restarted process did not verify (no marker): it says SERVING, not verified
    for n in (1, 3):
        st.register(node_id=n, kind=NodeKind.STORAGE, host="127.0.0.1", port=9000 + n,
                    targets=[_info(n * 1000 + 1)], now_s=10.1)
    st.register(node_id=2, kind=NodeKind.STORAGE, host="127.0.0.1", port=9002, targets=[_info(2001)], now_s=10.1)
    assert st.targets[2001].failed and st.targets[2001].state == S.OFFLINE
    assert st.verify_targets(2) == [2001] and st.verify_targets(1) == []
    for now in (10.5, 11.0):  # heartbeats of an unverified process change nothing
        for n in (1, 2, 3):
            st.heartbeat(n, [_info(n * 1000 + 1)], now)
        st.tick(now)
        assert st.targets[2001].failed and st.targets[2001].state == S.OFFLINE
    st.heartbeat(2, [_info(2001, S.OFFLINE)], 11.2)  # verifying now (out of service)
    assert st.targets[2001].failed
    done = [_info(2001, verified=True)]
    if how == "register":  # (or a process that verified at start-up registers again)
        st.register(node_id=2, kind=NodeKind.STORAGE, host="127.0.0.1", port=9002, targets=done, now_s=11.5)
    else:
        st.heartbeat(2, done, 11.5)
    assert not st.targets[2001].failed and st.verify_targets(2) == []
    assert st.targets[2001].state in (S.WAITING, S.SYNCING)  # rejoins through resync


def test_a_new_target_reported_serving_is_not_asked_to_verify() -> None:
    st = _cluster()
    assert all(st.verify_targets(n) == [] for n in (1, 2, 3))
    assert not any(t.failed for t in st.targets.values())


def test_verified_and_verify_targets_decode_from_older_peers() -> None:
    """An older node sends no ``verified`` (read: not verified, the safe side) and an older
    mgmtd no ``verify_targets`` (nothing asked); newer fields are ignored by older decoders."""
    from loomfs.wire.mgmtd import RegisterNodeRsp

    old = {k: v for k, v in TargetInfo(target_id=5, verified=True).to_wire().items() if k != "verified"}
    assert TargetInfo.from_wire(old).verified is False
    assert TargetInfo.from_wire(TargetInfo(target_id=5, verified=True).to_wire()).verified is True
    rsp = {k: v for k, v in RegisterNodeRsp(node_id=2, verify_targets=[2001]).to_wire().items() if k != "verify_targets"}
    assert RegisterNodeRsp.from_wire(rsp).verify_targets == []
    assert RegisterNodeRsp.from_wire(RegisterNodeRsp(verify_targets=[2001]).to_wire()).verify_targets == [2001]
