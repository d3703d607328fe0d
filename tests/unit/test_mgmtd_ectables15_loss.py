"""A replicated chain whose members all came back blank (every disk replaced, mgmtd.diskident)
waited for ever with no way out. The operator's way out: accept the loss (mgmtd RPC
ACCEPT_CHAIN_LOSS, ``loomfs admin chain accept-loss CHAIN --yes-lose-data``): one empty member
serves, the others resync from it; logged at error level and counted; refused while a member on
an alive node holds data, and (unless asked) while a member on a dead node was not found blank.
The state machine and the service object, no sockets."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgpack
import pytest

from loomfs.common.clock import ManualClock
from loomfs.errors import InvalidArgument, StatusError
from loomfs.mgmtd.diskident import accept_chain_loss
from loomfs.mgmtd.service import MgmtdService
from loomfs.mgmtd.state import ClusterState
from loomfs.mgmtd.store import MgmtdStore, decode_rows, encode_rows
from loomfs.wire import mgmtd as wm
from loomfs.wire.mgmtd import TargetFormat
from loomfs.wire.status import Status
from loomfs.wire.types import NodeKind, NodeState, TargetInfo, TargetState

S = TargetState
LEASE_S = 1.0


def _register(st: ClusterState, n: int, now_s: float, *, gen: int = 0) -> None:
    tid = n * 1000 + 1
    st.register(node_id=n, kind=NodeKind.STORAGE, host="h", port=9000 + n,
                targets=[TargetInfo(target_id=tid, path="/t")], now_s=now_s,
                formats=[TargetFormat(target_id=tid, format_id=f"{n:016x}{gen:016x}")])


def _beat(st: ClusterState, now_s: float, nodes: tuple[int, ...]) -> None:
    for n in nodes:
        st.heartbeat(n, [], now_s)
    st.tick(now_s)


def _states(st: ClusterState, chain_id: int = 1) -> dict[int, TargetState]:
    return {t: TargetState(st.targets[t].state) for t in st.chains[chain_id].targets}


def _finish_syncs(st: ClusterState, now_s: float) -> None:
    for t in list(st.targets.values()):
        if t.state == S.SYNCING:
            st.sync_report(target_id=t.target_id, chain_id=t.chain_id, chain_version=st.chains[t.chain_id].version,
                           chunks_left=0, bytes_left=0, done=True, now_s=now_s)


def _all_blank(replicas: int = 3) -> ClusterState:
    """A chain of ``replicas`` members whose nodes all came back with new disks."""
    st = ClusterState(lease_s=LEASE_S)
    for n in range(1, replicas + 1):
        _register(st, n, 0.0)
    st.create_chain_table(replicas=replicas)
    for n in range(1, replicas + 1):
        _register(st, n, 0.5, gen=1)
    _beat(st, 0.6, tuple(range(1, replicas + 1)))
    assert all(st.targets[t].blank for t in st.chains[1].targets)
    assert S.SERVING not in _states(st).values()
    return st


def test_a_chain_whose_disks_were_all_replaced_waits_until_the_operator_accepts_the_loss(
        caplog: pytest.LogCaptureFixture) -> None:
    st = _all_blank()
    for i in range(10):  # on its own it never serves again
        _beat(st, 1.0 + i * 0.3, (1, 2, 3))
    assert S.SERVING not in _states(st).values()
    version = st.chains[1].version
    with caplog.at_level("ERROR"):
        served, given_up = accept_chain_loss(st, 1, 4.5)
    assert given_up == [] and served == st.chains[1].targets[0]
    assert _states(st)[served] == S.SERVING and not st.targets[served].blank
    assert st.chains[1].version > version and st.accepted_losses == 1
    assert "accepted the loss" in caplog.text
    # the others are still blank and resync from it: normal rules from here on
    others = [t for t in st.chains[1].targets if t != served]
    assert all(st.targets[t].blank for t in others)
    now = 4.5
    for _ in range(6):
        now += 0.2
        _beat(st, now, (1, 2, 3))
        _finish_syncs(st, now)
    assert set(_states(st).values()) == {S.SERVING} and not any(st.targets[t].blank for t in others)


def test_refused_while_an_alive_member_holds_data() -> None:
    st = ClusterState(lease_s=LEASE_S)
    for n in (1, 2, 3):
        _register(st, n, 0.0)
    st.create_chain_table(replicas=3)
    for n in (1, 2):
        _register(st, n, 0.5, gen=1)  # two disks replaced, node 3's holds the data
    _beat(st, 0.6, (1, 2, 3))
    before = (dict(_states(st)), st.chains[1].version, st.version)
    with pytest.raises(StatusError) as e:
        accept_chain_loss(st, 1, 0.7)
    assert e.value.status == Status.EBUSY
    assert (dict(_states(st)), st.chains[1].version, st.version) == before and st.accepted_losses == 0
    assert [t for t in st.chains[1].targets if not st.targets[t].blank] == [3001]


def test_a_dead_member_that_may_hold_data_is_given_up_only_when_asked() -> None:
    st = ClusterState(lease_s=LEASE_S)
    for n in (1, 2, 3):
        _register(st, n, 0.0)
    st.create_chain_table(replicas=3)
    now = 0.0
    for _ in range(4):  # node 3 dies (its target: LASTSRV, or OFFLINE)
        now += 0.5
        _beat(st, now, (1, 2))
    assert st.nodes[3].state == NodeState.DEAD
    for n in (1, 2):
        _register(st, n, now + 0.1, gen=1)
    _beat(st, now + 0.2, (1, 2))
    assert S.SERVING not in _states(st).values()  # nodes 1, 2 blank; the data is on dead node 3
    with pytest.raises(StatusError) as e:
        accept_chain_loss(st, 1, now + 0.3)
    assert e.value.status == Status.EBUSY and st.accepted_losses == 0
    served, given_up = accept_chain_loss(st, 1, now + 0.3, give_up_dead=True)
    assert given_up == [3001] and served in (1001, 2001)
    assert _states(st)[served] == S.SERVING and st.targets[3001].blank
    assert _states(st)[3001] == S.OFFLINE
    # node 3 returns with its old disk: it resyncs from the chain, never serves its old contents
    _register(st, 3, now + 1.0)
    _beat(st, now + 1.1, (1, 2, 3))
    assert _states(st)[3001] in (S.WAITING, S.SYNCING) and _states(st)[served] == S.SERVING


def test_refused_with_no_usable_member_and_for_an_unknown_chain() -> None:
    st = _all_blank()
    now = 0.6
    for _ in range(4):
        now += 0.5
        _beat(st, now, ())
    assert all(n.state == NodeState.DEAD for n in st.nodes.values())
    with pytest.raises(InvalidArgument):
        accept_chain_loss(st, 1, now)
    with pytest.raises(StatusError) as e:
        accept_chain_loss(st, 99, now)
    assert e.value.status == Status.ENOENT
    assert st.accepted_losses == 0 and all(st.targets[t].blank for t in st.chains[1].targets)


def test_a_single_replica_replicated_chain_with_a_wiped_disk_can_be_accepted() -> None:
    st = _all_blank(replicas=1)
    served, _ = accept_chain_loss(st, 1, 1.0)
    assert _states(st) == {served: S.SERVING}


def _service(st: ClusterState, store: MgmtdStore | None) -> MgmtdService:
    return MgmtdService(st, store, heartbeat_interval_s=0.5, clock=ManualClock(1.0))


def test_the_rpc_needs_confirmation_and_its_result_is_saved_for_a_standby(tmp_path: Path) -> None:
    st = _all_blank()
    store = MgmtdStore(f"sqlite:///{tmp_path}/m.db")
    svc = _service(st, store)
    with pytest.raises(InvalidArgument):
        asyncio.run(svc.accept_chain_loss(wm.AcceptChainLossReq(chain_id=1), None))
    assert st.accepted_losses == 0 and S.SERVING not in _states(st).values()
    rsp = asyncio.run(svc.accept_chain_loss(wm.AcceptChainLossReq(chain_id=1, confirm=True), None))
    assert rsp.accepted_losses == 1 and rsp.chain_version == st.chains[1].version
    assert rsp.routing_version == st.version
    # a restarted mgmtd, and a standby taking over (same rows), serve the chain as accepted
    restarted = ClusterState(lease_s=LEASE_S)
    store.load(restarted, 0.0)
    store.close()
    standby = ClusterState(lease_s=LEASE_S)
    decode_rows(msgpack.unpackb(msgpack.packb([list(r) for r in encode_rows(st)])), standby, 0.0)
    for back in (restarted, standby):
        assert back.accepted_losses == 1
        assert _states(back)[rsp.target_id] == S.SERVING and not back.targets[rsp.target_id].blank
        assert all(back.targets[t].blank for t in back.chains[1].targets if t != rsp.target_id)
        back.reconcile(0.1)  # the rules keep it (a fixed point after the load)
        assert _states(back)[rsp.target_id] == S.SERVING
    # a second call: the chain serves from a member that holds (the accepted, empty) data
    with pytest.raises(StatusError):
        asyncio.run(svc.accept_chain_loss(wm.AcceptChainLossReq(chain_id=1, confirm=True), None))
