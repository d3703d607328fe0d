"""mgmtd: position-aware blame for unreachability reports (no I/O).

One hung member makes every member upstream of it time out too: with chain [H, M, T] and T
hung, H reports M and M reports T at about the same time, in either order. Only T may be
fenced; a healthy middle never is. A middle that is really cut off (it reports nothing) is.
"""

from __future__ import annotations

import asyncio

import pytest

from loomfs.common.clock import ManualClock
from loomfs.mgmtd.service import MgmtdService
from loomfs.mgmtd.state import ClusterState
from loomfs.mgmtd.transitions import Suspicion, pick_suspicion
from loomfs.net.rpc import CallContext
from loomfs.wire import mgmtd as w
from loomfs.wire.types import NodeKind, TargetInfo, TargetState

S = TargetState
LEASE_S = 1.0  # settle window: half a lease
SETTLE_S = 0.5


def _cluster(replicas: int = 3, lease_s: float = LEASE_S, start_s: float = 0.0) -> ClusterState:
    st = ClusterState(lease_s=lease_s)
    for n in range(1, replicas + 1):
        st.register(node_id=n, kind=NodeKind.STORAGE, host="127.0.0.1", port=9000 + n,
                    targets=[TargetInfo(target_id=n * 1000 + 1, path="/t")], now_s=start_s)
    st.create_chain_table(replicas=replicas)
    return st


def _report(st: ClusterState, reporter: int, suspect: int, *, reachable: bool, now_s: float,
            version: int | None = None) -> int:
    return st.report_unreachable(
        reporter_node=reporter // 1000, reporter_target=reporter, suspect_target=suspect, chain_id=1,
        chain_version=st.chains[1].version if version is None else version, suspect_reachable=reachable,
        now_s=now_s,
    )


def _tick(st: ClusterState, now_s: float, *, silent: tuple[int, ...] = ()) -> None:
    """Every node but ``silent`` heartbeats (a gray failure still heartbeats), saying it stopped
    serving what mgmtd revoked (the fence applies then), then mgmtd ticks."""
    for n in st.nodes:
        if n not in silent:
            st.heartbeat(n, [], now_s, revoked_acked=st.revoked_targets(n))
    st.tick(now_s)


def _serving(st: ClusterState) -> list[int]:
    return [t for t in st.chains[1].targets if st.targets[t].state == S.SERVING]


def _never_fenced(st: ClusterState, *targets: int) -> None:
    for t in targets:
        assert st.targets[t].fence_count == 0 and st.targets[t].state == S.SERVING, st.targets[t]


@pytest.mark.parametrize("tail_answers_probe", [True, False])  # gray (pings answered) or hung
def test_hung_tail_head_report_first_fences_the_tail_not_the_middle(tail_answers_probe: bool) -> None:
    st = _cluster()
    h, m, t = st.chains[1].targets
    v = st.chains[1].version
    # H's forward to M times out first (it started first); mgmtd reaches M: pending
    assert _report(st, h, m, reachable=True, now_s=1.0) == 0
    assert set(st.suspicions[1]) == {h}
    _tick(st, 1.2)
    _never_fenced(st, m)
    # M's report about T: T is the last on the write path, so it is decided at once
    assert _report(st, m, t, reachable=tail_answers_probe, now_s=1.3) == t
    _tick(st, 1.35)  # T's node says it stopped serving T: the chain changes
    assert st.chains[1].version > v
    assert st.chains[1].targets == [h, m, t] and st.targets[t].state == S.OFFLINE
    # H's report was upstream of M's: dropped with the old chain version, never acted on
    for now in (1.6, 2.0, 3.0):
        _tick(st, now)
    _never_fenced(st, h, m)
    assert st.suspicions == {}
    assert st.nodes[1].accusations == {}  # an echo is no accusation against H's record


@pytest.mark.parametrize("tail_answers_probe", [True, False])
def test_hung_tail_middle_report_first_fences_the_tail_not_the_middle(tail_answers_probe: bool) -> None:
    st = _cluster()
    h, m, t = st.chains[1].targets
    v = st.chains[1].version
    assert _report(st, m, t, reachable=tail_answers_probe, now_s=1.0) == t
    # H's report (sent under the old version) arrives later: stale
    assert _report(st, h, m, reachable=True, now_s=1.05, version=v) == 0
    for now in (1.6, 2.0):
        _tick(st, now)
    _never_fenced(st, h, m)
    assert _serving(st) == [h, m]


