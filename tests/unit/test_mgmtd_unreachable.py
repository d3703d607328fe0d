"""mgmtd: a chain member reports that its successor does not answer (network cut, hung
process) while both still heartbeat; the chain routes around it and heals (no I/O)."""

from __future__ import annotations

from loomfs.mgmtd.state import ClusterState
from loomfs.wire.types import NodeKind, TargetInfo, TargetState

S = TargetState


def _cluster(nodes: int = 4, lease_s: float = 1.0) -> ClusterState:
    st = ClusterState(lease_s=lease_s)
    for n in range(1, nodes + 1):
        st.register(node_id=n, kind=NodeKind.STORAGE, host="127.0.0.1", port=9000 + n,
                    targets=[TargetInfo(target_id=n * 1000 + 1, path="/t")], now_s=0.0)
    st.create_chain_table(replicas=3)
    return st


def _heartbeat_all(st: ClusterState, now_s: float) -> None:
    """Every node heartbeats, saying it stopped serving what mgmtd revoked; mgmtd ticks."""
    for n in st.nodes:
        st.heartbeat(n, [], now_s, revoked_acked=st.revoked_targets(n))
    st.tick(now_s)


def _states(st: ClusterState, chain_id: int) -> list[tuple[int, int]]:
    return [(t, st.targets[t].state) for t in st.chains[chain_id].targets]


def test_suspect_is_fenced_then_rejoins_at_the_tail_and_resyncs() -> None:
    st = _cluster()
    chain = st.chains[1]
    head, succ, tail = chain.targets
    v = chain.version
    # mgmtd reaches the successor, which has a successor of its own it may be waiting for:
    # the report settles for half a lease (the successor reports nothing), then it is fenced
    assert st.report_unreachable(reporter_node=head // 1000, reporter_target=head, suspect_target=succ,
                                 chain_id=1, chain_version=v, suspect_reachable=True, now_s=0.1) == 0
    assert chain.version == v
    st.tick(0.5)
    assert chain.version == v and st.targets[succ].state == S.SERVING
    st.tick(0.65)  # decided: the successor's node is told to stop serving it ...
    assert chain.version == v and st.revoked_targets(succ // 1000) == [succ]
    _heartbeat_all(st, 0.66)  # ... and says it did: only now does the chain change
    assert chain.version > v
    assert chain.targets == [head, tail, succ] and st.targets[succ].state == S.OFFLINE
    # a duplicate report for the old version does nothing
    assert st.report_unreachable(reporter_node=head // 1000, reporter_target=head, suspect_target=succ,
                                 chain_id=1, chain_version=v, suspect_reachable=True, now_s=0.7) == 0
    # heartbeats keep coming; while the hold lasts the target stays out
    _heartbeat_all(st, 1.0)
    assert st.targets[succ].state == S.OFFLINE
    # hold (2 leases from the fence at 0.65) over: it rejoins at the tail, syncing from the last
    # serving member (not the head)
    _heartbeat_all(st, 2.7)
    assert _states(st, 1) == [(head, S.SERVING), (tail, S.SERVING), (succ, S.SYNCING)]
    assert st.sync_report(target_id=succ, chain_id=1, chain_version=st.chains[1].version, chunks_left=0,
                          bytes_left=0, done=True, now_s=2.8)
    assert _states(st, 1) == [(head, S.SERVING), (tail, S.SERVING), (succ, S.SERVING)]


def test_reporter_that_accuses_two_reachable_nodes_is_fenced_itself() -> None:
    st = _cluster(nodes=4)
    chain = st.chains[1]
    a, b, c3 = chain.targets
    assert st.report_unreachable(reporter_node=a // 1000, reporter_target=a, suspect_target=b, chain_id=1,
                                 chain_version=chain.version, suspect_reachable=True, now_s=0.1) == 0
    st.tick(0.65)  # settled: b never reported its own successor, so b is blamed
    _heartbeat_all(st, 0.66)  # b's node stopped serving it
    assert st.targets[b].state == S.OFFLINE
    # the new successor of a is c3 (now the last on the write path: no settling): a cannot
    # reach it either, and mgmtd can: a is the problem
    assert chain.targets[:2] == [a, c3]
    assert st.report_unreachable(reporter_node=a // 1000, reporter_target=a, suspect_target=c3, chain_id=1,
                                 chain_version=chain.version, suspect_reachable=True, now_s=0.7) == a
    _heartbeat_all(st, 0.75)
    assert st.targets[a].state == S.OFFLINE
    assert [t for t in chain.targets if st.targets[t].state == S.SERVING] == [c3]


def test_suspect_mgmtd_cannot_reach_never_blames_the_reporter() -> None:
    """Two successors die one after another (kill two of three): the survivor reports both;
    mgmtd cannot reach them either, so it never fences the survivor, which holds the data."""
    st = _cluster(nodes=3)
    chain = st.chains[1]
    a, b, c3 = chain.targets
    assert st.report_unreachable(reporter_node=a // 1000, reporter_target=a, suspect_target=b, chain_id=1,
                                 chain_version=chain.version, suspect_reachable=False, now_s=0.1) == b
    assert st.report_unreachable(reporter_node=a // 1000, reporter_target=a, suspect_target=c3, chain_id=1,
                                 chain_version=chain.version, suspect_reachable=False, now_s=0.2) == c3
    # their nodes said nothing since 0.0: their leases may run until 1.0, then they are dead
    st.heartbeat(a // 1000, [], 0.9)  # the survivor keeps heartbeating
    st.tick(0.9)
    assert chain.targets == [a, b, c3] and st.targets[b].state == S.SERVING
    st.tick(1.05)
    assert st.targets[a].state == S.SERVING
    assert [t for t in chain.targets if st.targets[t].state == S.SERVING] == [a]


def test_stale_or_bogus_reports_are_ignored() -> None:
    st = _cluster()
    chain = st.chains[1]
    a, b, _ = chain.targets
    v = chain.version
    for kw in (dict(chain_version=v + 5), dict(chain_id=99), dict(reporter_node=a // 1000 + 1)):
        args = dict(reporter_node=a // 1000, reporter_target=a, suspect_target=b, chain_id=1, chain_version=v,
                    suspect_reachable=True, now_s=0.1)
        args.update(kw)
        assert st.report_unreachable(**args) == 0  # type: ignore[arg-type]
    assert chain.version == v


def test_repeated_fences_double_the_hold() -> None:
    st = _cluster(nodes=3, lease_s=1.0)
    chain = st.chains[1]
    a, b, _ = chain.targets
    now = 0.1
    holds = []
    for _ in range(3):
        pos = chain.targets.index(b)
        pred = chain.targets[pos - 1]
        assert st.report_unreachable(reporter_node=pred // 1000, reporter_target=pred, suspect_target=b,
                                     chain_id=1, chain_version=chain.version, suspect_reachable=False,
                                     now_s=now) == b
        holds.append(st.targets[b].fenced_until_s - now)
        _heartbeat_all(st, now + 0.05)  # b's node stopped serving it: out of the chain
        assert st.targets[b].state == S.OFFLINE
        now = st.targets[b].fenced_until_s + 0.01
        _heartbeat_all(st, now)  # back as syncing: write tail again
        assert st.targets[b].state == S.SYNCING
    assert [round(h, 6) for h in holds] == [2.0, 4.0, 8.0]
    del a
