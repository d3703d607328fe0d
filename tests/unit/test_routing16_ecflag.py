"""Routing says which chain tables are EC groups' (``ChainTable.ec``) and which targets are
*blank* (``TargetInfo.blank``, ``format_id``: back on a replaced disk), filled by mgmtd from
its table records and disk identities. Meta went by ``replicas == 1`` before: a replicated
one-replica table (a legitimate configuration) was taken for an EC group, its chains
"rebuilt" by the EC rebuild worker and EC files placed on it. No sockets."""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any, cast

import msgpack
import pytest

from loomfs.common.clock import ManualClock
from loomfs.common.routing import Routing
from loomfs.errors import NotFound
from loomfs.meta.ec_rebuild import ec_chains
from loomfs.meta.ops.namespace import Namespace
from loomfs.meta.store.sqlite import SqliteStore
from loomfs.mgmtd.state import ClusterState
from loomfs.wire.message import Message, many, message
from loomfs.wire.mgmtd import GetRoutingRsp, TargetFormat
from loomfs.wire.types import (
    ChainInfo,
    ChainTable,
    Layout,
    NodeKind,
    RoutingInfo,
    TargetInfo,
    TargetState,
)

# ---- the wire: both directions stay compatible ---------------------------------------------------


@message
class OldChainTable(Message):
    """ChainTable as peers before the flag define it."""

    table_id: int = 0
    version: int = 1
    replicas: int = 3
    chain_ids: list[int] = many()


@message
class OldTargetInfo(Message):
    target_id: int = 0
    node_id: int = 0
    state: int = TargetState.SERVING
    chain_id: int = 0


def _through_msgpack(d: dict[str, Any]) -> Any:
    return msgpack.unpackb(msgpack.packb(d), strict_map_key=False)


def test_an_old_peers_messages_decode_with_the_defaults() -> None:
    old_table = _through_msgpack(OldChainTable(table_id=2, replicas=1, chain_ids=[5, 6]).to_wire())
    assert "ec" not in old_table
    t = ChainTable.from_wire(old_table)
    assert (t.table_id, t.replicas, list(t.chain_ids), t.ec) == (2, 1, [5, 6], False)
    old_target = _through_msgpack(OldTargetInfo(target_id=7, node_id=1, chain_id=3).to_wire())
    ti = TargetInfo.from_wire(old_target)
    assert (ti.target_id, ti.blank, ti.format_id) == (7, False, "")
    # a whole routing reply of an old mgmtd (no flag anywhere)
    rsp = GetRoutingRsp.from_wire(_through_msgpack(
        {"changed": True, "routing": {"version": 4, "targets": [old_target], "tables": [old_table]}}))
    assert rsp.routing is not None and not rsp.routing.tables[0].ec and not rsp.routing.targets[0].blank


def test_an_old_peer_ignores_the_new_fields_and_they_round_trip() -> None:
    t = ChainTable(table_id=2, replicas=1, chain_ids=[5], ec=True)
    wire = _through_msgpack(t.to_wire())
    assert wire["ec"] is True
    assert ChainTable.from_wire(wire) == t
    assert OldChainTable.from_wire(wire) == OldChainTable(table_id=2, replicas=1, chain_ids=[5])
    ti = TargetInfo(target_id=7, node_id=1, chain_id=3, state=TargetState.WAITING, blank=True, format_id="ab" * 16)
    wire = _through_msgpack(ti.to_wire())
    assert TargetInfo.from_wire(wire) == ti
    assert OldTargetInfo.from_wire(wire) == OldTargetInfo(target_id=7, node_id=1, chain_id=3,
                                                          state=TargetState.WAITING)
    # the reference decoder agrees with the compiled one
    assert ChainTable._from_wire_generic(_through_msgpack(t.to_wire())) == t
    assert TargetInfo._from_wire_generic(wire) == ti


# ---- mgmtd fills them ------------------------------------------------------------------------------


def _fid(t: int, gen: int = 0) -> str:
    return f"{t:016x}{gen:016x}"


