"""mgmtd failover by lease (issue 12 item 3) on a ManualClock: the election, the conditional
saves, and the service answering only as primary. No sockets: MemoryHaStore keeps the
PostgreSQL store's rules in memory (tests/integration/test_mgmtd_ha.py runs the real one)."""

from __future__ import annotations

import asyncio

import pytest

from loomfs.common.clock import ManualClock
from loomfs.common.routing import primary_hint
from loomfs.config import MgmtdConfig
from loomfs.errors import LoomError
from loomfs.mgmtd.lease import Election, MemoryHaStore
from loomfs.mgmtd.server import check_config
from loomfs.mgmtd.service import MgmtdService, not_primary_message
from loomfs.mgmtd.state import ClusterState
from loomfs.net.rpc import CallContext
from loomfs.net.transport import Address
from loomfs.wire import mgmtd as w
from loomfs.wire.status import Status
from loomfs.wire.types import NodeKind, TargetInfo

LEASE_S = 2.0
CTX = CallContext(payload=memoryview(b""), request_id=1, peer="test", deadline=None)


def _election(store: MemoryHaStore, clock: ManualClock, name: str) -> Election:
    return Election(store, holder=f"{name}/1", address=f"127.0.0.1:{name}", lease_s=LEASE_S, clock=clock)


def _mgmtd(store: MemoryHaStore, clock: ManualClock, name: str) -> tuple[Election, MgmtdService]:
    e = _election(store, clock, name)
    svc = MgmtdService(ClusterState(lease_s=5.0), None, heartbeat_interval_s=1.0, clock=clock,
                       election=e, ha_store=store)
    return e, svc


async def _step(e: Election, svc: MgmtdService) -> None:
    """What the server's loop does each period."""
    await e.step()
    if e.is_primary and svc.loaded_term != e.term:
        await svc.take_over()
    await svc.tick_ha()


def _register(node_id: int) -> w.RegisterNodeReq:
    return w.RegisterNodeReq(node_id=node_id, kind=NodeKind.STORAGE, host="127.0.0.1", port=9000 + node_id,
                             targets=[TargetInfo(target_id=node_id * 100 + 1, node_id=node_id)])


def test_one_primary_renews_and_the_other_waits() -> None:
    clock = ManualClock()
    store = MemoryHaStore(clock)
    a, b = _election(store, clock, "1"), _election(store, clock, "2")

    async def run() -> None:
        assert await a.step() is True and a.is_primary and a.term == 1
        assert await b.step() is False and not b.is_primary
        assert b.hint() == "127.0.0.1:1"
        for _ in range(20):  # renewals every quarter lease: b never gets in
            clock.advance(LEASE_S / 4)
            assert await a.step() is False  # renewed, not newly won
            assert await b.step() is False
            assert a.is_primary and not b.is_primary
        assert a.term == 1

    asyncio.run(run())


def test_standby_takes_over_within_a_lease_and_never_two_primaries() -> None:
    clock = ManualClock()
    store = MemoryHaStore(clock)
    a, b = _election(store, clock, "1"), _election(store, clock, "2")

    last_renewal_s = clock.monotonic()

    async def run() -> float:
        await a.step()
        await b.step()
        # a dies (or pauses) here: it never steps again; b steps every quarter lease
        while not b.is_primary:
            clock.advance(LEASE_S / 20)
            assert not (a.is_primary and b.is_primary)
            await b.step()
            assert not (a.is_primary and b.is_primary)
        return clock.monotonic() - last_renewal_s

    took_s = asyncio.run(run())
    assert LEASE_S <= took_s <= LEASE_S + LEASE_S / 20 + 1e-9
    # a stopped answering as primary a margin before its lease ran out in the store
    assert a.primary_until_s == pytest.approx(last_renewal_s + LEASE_S - a.margin_s)


def test_local_deadline_ends_before_the_store_lease() -> None:
    clock = ManualClock()
    store = MemoryHaStore(clock)
    a = _election(store, clock, "1")
    asyncio.run(a.step())
    assert a.primary_until_s == pytest.approx(clock.monotonic() + LEASE_S - a.margin_s)
    assert a.primary_until_s < store.expires_s


def test_store_unreachable_keeps_primary_only_until_its_local_deadline() -> None:
    clock = ManualClock()
    store = MemoryHaStore(clock)
    a, b = _election(store, clock, "1"), _election(store, clock, "2")

    async def run() -> None:
        await a.step()
        store.down = True
        clock.advance(LEASE_S / 2)
        assert await a.step() is False and a.is_primary and a.step_errors == 1
        clock.advance(LEASE_S / 2)
        await a.step()
        assert not a.is_primary  # deadline passed without a renewal
        assert not await b.step()  # nobody can win while the store is down
        store.down = False
        assert await b.step() is True  # the old lease has run out in the store too
        assert await a.step() is False and not a.is_primary and a.hint() == "127.0.0.1:2"

    asyncio.run(run())


