"""Target-state transitions (pure) and the cluster state machine built on them."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from loomfs.mgmtd.state import ClusterState
from loomfs.mgmtd.transitions import Member, plan_chain
from loomfs.wire.types import NodeKind, TargetInfo, TargetState

S = TargetState


def _m(tid: int, state: S, alive: bool = True, **kw: object) -> Member:
    return Member(target_id=tid, node_id=tid, state=state, alive=alive, **kw)  # type: ignore[arg-type]


def _states(plan_members: list[Member]) -> list[tuple[int, S]]:
    return [(m.target_id, m.state) for m in plan_members]


def test_dead_middle_goes_offline_and_moves_to_the_end() -> None:
    p = plan_chain([_m(1, S.SERVING), _m(2, S.SERVING, alive=False), _m(3, S.SERVING)])
    assert _states(p.members) == [(1, S.SERVING), (3, S.SERVING), (2, S.OFFLINE)]


def test_serving_tail_becomes_lastsrv_when_all_are_lost_at_once() -> None:
    """Found by the simulator (seed 620): the head was kept as the last serving member, but
    commits happen at the tail first — the head may lack the newest acknowledged (and served)
    versions, and resyncing the tail from it was refused forever (never go backwards)."""
    p = plan_chain([_m(1, S.SERVING, alive=False), _m(2, S.SERVING, alive=False), _m(3, S.OFFLINE, alive=False)])
    assert dict(_states(p.members)) == {1: S.OFFLINE, 2: S.LASTSRV, 3: S.OFFLINE}
    # one at a time, the last one standing is the lastsrv, wherever it sits
    p = plan_chain([_m(1, S.SERVING, alive=False), _m(2, S.OFFLINE, alive=False)])
    assert dict(_states(p.members)) == {1: S.LASTSRV, 2: S.OFFLINE}


def test_returning_target_syncs_at_tail_then_serves() -> None:
    p = plan_chain([_m(1, S.SERVING), _m(3, S.SERVING), _m(2, S.OFFLINE)])
    assert _states(p.members) == [(1, S.SERVING), (3, S.SERVING), (2, S.SYNCING)]
    p2 = plan_chain([*p.members[:2], Member(**{**_asdict(p.members[2]), "sync_done": True})])
    assert _states(p2.members) == [(1, S.SERVING), (3, S.SERVING), (2, S.SERVING)]


def _asdict(m: Member) -> dict[str, object]:
    return {f: getattr(m, f) for f in Member.__slots__}


def test_one_sync_at_a_time() -> None:
    p = plan_chain([_m(1, S.SERVING), _m(2, S.OFFLINE), _m(3, S.OFFLINE)])
    assert dict(_states(p.members)) == {1: S.SERVING, 2: S.SYNCING, 3: S.WAITING}


def test_chain_waits_for_lastsrv_then_recovers_from_it() -> None:
    p = plan_chain([_m(1, S.LASTSRV, alive=False), _m(2, S.OFFLINE), _m(3, S.OFFLINE)])
    assert dict(_states(p.members)) == {1: S.LASTSRV, 2: S.WAITING, 3: S.WAITING}
    p = plan_chain([Member(**{**_asdict(x), "alive": True}) for x in p.members])
    assert dict(_states(p.members)) == {1: S.SERVING, 2: S.SYNCING, 3: S.WAITING}
    assert p.members[0].target_id == 1


def test_no_serving_no_lastsrv_is_not_stuck() -> None:
    p = plan_chain([_m(1, S.WAITING), _m(2, S.OFFLINE, alive=False)])
    assert dict(_states(p.members)) == {1: S.SERVING, 2: S.OFFLINE}


def test_restarted_serving_target_resyncs_when_others_serve() -> None:
    p = plan_chain([_m(1, S.SERVING, restarted=True), _m(2, S.SERVING), _m(3, S.SERVING)])
    assert _states(p.members) == [(2, S.SERVING), (3, S.SERVING), (1, S.SYNCING)]
    alone = plan_chain([_m(1, S.SERVING, restarted=True), _m(2, S.OFFLINE, alive=False)])
    assert dict(_states(alone.members)) == {1: S.SERVING, 2: S.OFFLINE}


def test_long_offline_target_replaced_by_spare_on_other_node() -> None:
    chain = [_m(1, S.SERVING), _m(2, S.SERVING), _m(3, S.OFFLINE, alive=False, offline_since_s=0.0)]
    spares = [_m(11, S.SERVING), Member(target_id=12, node_id=1, state=S.SERVING)]
    assert plan_chain(chain, spares=spares, now_s=5.0, replace_after_s=10.0).removed == []
    p = plan_chain(chain, spares=spares, now_s=11.0, replace_after_s=10.0)
    assert p.removed == [3] and p.added == [11]
    assert _states(p.members) == [(1, S.SERVING), (2, S.SERVING), (11, S.SYNCING)]


def test_lastsrv_is_never_replaced() -> None:
    chain = [_m(1, S.LASTSRV, alive=False, offline_since_s=0.0), _m(2, S.OFFLINE, alive=False)]
    p = plan_chain(chain, spares=[_m(11, S.SERVING)], now_s=1e6, replace_after_s=10.0)
    assert p.removed == [] and p.added == []


def test_drain_adds_spare_then_drops_member() -> None:
    chain = [_m(1, S.SERVING, draining=True), _m(2, S.SERVING), _m(3, S.SERVING)]
    p = plan_chain(chain, spares=[_m(11, S.SERVING)], replicas=3)
    assert p.added == [11] and p.removed == []
    assert dict(_states(p.members))[11] == S.SYNCING
    # while syncing nothing else changes
    assert plan_chain(p.members, spares=[], replicas=3).targets() == p.targets()
    synced = [Member(**{**_asdict(x), "sync_done": x.target_id == 11}) for x in p.members]
    p2 = plan_chain(synced, spares=[], replicas=3)
    assert p2.removed == [1]
    assert _states(p2.members) == [(2, S.SERVING), (3, S.SERVING), (11, S.SERVING)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=1, max_size=30), st.integers(0, 2 ** 16))
def test_never_stuck_and_fixed_point(flips: list[tuple[int, bool]], seed: int) -> None:
    """Any sequence of deaths and returns, then everyone alive with syncs finishing: the chain
    ends with all members serving; and plan_chain on its own output changes nothing."""
    ms = [_m(i, S.SERVING) for i in range(3)]
    for idx, alive in flips:
        ms = [Member(**{**_asdict(m), "alive": alive if m.target_id == idx else m.alive}) for m in ms]
        p = plan_chain(ms)
        assert plan_chain(p.members).members == p.members  # fixed point
        assert sum(m.state == S.SYNCING for m in p.members) <= 1
        assert sum(m.state == S.LASTSRV for m in p.members) <= 1
        ms = p.members
    ms = [Member(**{**_asdict(m), "alive": True}) for m in ms]
    for _ in range(5):
        ms = [Member(**{**_asdict(m), "sync_done": m.state == S.SYNCING}) for m in plan_chain(ms).members]
    assert all(m.state == S.SERVING for m in plan_chain(ms).members)


def _cluster() -> ClusterState:
    c = ClusterState(lease_s=5.0, replace_after_s=30.0)
    for n in (1, 2, 3):
        c.register(node_id=n, kind=NodeKind.STORAGE, host="h", port=9000 + n,
                   targets=[TargetInfo(target_id=n * 1000 + 1, path="/t")], now_s=0.0)
    c.create_chain_table(replicas=3)
    return c


def test_cluster_spare_rebuild_and_chain_version_bumps() -> None:
    c = _cluster()
    chain = c.chains[1]
    v0 = chain.version
    for n in (1, 2):
        c.heartbeat(n, [], 4.0)
    c.register(node_id=4, kind=NodeKind.STORAGE, host="h", port=9004,
               targets=[TargetInfo(target_id=4001, path="/t")], now_s=4.0)
    assert c.targets[4001].chain_id == 0  # spare
    assert c.tick(5.5)
    assert chain.version == v0 + 1 and c.targets[3001].state == S.OFFLINE
    for n in (1, 2, 4):
        c.heartbeat(n, [], 30.0)
    assert not c.tick(30.0)
    for n in (1, 2, 4):
        c.heartbeat(n, [], 36.0)
    assert c.tick(36.0)  # offline 30.5 s > replace_after_s
    assert 3001 not in chain.targets and chain.targets[-1] == 4001
    assert c.targets[4001].state == S.SYNCING and c.targets[3001].chain_id == 0
    assert not c.sync_report(target_id=4001, chain_id=1, chain_version=chain.version - 1, chunks_left=0,
                             bytes_left=0, done=True, now_s=36.0)  # stale version refused
    assert c.sync_report(target_id=4001, chain_id=1, chain_version=chain.version, chunks_left=5,
                         bytes_left=500, done=False, now_s=36.0)
    t = next(t for t in c.routing().targets if t.target_id == 4001)
    assert (t.sync_chunks_left, t.sync_bytes_left) == (5, 500)
    c.sync_report(target_id=4001, chain_id=1, chain_version=chain.version, chunks_left=0, bytes_left=0,
                  done=True, now_s=37.0)
    assert [c.targets[x].state for x in chain.targets] == [S.SERVING] * 3


def test_cluster_restart_of_storage_process_resyncs() -> None:
    c = _cluster()
    c.register(node_id=2, kind=NodeKind.STORAGE, host="h", port=9002,
               targets=[TargetInfo(target_id=2001, path="/t")], now_s=1.0)
    assert c.targets[2001].state == S.SYNCING
    assert c.chains[1].targets[-1] == 2001
