"""Review of 3e01b52 (session 15): a reloaded mgmtd keeps clearing ended fences, but the fence
*escalation* (``fence_count`` doubles the hold while fences come within ``4 * hold`` of the last)
compares ``last_fence_s`` with the new process's monotonic clock. Before 3e01b52 a reload reset
``last_fence_s`` to the load time for every target ever fenced (their ``fenced_until_s`` was never
cleared); since, a target whose fence ended keeps the *old process's* reading. When the new
clock is behind the old one (the host rebooted, or a standby on another host took over,
docs/mgmtd-ha.md) ``now - last_fence_s`` is negative, the quiet period never counts, and every
fence after the restart doubles the hold again, up to 64 holds (a healthy member kept out of its
chain for minutes). The state machine and an in-memory store, no I/O."""

from __future__ import annotations

from loomfs.mgmtd.state import ClusterState
from loomfs.mgmtd.store import MgmtdStore
from loomfs.wire.types import NodeKind, TargetInfo, TargetState

S = TargetState
LEASE_S = 1.0
STEP_S = 0.25


def _register(st: ClusterState, n: int, now_s: float) -> None:
    st.register(node_id=n, kind=NodeKind.STORAGE, host="h", port=9000 + n,
                targets=[TargetInfo(target_id=n * 1000 + 1, path="/t")], now_s=now_s)


def _run(st: ClusterState, now_s: float, seconds: float) -> float:
    """Heartbeats and ticks; a syncing member's resync is reported done at once."""
    end = now_s + seconds
    while now_s < end:
        now_s += STEP_S
        for n in (1, 2, 3):
            st.heartbeat(n, [], now_s)
        st.tick(now_s)
        for t in st.targets.values():
            if t.state == S.SYNCING:
                st.sync_report(target_id=t.target_id, chain_id=t.chain_id, chain_version=st.chains[t.chain_id].version,
                               chunks_left=0, bytes_left=0, done=True, now_s=now_s)
    return now_s


def _fence_tail(st: ClusterState, now_s: float) -> tuple[int, float]:
    """The middle member reports the tail unreachable; returns the tail and its hold."""
    chain = st.chains[1]
    head, mid, tail = chain.targets
    fenced = st.report_unreachable(reporter_node=mid // 1000, reporter_target=mid, suspect_target=tail, chain_id=1,
                                   chain_version=chain.version, suspect_reachable=False, now_s=now_s)
    assert fenced == tail, (fenced, [st.targets[t] for t in chain.targets])
    return tail, st.targets[tail].fenced_until_s - now_s


def test_a_fence_after_a_restart_on_a_clock_behind_the_old_one_is_not_escalated() -> None:
    old = ClusterState(lease_s=LEASE_S)
    now = 50_000.0  # the old mgmtd's host had been up for a long time
    for n in (1, 2, 3):
        _register(old, n, now)
    old.create_chain_table(replicas=3)
    _, hold = _fence_tail(old, now)
    assert hold == old.unreachable_hold_s
    now = _run(old, now, 8 * old.unreachable_hold_s)  # the fence ends, the tail resyncs
    assert [old.targets[t].state for t in old.chains[1].targets] == [S.SERVING] * 3
    store = MgmtdStore("sqlite:///:memory:")
    store.save(old)
    # mgmtd restarts on a host that just booted: its monotonic clock is far behind the old one
    new = ClusterState(lease_s=LEASE_S)
    now = 30.0
    store.load(new, now)
    store.close()
    now = _run(new, now, 2.0)
    assert [new.targets[t].state for t in new.chains[1].targets] == [S.SERVING] * 3
    # well past the quiet period (4 holds) since the restart, the tail is reported again: a first
    # fence in a long while, one hold, as it would be without the restart
    now = _run(new, now, 5 * new.unreachable_hold_s)
    _, hold = _fence_tail(new, now)
    assert hold == new.unreachable_hold_s, f"fence escalated across the restart: held {hold}s"
    now = _run(new, now, 8 * new.unreachable_hold_s)
    _, hold = _fence_tail(new, now)
    assert hold == new.unreachable_hold_s, f"fence escalated across the restart: held {hold}s"
