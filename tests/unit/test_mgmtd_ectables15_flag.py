"""Chain tables say whether they are an EC group's (session 15 follow-up). mgmtd.ec hands an empty
spare to a single-replica chain whose target is lost; it did so for EVERY replicas=1 table, so a
replicated scratch table (a one-node cluster) whose node only rebooted lost its data for good: its
target came back as a spare. Only tables created as EC (``CreateChainTableReq.ec``) get spares
now; the flag is saved in both stores; tables saved before it load as replicated. No sockets."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgpack
import pytest

from loomfs.common.clock import ManualClock
from loomfs.errors import InvalidArgument
from loomfs.mgmtd.ec import replace_lost_ec_targets
from loomfs.mgmtd.service import MgmtdService
from loomfs.mgmtd.state import ClusterState
from loomfs.mgmtd.store import MgmtdStore, decode_rows, encode_rows
from loomfs.wire import mgmtd as wm
from loomfs.wire.mgmtd import TargetFormat
from loomfs.wire.types import NodeKind, NodeState, TargetInfo, TargetState

S = TargetState
LEASE_S = 1.0
REPLACE_S = 5.0


def _register(st: ClusterState, n: int, now_s: float, *, targets: int = 1, gen: int = 0) -> None:
    tids = [n * 1000 + i + 1 for i in range(targets)]
    st.register(node_id=n, kind=NodeKind.STORAGE, host="h", port=9000 + n,
                targets=[TargetInfo(target_id=t, path=f"/t{t}") for t in tids], now_s=now_s,
                formats=[TargetFormat(target_id=t, format_id=f"{t:016x}{gen:016x}") for t in tids])


def _beat(st: ClusterState, now_s: float, nodes: tuple[int, ...]) -> None:
    """What MgmtdService.tick does: the state's tick, then the EC spares."""
    for n in nodes:
        st.heartbeat(n, [], now_s)
    st.tick(now_s)
    if replace_lost_ec_targets(st, now_s):
        st._bump()


def _scratch(*, ec: bool | None = None) -> ClusterState:
    """A single-replica table over nodes 1 and 2 (one target each), then node 3 with a spare."""
    st = ClusterState(lease_s=LEASE_S, replace_after_s=REPLACE_S)
    _register(st, 1, 0.1)  # (mgmtd.ec ignores a node with no heartbeat time: 0.0)
    _register(st, 2, 0.1)
    if ec is None:
        st.create_chain_table(replicas=1)
    else:
        st.create_chain_table(replicas=1, targets_per_node=1, ec=ec)
    _register(st, 3, 0.1)  # its target is a spare
    return st


def _reboot_node_1(st: ClusterState) -> tuple[int, int]:
    """Node 1 dies for much longer than lease + replace_after_s, then comes back (same disk)."""
    chain = next(c for c in st.chains.values() if st.targets[c.targets[0]].node_id == 1)
    target = chain.targets[0]
    now = 0.0
    while now < LEASE_S + REPLACE_S + 4.0:
        now += 0.5
        _beat(st, now, (2, 3))
    assert st.nodes[1].state == NodeState.DEAD
    _register(st, 1, now + 0.1)
    _beat(st, now + 0.2, (1, 2, 3))
    return chain.chain_id, target


def test_a_replicated_single_replica_table_keeps_its_target_through_a_reboot() -> None:
    st = _scratch()  # replicas=1, no EC flag: a replicated table (the old code swapped it)
    chain_id, target = _reboot_node_1(st)
    assert st.chains[chain_id].targets == [target]  # never handed the empty spare
    assert st.targets[target].state == S.SERVING and st.targets[target].chain_id == chain_id
    assert st.targets[3001].chain_id == 0  # the spare is still a spare
    assert not st.tables[1].ec


def test_the_same_table_created_as_ec_still_gets_a_spare() -> None:
    st = _scratch(ec=True)
    assert st.tables[1].ec
    chain_id, target = _reboot_node_1(st)
    assert st.chains[chain_id].targets == [3001]
    assert st.targets[3001].state == S.SERVING and st.targets[target].chain_id == 0


def test_an_explicit_ec_false_wins_over_the_old_recipe() -> None:
    st = _scratch(ec=False)  # replicas=1, targets_per_node=1, but said not EC
    assert not st.tables[1].ec
    chain_id, target = _reboot_node_1(st)
    assert st.chains[chain_id].targets == [target] and st.targets[target].state == S.SERVING


def test_python_callers_of_the_old_recipe_get_an_ec_table() -> None:
    st = ClusterState(lease_s=LEASE_S)
    for n in (1, 2):
        _register(st, n, 0.0, targets=2)
    assert st.create_chain_table(replicas=1, targets_per_node=1).ec
    assert not st.create_chain_table(replicas=1).ec


def test_an_ec_table_needs_single_replica_chains() -> None:
    st = ClusterState(lease_s=LEASE_S)
    for n in (1, 2, 3):
        _register(st, n, 0.0)
    with pytest.raises(InvalidArgument):
        st.create_chain_table(replicas=3, ec=True)
    assert not st.tables