def _register(st: ClusterState, n: int, now_s: float, *, targets: int = 1, gen: int = 0) -> None:
    tids = [n * 1000 + i + 1 for i in range(targets)]
    st.register(node_id=n, kind=NodeKind.STORAGE, host="h", port=9000 + n,
                targets=[TargetInfo(target_id=t, path=f"/t{t}") for t in tids], now_s=now_s,
                formats=[TargetFormat(target_id=t, format_id=_fid(t, gen)) for t in tids])


def _two_single_replica_tables() -> ClusterState:
    """Table 1: replicated, one replica (node 1's and 2's first targets); table 2: an EC group's
    (their second targets)."""
    st = ClusterState(lease_s=1.0)
    _register(st, 1, 0.1, targets=2)
    _register(st, 2, 0.1, targets=2)
    st.create_chain_table(replicas=1, targets_per_node=1, ec=False)
    st.create_chain_table(replicas=1, targets_per_node=1, ec=True)
    return st


def test_mgmtd_routing_carries_the_tables_ec_flag() -> None:
    st = _two_single_replica_tables()
    tables = {t.table_id: t for t in st.routing().tables}
    assert (tables[1].replicas, tables[1].ec) == (1, False)
    assert (tables[2].replicas, tables[2].ec) == (1, True)


def test_set_ec_shows_in_routing_under_a_new_version() -> None:
    st = _two_single_replica_tables()
    before = st.routing()
    assert st.set_table_ec(1, True)
    after = st.routing()
    assert after.version > before.version  # clients that know `before` fetch the flag
    assert {t.table_id: t.ec for t in after.tables} == {1: True, 2: True}
    v = after.version
    assert not st.set_table_ec(1, True) and st.routing().version == v  # no change, no bump
    assert st.set_table_ec(1, False) and {t.table_id: t.ec for t in st.routing().tables} == {1: False, 2: True}


def test_mgmtd_routing_marks_a_blank_target_with_its_format_id() -> None:
    st = ClusterState(lease_s=1.0)
    for n in (1, 2, 3):
        _register(st, n, 0.0)
    st.create_chain_table(replicas=3)
    for n in (1, 2, 3):
        st.heartbeat(n, [], 0.5)
    st.tick(0.5)
    assert not any(t.blank for t in st.routing().targets)
    assert {t.target_id: t.format_id for t in st.routing().targets} == {t: _fid(t) for t in (1001, 2001, 3001)}
    _register(st, 2, 0.6, gen=1)  # node 2 is back on a new disk
    r = st.routing()
    (t2,) = [t for t in r.targets if t.target_id == 2001]
    assert t2.blank and t2.format_id == _fid(2001, 1) and t2.state != TargetState.SERVING
    assert [t.target_id for t in r.targets if t.blank] == [2001]


# ---- consumers go by the flag --------------------------------------------------------------------


def _routing(tables: list[ChainTable]) -> Routing:
    chains = [ChainInfo(chain_id=c, version=1, targets=[100 + c], table_id=t.table_id)
              for t in tables for c in t.chain_ids]
    targets = [TargetInfo(target_id=100 + c.chain_id, node_id=c.chain_id, chain_id=c.chain_id) for c in chains]
    return Routing(RoutingInfo(version=1, targets=targets, chains=chains, tables=tables))


def test_meta_ec_rebuild_never_takes_a_replicated_one_replica_table_for_ec() -> None:
    """The gap: the worker took every single-replica chain for an EC group's (fails on the old
    code). Such a chain whose target changed (a drain moving it) got a "rebuild" job."""
    r = _routing([ChainTable(table_id=1, replicas=3, chain_ids=[1]),
                  ChainTable(table_id=2, replicas=1, chain_ids=[11, 12, 13])])  # replicated, one replica
    assert ec_chains(r) == {}


def test_meta_ec_rebuild_takes_the_flagged_tables_chains() -> None:
    r = _routing([ChainTable(table_id=1, replicas=1, chain_ids=[1, 2, 3]),
                  ChainTable(table_id=2, replicas=1, chain_ids=[11, 12, 13], ec=True)])
    assert ec_chains(r) == {c: (100 + c, 1) for c in (11, 12, 13)}


