"""Review of the disk-identity change (5efb700, c48224f): gaps in mgmtd's handling of blank
targets, each fixed in session 15 (the tests were xfail until then). State machine only, no I/O."""

from __future__ import annotations

import pytest
from test_disk_identity15_state import LEASE_S, _beat, _cluster, _register, _states, fid

from loomfs.errors import LoomError
from loomfs.mgmtd.state import ClusterState
from loomfs.wire.mgmtd import TargetFormat
from loomfs.wire.types import NodeKind, TargetInfo, TargetState

S = TargetState


def test_a_stale_member_does_not_serve_when_the_last_serving_member_came_back_blank() -> None:
    st = _cluster(2, 2)
    head, tail = st.chains[1].targets
    now = 0.0
    for _ in range(8):  # the tail dies first: the head serves alone (writes acked by it alone)
        now += 0.25
        _beat(st, now, (head // 1000,))
    assert _states(st) == {head: S.SERVING, tail: S.OFFLINE}
    for _ in range(8):  # then the head dies: it is the last serving member, the chain waits for it
        now += 0.25
        _beat(st, now, ())
    assert _states(st)[head] == S.LASTSRV
    _register(st, head // 1000, now, gen=1)  # its disk was replaced: the newest data is gone
    assert st.targets[head].blank
    _register(st, tail // 1000, now)  # the stale member returns (same disk: behind the head)
    for _ in range(4):
        now += 0.25
        _beat(st, now, (head // 1000, tail // 1000))
    # the tail lacks every write acked while it was down: serving it silently drops them (and its
    # next versions reuse their numbers); it must wait for an operator's accept-loss, as a chain
    # whose members are all blank does. Today: tail SERVING, the blank head resyncs from it.
    assert _states(st)[tail] != S.SERVING, _states(st)


def test_a_heartbeat_that_brings_a_node_back_with_a_new_disk_never_publishes_it_serving() -> None:
    # a store from before format ids (nothing recorded); the node runs new code and formatted an
    # empty directory (formatted_now) while an older mgmtd ran; it never re-registers
    st = _cluster(2, 2, formats=False)
    head, tail = st.chains[1].targets
    now = 0.0
    for _ in range(8):  # both die together: the tail is the last serving member
        now += 0.25
        _beat(st, now, ())
    assert _states(st)[tail] == S.LASTSRV
    n = tail // 1000
    now += 0.25
    st.heartbeat(n, [], now, formats=[TargetFormat(target_id=tail, format_id=fid(n, 1), formatted_now=True)])
    assert st.targets[tail].blank
    assert _states(st)[tail] != S.SERVING, _states(st)


def test_swapped_target_directories_are_refused_not_blanked() -> None:
    st = ClusterState(lease_s=LEASE_S)

    def reg(n: int, ids: list[str]) -> None:
        tids = [n * 1000 + 1, n * 1000 + 2]
        st.register(node_id=n, kind=NodeKind.STORAGE, host="h", port=9000 + n,
                    targets=[TargetInfo(target_id=t, path=f"/t{i}") for i, t in enumerate(tids)], now_s=0.0,
                    formats=[TargetFormat(target_id=t, format_id=f) for t, f in zip(tids, ids, strict=True)])

    for n in (1, 2, 3):
        reg(n, [fid(n, 0), fid(n, 1)])
    st.create_chain_table(replicas=3)
    assert st.targets[1001].chain_id and st.targets[1002].chain_id
    with pytest.raises(LoomError):
        reg(1, [fid(1, 1), fid(1, 0)])  # the two directories trade places


def test_one_directory_reported_by_two_targets_is_refused() -> None:
    st = ClusterState(lease_s=LEASE_S)
    with pytest.raises(LoomError):
        st.register(node_id=1, kind=NodeKind.STORAGE, host="h", port=9001,
                    targets=[TargetInfo(target_id=1001, path="/a"), TargetInfo(target_id=1002, path="/a")],
                    now_s=0.0, formats=[TargetFormat(target_id=1001, format_id=fid(1)),
                                        TargetFormat(target_id=1002, format_id=fid(1))])


def test_accepting_the_loss_of_the_newest_copy_serves_the_member_behind_it() -> None:
    """The way out of the case above: an operator accepts the loss of the writes acknowledged
    while the tail was down; the tail serves, the blank head resyncs from it."""
    from loomfs.mgmtd.diskident import accept_chain_loss

    st = _cluster(2, 2)
    head, tail = st.chains[1].targets
    now = 0.0
    for _ in range(8):
        now += 0.25
        _beat(st, now, (head // 1000,))
    for _ in range(8):
        now += 0.25
        _beat(st, now, ())
    _register(st, head // 1000, now, gen=1)
    _register(st, tail // 1000, now)
    for _ in range(4):
        now += 0.25
        _beat(st, now, (head // 1000, tail // 1000))
    assert S.SERVING not in _states(st).values()
    served, given_up = accept_chain_loss(st, 1, now)
    assert (served, given_up) == (tail, []) and st.accepted_losses == 1
    assert _states(st)[tail] == S.SERVING and st.targets[head].blank
    for _ in range(4):
        now += 0.25
        _beat(st, now, (head // 1000, tail // 1000))
    assert _states(st)[head] == S.SYNCING
    with pytest.raises(LoomError):
        accept_chain_loss(st, 1, now)  # it serves: nothing to accept