def test_a_blank_target_of_a_replicated_single_replica_chain_is_not_swapped() -> None:
    st = _scratch()
    chain = next(c for c in st.chains.values() if st.targets[c.targets[0]].node_id == 1)
    old = chain.targets[0]
    _register(st, 1, 0.5, gen=1)  # its disk was replaced: the chain's data is gone
    _beat(st, 0.6, (1, 2, 3))
    assert chain.targets == [old] and st.targets[old].blank
    # serves nothing: the blank lastsrv is the loss's marker (docs: accept-loss is the way out)
    assert st.targets[old].state == S.LASTSRV


def _service(st: ClusterState, store: MgmtdStore | None = None) -> MgmtdService:
    return MgmtdService(st, store, heartbeat_interval_s=0.5, clock=ManualClock(0.0))


def test_the_rpc_creates_replicated_tables_unless_it_says_ec() -> None:
    st = ClusterState(lease_s=LEASE_S, replace_after_s=REPLACE_S)
    for n in (1, 2, 3, 4):
        _register(st, n, 0.0, targets=2)
    svc = _service(st)
    # the recipe of the old docs, without the flag: replicated (the safe reading of an old tool)
    rsp = asyncio.run(svc.create_chain_table(wm.CreateChainTableReq(replicas=1, targets_per_node=1), None))
    assert rsp.table is not None and not st.tables[rsp.table.table_id].ec
    rsp = asyncio.run(svc.create_chain_table(wm.CreateChainTableReq(replicas=1, targets_per_node=1, ec=True),
                                             None))
    assert rsp.table is not None and st.tables[rsp.table.table_id].ec


def test_set_table_ec_needs_confirmation_and_single_replica() -> None:
    st = ClusterState(lease_s=LEASE_S)
    for n in (1, 2, 3):
        _register(st, n, 0.0, targets=2)
    st.create_chain_table(replicas=3, targets_per_node=1)
    st.create_chain_table(replicas=1)
    svc = _service(st)
    with pytest.raises(InvalidArgument):
        asyncio.run(svc.set_table_ec(wm.SetTableEcReq(table_id=2, ec=True), None))
    assert not st.tables[2].ec
    with pytest.raises(InvalidArgument):
        asyncio.run(svc.set_table_ec(wm.SetTableEcReq(table_id=1, ec=True, confirm=True), None))
    rsp = asyncio.run(svc.set_table_ec(wm.SetTableEcReq(table_id=2, ec=True, confirm=True), None))
    assert rsp.changed and st.tables[2].ec
    rsp = asyncio.run(svc.set_table_ec(wm.SetTableEcReq(table_id=2, ec=True, confirm=True), None))
    assert not rsp.changed


def test_the_flag_survives_the_sqlite_store_and_an_ha_takeover(tmp_path: Path) -> None:
    st = _scratch(ec=True)
    st.create_chain_table(replicas=1)  # node 3's target: a replicated table beside it
    store = MgmtdStore(f"sqlite:///{tmp_path}/m.db")
    store.save(st)
    back = ClusterState(lease_s=LEASE_S, replace_after_s=REPLACE_S)
    store.load(back, 0.0)
    store.close()
    assert back.tables[1].ec and not back.tables[2].ec
    # a standby taking over loads the rows the primary saved (the PostgreSQL store keeps the
    # same rows, msgpacked in one value: store.encode_rows / decode_rows)
    standby = ClusterState(lease_s=LEASE_S, replace_after_s=REPLACE_S)
    decode_rows(msgpack.unpackb(msgpack.packb([list(r) for r in encode_rows(st)])), standby, 0.0)
    assert standby.tables[1].ec and not standby.tables[2].ec


def test_a_table_saved_before_the_flag_loads_as_replicated(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    st = _scratch(ec=True)
    store = MgmtdStore(f"sqlite:///{tmp_path}/m.db")
    rows = []
    for kind, rid, blob in encode_rows(st):
        if kind == "table":
            v = msgpack.unpackb(blob)
            del v["ec"]  # the row format before this change
            blob = msgpack.packb(v)
        rows.append((kind, rid, blob))
    with store._db:
        store._db.execute("BEGIN")
        store._db.execute("DELETE FROM kv")
        store._db.executemany("INSERT INTO kv (kind, id, value) VALUES (?, ?, ?)", rows)
    old = ClusterState(lease_s=LEASE_S, replace_after_s=REPLACE_S)
    with caplog.at_level("WARNING"):
        store.load(old, 0.0)
    store.close()
    assert not old.tables[1].ec  # never an empty spare for a table that may hold the only copy
    assert "set-ec 1 --yes" in caplog.text
    chain_id, target = _reboot_node_1(old)
    assert old.chains[chain_id].targets == [target]
    # the operator marks it: spares again
    assert old.set_table_ec(1, True)
    assert not old.set_table_ec(1, True)
