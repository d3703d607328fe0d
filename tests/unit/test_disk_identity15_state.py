"""Replaced disks (session 15 follow-up): a target that comes back under its id with another
format id (its disk was replaced, wiped or reformatted) holds none of its chain's data. mgmtd
must never make it the chain's serving copy from its own contents: it resyncs from a serving
member, or the chain waits when no member holds the data. The state machine, no I/O."""

from __future__ import annotations

import pytest

from loomfs.mgmtd import diskident
from loomfs.mgmtd.state import ClusterState
from loomfs.mgmtd.store import MgmtdStore
from loomfs.wire.mgmtd import TargetFormat
from loomfs.wire.types import NodeKind, NodeState, TargetInfo, TargetState

S = TargetState
LEASE_S = 1.0


def fid(n: int, gen: int = 0) -> str:
    return f"{n:016x}{gen:016x}"


def _register(st: ClusterState, n: int, now_s: float, *, gen: int = 0, formats: bool = True,
              formatted_now: bool = False) -> None:
    tid = n * 1000 + 1
    st.register(node_id=n, kind=NodeKind.STORAGE, host="h", port=9000 + n,
                targets=[TargetInfo(target_id=tid, path="/t")], now_s=now_s,
                formats=[TargetFormat(target_id=tid, format_id=fid(n, gen), formatted_now=formatted_now)]
                if formats else None)


def _cluster(nodes: int = 3, replicas: int = 3, *, formats: bool = True) -> ClusterState:
    st = ClusterState(lease_s=LEASE_S)
    for n in range(1, nodes + 1):
        _register(st, n, 0.0, formats=formats)
    st.create_chain_table(replicas=replicas)
    return st


def _beat(st: ClusterState, now_s: float, nodes: tuple[int, ...]) -> None:
    for n in nodes:
        st.heartbeat(n, [], now_s)
    st.tick(now_s)


def _states(st: ClusterState, chain_id: int = 1) -> dict[int, TargetState]:
    return {t: TargetState(st.targets[t].state) for t in st.chains[chain_id].targets}


def _finish_syncs(st: ClusterState, now_s: float) -> None:
    for t in st.targets.values():
        if t.state == S.SYNCING:
            st.sync_report(target_id=t.target_id, chain_id=t.chain_id, chain_version=st.chains[t.chain_id].version,
                           chunks_left=0, bytes_left=0, done=True, now_s=now_s)


def test_a_new_cluster_records_every_format_id_and_serves() -> None:
    st = _cluster()
    assert {t.format_id for t in st.targets.values()} == {fid(1), fid(2), fid(3)}
    assert set(_states(st).values()) == {S.SERVING}
    assert diskident.blank_targets(st) == []