def test_routing_table_choice_by_flag() -> None:
    r = _routing([ChainTable(table_id=1, replicas=1, chain_ids=[1], ec=True),
                  ChainTable(table_id=2, replicas=3, chain_ids=[2]),
                  ChainTable(table_id=3, replicas=1, chain_ids=[3])])
    assert r.table(0, 1).table_id == 1  # the flag not asked: the lowest with one replica, as before
    assert r.table(0, 1, ec=True).table_id == 1
    assert r.table(0, 1, ec=False).table_id == 3
    assert r.table(0, 0, ec=False).table_id == 2
    assert r.table(3, 0).table_id == 3 and r.table(3, 1, ec=False).table_id == 3
    with pytest.raises(NotFound, match="table 2 with 3 replicas of an EC group"):
        r.table(2, 3, ec=True)


class _FixedRouting:
    def __init__(self, routing: Routing) -> None:
        self.routing = routing

    async def get(self) -> Routing:
        return self.routing

    async def refresh(self, min_version: int = 0) -> Routing:
        return self.routing


def _created_on(routing: Routing, dir_layout: Layout) -> Layout:
    """The layout meta gives a file created under a directory of ``dir_layout``."""

    async def go() -> Layout:
        store = SqliteStore(":memory:")
        ns = Namespace(store, routing=_FixedRouting(routing), clock=ManualClock(), rng=random.Random(3),
                       default_layout=Layout(chunk_size=1 << 20, stripe=4, table_id=1, inline_max_bytes=0))
        try:
            await ns.init()
            await ns.mkdir("/d")
            await ns.set_layout("/d", dir_layout)
            lay = (await ns.open("/d/f", os.O_WRONLY | os.O_CREAT, client_id=1)).attr.layout
            assert lay is not None
            return lay
        finally:
            await store.close()

    return asyncio.run(go())


def test_meta_places_ec_files_on_the_ec_table_not_a_lower_replicated_one_replica_table() -> None:
    r = _routing([ChainTable(table_id=1, replicas=1, chain_ids=list(range(1, 7))),
                  ChainTable(table_id=2, replicas=1, chain_ids=list(range(11, 17)), ec=True)])
    lay = _created_on(r, Layout(chunk_size=1 << 20, ec_k=4, ec_m=2, table_id=0))
    assert lay.table_id == 2 and set(lay.chains) <= set(range(11, 17)) and lay.ec_k == 4


def test_meta_places_replicated_one_replica_files_off_a_lower_ec_table() -> None:
    r = _routing([ChainTable(table_id=1, replicas=1, chain_ids=list(range(1, 7)), ec=True),
                  ChainTable(table_id=2, replicas=1, chain_ids=list(range(11, 17)))])
    lay = _created_on(r, Layout(chunk_size=1 << 20, stripe=2, replicas=1, table_id=0))
    assert lay.table_id == 2 and set(lay.chains) <= set(range(11, 17)) and not lay.ec_k


def test_local_cluster_marks_its_ec_table_again_only_when_routing_shows_no_flag() -> None:
    """A cluster directory from before the flag gets its EC table (the second) marked; once
    routing shows a flagged table nothing is asked (no set-ec on every start)."""
    from types import SimpleNamespace

    from loomfs.testing.cluster_waits import ClusterWaits

    def ensure(tables: list[ChainTable]) -> list[int]:
        marked: list[int] = []
        fake = SimpleNamespace(ec_targets_per_node=1, routing=lambda: RoutingInfo(version=1, tables=tables),
                               _mark_ec=lambda table_id, timeout_s: marked.append(table_id))
        ClusterWaits._ensure_chain_table(cast(Any, fake), 1.0)  # duck-typed: routing, _mark_ec
        return marked

    rep = ChainTable(table_id=1, replicas=3, chain_ids=[1])
    assert ensure([rep, ChainTable(table_id=2, replicas=1, chain_ids=[2])]) == [2]
    assert ensure([rep, ChainTable(table_id=2, replicas=1, chain_ids=[2], ec=True)]) == []