def test_middle_report_still_being_probed_holds_the_head_report() -> None:
    """M's report arrived but mgmtd's probe of the hung T takes up to half a lease: H's
    report must not be settled against M meanwhile, even past its settle window."""
    st = _cluster()
    h, m, t = st.chains[1].targets
    assert _report(st, h, m, reachable=True, now_s=1.0) == 0
    assert st.note_report(reporter_node=m // 1000, reporter_target=m, suspect_target=t, chain_id=1,
                          chain_version=st.chains[1].version, now_s=1.05)
    _tick(st, 1.0 + SETTLE_S + 0.1)
    _tick(st, 1.0 + SETTLE_S + 0.3)
    _never_fenced(st, m)
    # the probe of T times out: T is fenced (the settle window ran from M's note, not now)
    assert _report(st, m, t, reachable=False, now_s=1.8) == t
    _never_fenced(st, h, m)


def test_probe_that_never_finishes_stops_holding_after_a_lease() -> None:
    st = _cluster()
    h, m, t = st.chains[1].targets
    assert _report(st, h, m, reachable=True, now_s=1.0) == 0
    assert st.note_report(reporter_node=m // 1000, reporter_target=m, suspect_target=t, chain_id=1,
                          chain_version=st.chains[1].version, now_s=1.0)
    _tick(st, 1.9)
    _never_fenced(st, m)
    _tick(st, 2.1)  # M's report is forgotten after a lease: H's report is the one left, and due
    _tick(st, 2.2)
    assert st.targets[m].state == S.OFFLINE


def test_cut_middle_that_reports_nothing_is_fenced_after_the_settle_window() -> None:
    st = _cluster()
    h, m, t = st.chains[1].targets
    v = st.chains[1].version
    assert _report(st, h, m, reachable=True, now_s=1.0) == 0
    _tick(st, 1.0 + SETTLE_S - 0.1)
    assert st.chains[1].version == v
    _tick(st, 1.0 + SETTLE_S + 0.1)
    _tick(st, 1.0 + SETTLE_S + 0.2)
    assert st.chains[1].version > v
    assert st.targets[m].state == S.OFFLINE and st.targets[m].fence_count == 1
    assert st.chains[1].targets == [h, t, m]
    _never_fenced(st, h, t)
    assert st.nodes[1].accusations == {2: 1.0 + SETTLE_S + 0.1}


def test_unreachable_middle_is_fenced_at_once() -> None:
    """mgmtd cannot reach M either: M is the fault whatever lies behind it."""
    st = _cluster()
    h, m, t = st.chains[1].targets
    assert _report(st, h, m, reachable=False, now_s=1.0) == m
    _never_fenced(st, h, t)


def test_four_member_chain_with_a_gray_third_member() -> None:
    """[A, B, C, D]: C answers pings but forwards nothing (so it reports nothing). A and B
    both time out and report; only C is fenced."""
    st = _cluster(replicas=4)
    a, b, c, d = st.chains[1].targets
    assert _report(st, a, b, reachable=True, now_s=1.0) == 0
    assert _report(st, b, c, reachable=True, now_s=1.1) == 0
    _tick(st, 1.0 + SETTLE_S + 0.05)  # A's window is over, but B's (downstream) is not
    _never_fenced(st, b, c)
    _tick(st, 1.1 + SETTLE_S + 0.05)
    _tick(st, 1.1 + SETTLE_S + 0.1)
    assert st.targets[c].state == S.OFFLINE
    _never_fenced(st, a, b, d)
    assert st.chains[1].targets == [a, b, d, c]


@pytest.mark.parametrize("order", ["head_first", "middle_first"])
def test_four_member_chain_with_a_hung_tail(order: str) -> None:
    st = _cluster(replicas=4)
    a, b, c, d = st.chains[1].targets
    v = st.chains[1].version
    reports = [(a, b, True), (b, c, True), (c, d, False)]
    if order == "middle_first":
        reports.reverse()
    for i, (rep, sus, reachable) in enumerate(reports):
        _report(st, rep, sus, reachable=reachable, now_s=1.0 + 0.01 * i, version=v)
    for now in (1.4, 1.8, 2.5):
        _tick(st, now)
    assert st.targets[d].state == S.OFFLINE
    _never_fenced(st, a, b, c)


def test_stale_pending_reports_are_dropped_when_the_chain_changes() -> None:
    """H's pending report about M is dropped when T's lease lapses (the chain changed)."""
    st = _cluster()
    h, m, t = st.chains[1].targets
    assert not st.note_report(reporter_node=h // 1000, reporter_target=h, suspect_target=m, chain_id=1,
                              chain_version=st.chains[1].version - 1, now_s=0.5)
    assert _report(st, h, m, reachable=True, now_s=0.9) == 0
    _tick(st, 1.05, silent=(3,))  # node 3 silent for over a lease: T offline, chain version bumps
    assert st.targets[t].state == S.OFFLINE
    assert st.suspicions == {}
    for now in (1.5, 2.0):
        _tick(st, now, silent=(3,))
    _never_fenced(st, h, m)