def test_standby_answers_not_primary_with_the_primary_address() -> None:
    clock = ManualClock()
    store = MemoryHaStore(clock)
    (a, sa), (b, sb) = _mgmtd(store, clock, "1"), _mgmtd(store, clock, "2")

    async def run() -> None:
        await _step(a, sa)
        await _step(b, sb)
        await sa.register_node(_register(1), CTX)
        for call in (sb.register_node(_register(2), CTX), sb.get_routing(w.GetRoutingReq(), CTX),
                     sb.heartbeat(w.HeartbeatReq(node_id=1), CTX)):
            with pytest.raises(LoomError) as ei:
                await call
            assert ei.value.status is Status.NOT_PRIMARY
            assert primary_hint(ei.value) == Address("127.0.0.1", 1)

    asyncio.run(run())


def test_takeover_loads_the_state_and_the_version_only_grows() -> None:
    clock = ManualClock()
    store = MemoryHaStore(clock)
    (a, sa), (b, sb) = _mgmtd(store, clock, "1"), _mgmtd(store, clock, "2")

    async def run() -> None:
        await _step(a, sa)
        await _step(b, sb)
        for n in (1, 2, 3):
            await sa.register_node(_register(n), CTX)
        await sa.create_chain_table(w.CreateChainTableReq(replicas=3), CTX)
        old = (await sa.get_routing(w.GetRoutingReq(), CTX)).routing
        assert old is not None
        while not sb.serving:  # a is gone
            clock.advance(LEASE_S / 4)
            await _step(b, sb)
        new = (await sb.get_routing(w.GetRoutingReq(), CTX)).routing
        assert new is not None and new.version > old.version
        assert {n.node_id for n in new.nodes} == {1, 2, 3}
        assert [c.targets for c in new.chains] == [c.targets for c in old.chains]
        # every node known is alive after the takeover (its heartbeat time starts now)
        rsp = await sb.heartbeat(w.HeartbeatReq(node_id=1, routing_version=new.version), CTX)
        assert rsp.routing_version == new.version

    asyncio.run(run())


def test_paused_primary_never_writes_after_the_takeover() -> None:
    """a pauses past its lease with a request half done; b takes over; a's save is refused in
    the store, a stands down, and b's state stays what b saved."""
    clock = ManualClock()
    store = MemoryHaStore(clock)
    (a, sa), (b, sb) = _mgmtd(store, clock, "1"), _mgmtd(store, clock, "2")

    async def run() -> None:
        await _step(a, sa)
        await sa.register_node(_register(1), CTX)
        clock.advance(LEASE_S * 2)  # a is paused: no renewals
        await _step(b, sb)
        assert sb.serving
        saved = list(store.rows)
        # a wakes inside a request that passed its check before the pause
        sa.state.register(node_id=7, kind=NodeKind.STORAGE, host="127.0.0.1", port=9007, targets=[],
                          now_s=clock.monotonic())
        with pytest.raises(LoomError) as ei:
            await sa._commit()
        assert ei.value.status is Status.NOT_PRIMARY
        assert store.rows == saved and store.refused_saves == 1
        assert not sa.serving and sa.state.nodes == {}  # the unsaved change is gone
        with pytest.raises(LoomError):  # and it keeps answering NOT_PRIMARY
            await sa.register_node(_register(2), CTX)
        await _step(a, sa)
        assert not sa.serving and a.hint() == "127.0.0.1:2"

    asyncio.run(run())


def test_primary_that_lost_its_term_reloads_before_serving_again() -> None:
    clock = ManualClock()
    store = MemoryHaStore(clock)
    a, sa = _mgmtd(store, clock, "1")

    async def run() -> None:
        await _step(a, sa)
        await sa.register_node(_register(1), CTX)
        v1 = sa.state.version
        store.down = True
        clock.advance(LEASE_S)
        await _step(a, sa)  # renewal failed: past the local deadline
        assert not sa.serving
        store.down = False
        await _step(a, sa)  # wins again (its own row): a new term, loaded from the store
        assert sa.serving and a.term == 2 and sa.loaded_term == 2
        assert sa.state.version > v1 and 1 in sa.state.nodes

    asyncio.run(run())


def test_sqlite_with_two_mgmtd_addresses_is_refused() -> None:
    with pytest.raises(ValueError, match="several mgmtd need one shared postgresql"):
        check_config(MgmtdConfig(store_url="sqlite:///m.db", mgmtd="127.0.0.1:8000,127.0.0.1:8001"))
    assert check_config(MgmtdConfig(store_url="sqlite:///m.db", mgmtd="127.0.0.1:8000")) is False
    assert check_config(MgmtdConfig(store_url="postgresql://u@/db?host=/tmp", mgmtd="a:1,b:2")) is True
    with pytest.raises(ValueError, match="below lease_s"):
        check_config(MgmtdConfig(store_url="postgresql://u@/db", lease_s=2.0, primary_lease_s=2.0))


def test_primary_hint_parsing() -> None:
    assert primary_hint(LoomError(f"NOT_PRIMARY: {not_primary_message('10.0.0.2:8000')}")) == \
        Address("10.0.0.2", 8000)
    assert primary_hint(LoomError(f"NOT_PRIMARY: {not_primary_message('')}")) is None
    assert primary_hint(LoomError("NOT_PRIMARY: primary=garbage")) is None
