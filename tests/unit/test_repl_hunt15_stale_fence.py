"""Replication hunt (session 15), simulator seed 304678 (profile "replace"): a restarted mgmtd
fenced again every target that had *ever* been fenced. The store keeps ``fenced_until_s`` (a
monotonic deadline of the old process) and a reload turned any non-zero value into a fresh
fence of a whole hold, though it had ended long before. In the seed, the chain's only healthy
serving member (fenced once, early on) went out at the restart, while the head, whose disk had
just been replaced, registered back empty: kept serving as the only member, it became the
resync source for the others and the chain's data was lost (version numbers started again).
The state machine and an in-memory store, no I/O."""

from __future__ import annotations

from loomfs.mgmtd.state import ClusterState
from loomfs.mgmtd.store import MgmtdStore
from loomfs.wire.types import NodeKind, TargetInfo, TargetState

S = TargetState
LEASE_S = 1.0


def _register(st: ClusterState, n: int, now_s: float) -> None:
    st.register(node_id=n, kind=NodeKind.STORAGE, host="h", port=9000 + n,
                targets=[TargetInfo(target_id=n * 1000 + 1, path="/t")], now_s=now_s)


def test_a_fence_that_ended_is_not_back_after_a_mgmtd_restart() -> None:
    st = ClusterState(lease_s=LEASE_S)
    for n in (1, 2, 3):
        _register(st, n, 0.0)
    st.create_chain_table(replicas=3)
    chain = st.chains[1]
    head, mid, tail = chain.targets
    now = 0.0
    st.report_unreachable(reporter_node=mid // 1000, reporter_target=mid, suspect_target=tail, chain_id=1,
                          chain_version=chain.version, suspect_reachable=False, now_s=now)
    for _ in range(int(6 * st.unreachable_hold_s / 0.25)):  # the fence, its end and the resync
        now += 0.25
        for n in (1, 2, 3):
            st.heartbeat(n, [], now)
        st.tick(now)
        if st.targets[tail].state == S.SYNCING:
            st.sync_report(target_id=tail, chain_id=1, chain_version=chain.version, chunks_left=0, bytes_left=0,
                           done=True, now_s=now)
    assert [st.targets[t].state for t in chain.targets] == [S.SERVING] * 3, [st.targets[t] for t in chain.targets]
    store = MgmtdStore("sqlite:///:memory:")
    store.save(st)
    # mgmtd restarts (its monotonic clock starts again) and the nodes heartbeat as usual
    again = ClusterState(lease_s=LEASE_S)
    now = 5.0
    store.load(again, now)
    for _ in range(8):
        now += 0.25
        for n in (1, 2, 3):
            again.heartbeat(n, [], now)
        again.tick(now)
    states = {t: again.targets[t].state for t in again.chains[1].targets}
    assert all(s == S.SERVING for s in states.values()), f"a fence that had ended is back: {states}"
    store.close()