def test_a_restart_on_the_same_disk_is_a_plain_restart() -> None:
    st = _cluster()
    head = st.chains[1].targets[0]
    _beat(st, 0.5, (1, 2, 3))
    _register(st, head // 1000, 0.6)  # same format id
    assert not st.targets[head].blank
    assert _states(st)[head] in (S.WAITING, S.SYNCING)  # the usual restart rule (others serve)


def test_a_replaced_disk_resyncs_from_the_chain_when_others_serve() -> None:
    st = _cluster()
    head = st.chains[1].targets[0]
    _beat(st, 0.5, (1, 2, 3))
    _register(st, head // 1000, 0.6, gen=1)
    assert st.targets[head].blank and st.targets[head].format_id == fid(head // 1000, 1)
    assert _states(st)[head] != S.SERVING
    now = 0.6
    for _ in range(4):
        now += 0.25
        _beat(st, now, (1, 2, 3))
    assert _states(st)[head] == S.SYNCING
    assert st.chains[1].targets[-1] == head  # the write tail, behind the serving members
    _finish_syncs(st, now)
    assert _states(st)[head] == S.SERVING and not st.targets[head].blank


def test_a_replaced_disk_is_never_the_only_serving_copy() -> None:
    """The gap: the head's disk is replaced while the other members are down. A restarted head
    is kept serving as the chain's only member (it may hold the newest data); an empty one must
    not be: the chain waits until a member that holds its data returns."""
    st = _cluster()
    head, mid, tail = st.chains[1].targets
    now = 0.0
    for _ in range(8):  # mid and tail go silent: the head serves alone
        now += 0.25
        _beat(st, now, (head // 1000,))
    assert _states(st) == {head: S.SERVING, mid: S.OFFLINE, tail: S.OFFLINE}
    _register(st, head // 1000, now, gen=1)  # back fast (within its lease) on a new, empty disk
    for _ in range(8):
        now += 0.25
        _beat(st, now, (head // 1000,))
        assert S.SERVING not in _states(st).values(), _states(st)
    assert st.targets[head].blank and _states(st)[head] == S.LASTSRV  # the loss's marker, never serving
    # the tail returns, but it was down while the head served alone: it lacks the writes acked
    # since, so it is not served in the head's place (review, session 15); the chain waits for
    # an operator to accept the loss
    _register(st, tail // 1000, now)
    for _ in range(4):
        now += 0.25
        _beat(st, now, (head // 1000, tail // 1000))
    assert _states(st)[tail] == S.WAITING and _states(st)[head] == S.LASTSRV, _states(st)


def test_an_empty_last_serving_member_does_not_serve_when_it_returns() -> None:
    """The chain's last serving member dies (LASTSRV), and comes back with a new disk."""
    st = _cluster()
    head, mid, tail = st.chains[1].targets
    now = 0.0
    for _ in range(8):
        now += 0.25
        _beat(st, now, (head // 1000,))
    for _ in range(8):  # the head dies too: it is the last serving member
        now += 0.25
        _beat(st, now, ())
    assert _states(st)[head] == S.LASTSRV
    _register(st, head // 1000, now, gen=1)
    for _ in range(4):
        now += 0.25
        _beat(st, now, (head // 1000,))
    # the chain's newest copy is gone: the blank head stays lastsrv (the loss's marker, never
    # serving), so neither it nor a member behind it serves until an operator accepts the loss
    assert _states(st)[head] == S.LASTSRV and st.targets[head].blank, _states(st)
    assert S.SERVING not in _states(st).values()


def test_a_wipe_during_a_resync_restarts_it_under_a_new_chain_version() -> None:
    st = _cluster()
    head, mid, tail = st.chains[1].targets
    now = 0.0
    for _ in range(8):
        now += 0.25
        _beat(st, now, (1, 2, 3) if tail // 1000 != 3 else (head // 1000, mid // 1000))
    _register(st, tail // 1000, now)
    for _ in range(4):
        now += 0.25
        _beat(st, now, (1, 2, 3))
    assert _states(st)[tail] == S.SYNCING
    old_version = st.chains[1].version
    _register(st, tail // 1000, now, gen=1)  # the syncing target's disk replaced mid-resync
    # the predecessor's report of the old resync is refused (it copied onto the lost disk)
    assert not st.sync_report(target_id=tail, chain_id=1, chain_version=old_version, chunks_left=0, bytes_left=0,
                              done=True, now_s=now)
    assert st.chains[1].version > old_version and _states(st)[tail] != S.SERVING
    for _ in range(4):
        now += 0.25
        _beat(st, now, (1, 2, 3))
    assert _states(st)[tail] == S.SYNCING and st.targets[tail].blank
    _finish_syncs(st, now)
    assert _states(st)[tail] == S.SERVING and not st.targets[tail].blank


def test_a_new_format_id_reported_by_a_heartbeat_takes_the_target_out_too() -> None:
    st = _cluster()
    head = st.chains[1].targets[0]
    n = head // 1000
    v = st.version
    st.heartbeat(n, [], 0.5, formats=[TargetFormat(target_id=head, format_id=fid(n, 7))])
    assert st.targets[head].blank and st.version > v
    now = 0.5
    for _ in range(8):  # the node acknowledges the revocation, or its lease runs out
        now += 0.25
        for m in (1, 2, 3):
            st.heartbeat(m, [], now, revoked_acked=st.revoked_targets(m))
        st.tick(now)
    assert _states(st)[head] in (S.WAITING, S.SYNCING)


def test_a_spare_with_a_new_disk_is_recorded_not_blank() -> None:
    st = _cluster(nodes=4)
    spare = next(t for t in st.targets.values() if t.chain_id == 0)
    _register(st, spare.node_id, 0.5, gen=3)
    assert spare.format_id == fid(spare.node_id, 3) and not spare.blank and spare.state == S.SERVING


@pytest.mark.parametrize("formatted_now", [False, True])
def test_upgrade_no_recorded_id(formatted_now: bool) -> None:
    """A store from before format ids: the first id reported is recorded; a target whose node
    just formatted an empty directory for it (a new disk) is blank all the same."""
    st = _cluster()
    for t in st.targets.values():
        t.format_id = ""
    head = st.chains[1].targets[0]
    _beat(st, 0.5, (1, 2, 3))
    _register(st, head // 1000, 0.6, gen=1, formatted_now=formatted_now)
    assert st.targets[head].format_id == fid(head // 1000, 1)
    assert st.targets[head].blank is formatted_now


def test_an_older_node_without_format_ids_is_accepted_as_before() -> None:
    st = _cluster()
    head = st.chains[1].targets[0]
    _beat(st, 0.5, (1, 2, 3))
    _register(st, head // 1000, 0.6, formats=False)
    assert not st.targets[head].blank and st.targets[head].format_id == fid(head // 1000)


def test_format_ids_and_blank_survive_a_mgmtd_restart_and_old_rows_load() -> None:
    st = _cluster()
    head = st.chains[1].targets[0]
    _beat(st, 0.5, (1, 2, 3))
    _register(st, head // 1000, 0.6, gen=1)
    store = MgmtdStore("sqlite:///:memory:")
    store.save(st)
    again = ClusterState(lease_s=LEASE_S)
    store.load(again, 10.0)
    assert again.targets[head].blank and again.targets[head].format_id == fid(head // 1000, 1)
    assert again.targets[head + 1000 if head < 3000 else head - 1000].format_id
    # a store written before format ids: target rows without the two fields
    import msgpack
    rows = store._db.execute("SELECT kind, id, value FROM kv").fetchall()
    old = []
    for kind, i, blob in rows:
        v = msgpack.unpackb(blob)
        if kind == "target":
            v.pop("format_id")
            v.pop("blank")
        old.append((kind, i, msgpack.packb(v)))
    with store._db:
        store._db.execute("DELETE FROM kv")
        store._db.executemany("INSERT INTO kv (kind, id, value) VALUES (?, ?, ?)", old)
    older = ClusterState(lease_s=LEASE_S)
    store.load(older, 10.0)
    assert all(t.format_id == "" and not t.blank for t in older.targets.values())
    store.close()


def _ec_cluster(spare: bool) -> ClusterState:
    st = ClusterState(lease_s=LEASE_S, replace_after_s=5.0)
    for n in (1, 2, 3):
        _register(st, n, 0.0)
    st.create_chain_table(replicas=1, targets_per_node=1)
    if spare:
        _register(st, 4, 0.0)
    return st


def test_an_empty_ec_target_is_swapped_for_a_spare_so_the_rebuild_sees_a_new_target() -> None:
    from loomfs.mgmtd.ec import replace_lost_ec_targets
    st = _ec_cluster(spare=True)
    chain = st.chains[1]
    old = chain.targets[0]
    _register(st, old // 1000, 0.5, gen=1)
    assert chain.targets == [old] and st.targets[old].state != S.SERVING  # not serving its empty disk
    swaps = replace_lost_ec_targets(st, 0.6)
    assert swaps == [(1, old, 4001)]
    assert chain.targets == [4001] and st.targets[4001].state == S.SERVING
    assert st.targets[old].chain_id == 0 and not st.targets[old].blank and st.targets[old].state == S.SERVING


def test_an_empty_ec_target_without_a_spare_serves_nothing() -> None:
    from loomfs.mgmtd.ec import replace_lost_ec_targets
    st = _ec_cluster(spare=False)
    chain = st.chains[1]
    old = chain.targets[0]
    _register(st, old // 1000, 0.5, gen=1)
    assert replace_lost_ec_targets(st, 0.6) == []
    now = 0.5
    for _ in range(4):
        now += 0.25
        _beat(st, now, (1, 2, 3))
    assert st.nodes[old // 1000].state == NodeState.ALIVE
    assert st.targets[old].state == S.LASTSRV and st.targets[old].blank  # the loss's marker: never serving