def test_kill_two_of_three_survivor_is_never_fenced() -> None:
    st = _cluster()
    a, b, c = st.chains[1].targets
    assert _report(st, a, b, reachable=False, now_s=0.1) == b
    assert _report(st, a, c, reachable=False, now_s=0.2) == c
    _tick(st, 0.9)
    assert _serving(st) == [a]
    assert st.targets[a].fence_count == 0


def test_decisions_are_deterministic() -> None:
    def run() -> list[tuple[int, int, int]]:
        st = _cluster(replicas=4)
        a, b, c, d = st.chains[1].targets
        _report(st, a, b, reachable=True, now_s=1.0)
        _report(st, b, c, reachable=True, now_s=1.2)
        _tick(st, 1.6)
        _tick(st, 1.8)
        return [(x, st.targets[x].state, st.targets[x].fence_count) for x in st.chains[1].targets]

    assert run() == run()


def test_pick_suspicion_rules() -> None:
    path = [1, 2, 3]

    def r(rep: int, sus: int, reachable: bool | None, at: float = 0.0) -> Suspicion:
        return Suspicion(reporter_node=rep, reporter_target=rep, suspect_target=sus, chain_version=1,
                         received_s=at, suspect_reachable=reachable)

    assert pick_suspicion(path, [], now_s=9, settle_s=1) is None
    assert pick_suspicion(path, [r(1, 2, True)], now_s=0.5, settle_s=1) is None  # settling
    assert pick_suspicion(path, [r(1, 2, True)], now_s=1.0, settle_s=1) == r(1, 2, True)
    assert pick_suspicion(path, [r(1, 2, False)], now_s=0.0, settle_s=1) == r(1, 2, False)
    assert pick_suspicion(path, [r(2, 3, True)], now_s=0.0, settle_s=1) == r(2, 3, True)  # tail
    assert pick_suspicion(path, [r(1, 2, True), r(2, 3, None)], now_s=5, settle_s=1) is None  # probing
    assert pick_suspicion(path, [r(1, 2, False), r(2, 3, True, 0.5)], now_s=0.6, settle_s=1) == r(2, 3, True, 0.5)
    assert pick_suspicion(path, [r(9, 3, False)], now_s=0, settle_s=1) is None  # not on the write path


def test_service_reports_pending_then_tick_decides() -> None:
    """The RPC adapter: H's report answers fenced_target_id=0 while pending; M's report is
    noted before its (slow) probe, so a tick during the probe does not fence M."""
    st = _cluster(start_s=1000.0)
    h, m, t = st.chains[1].targets
    clock = ManualClock(start_s=1000.0)
    svc: MgmtdService

    async def probe(host: str, port: int) -> bool:
        if port == 9003:  # T hangs: the probe times out after half a lease, ticks run meanwhile
            for _ in range(3):
                clock.advance(0.2)
                for n in (1, 2, 3):
                    st.heartbeat(n, [], clock.monotonic())
                svc.tick()
            return False
        return True

    svc = MgmtdService(st, None, heartbeat_interval_s=0.3, clock=clock, probe=probe)
    ctx = CallContext(payload=memoryview(b""), request_id=1, peer="test", deadline=None)
    v = st.chains[1].version

    def req(rep: int, sus: int) -> w.ReportUnreachableReq:
        return w.ReportUnreachableReq(node_id=rep // 1000, target_id=rep, suspect_target_id=sus, chain_id=1,
                                      chain_version=v, reason="test")

    async def scenario() -> tuple[w.ReportUnreachableRsp, w.ReportUnreachableRsp]:
        first = await svc.report_unreachable(req(h, m), ctx)
        clock.advance(0.05)
        second = await svc.report_unreachable(req(m, t), ctx)
        return first, second

    first, second = asyncio.run(scenario())
    assert first.fenced_target_id == 0
    assert second.fenced_target_id == t
    assert st.targets[t].state == S.SERVING and st.revoked_targets(3) == [t]  # T's node may still serve
    clock.advance(0.2)
    st.heartbeat(3, [], clock.monotonic(), revoked_acked=[t])
    svc.tick()
    assert st.targets[t].state == S.OFFLINE
    _never_fenced(st, h, m)
    clock.advance(2.0)
    for n in (1, 2):
        st.heartbeat(n, [], clock.monotonic())
    svc.tick()
    _never_fenced(st, h, m)
