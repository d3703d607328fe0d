"""Services and clients follow the primary mgmtd (issue 12 item 3): three real MgmtdService
instances electing a primary on a MemoryHaStore, over the simulated network in virtual time
(no sockets), called through MgmtdSet / RoutingClient."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from loomfs.common.clock import LOOP_CLOCK
from loomfs.common.routing import MgmtdSet, RoutingClient
from loomfs.errors import NotFound
from loomfs.mgmtd.lease import Election, MemoryHaStore
from loomfs.mgmtd.service import MgmtdService
from loomfs.mgmtd.state import ClusterState
from loomfs.net.rpc import RpcClient, RpcServer
from loomfs.net.sim import LinkFaults, SimNetwork
from loomfs.net.transport import Address
from loomfs.testing.simloop import run_virtual
from loomfs.wire import mgmtd as w
from loomfs.wire.types import NodeKind

LEASE_S = 1.0
ADDRS = [Address(f"10.0.0.{i}", 8000) for i in (1, 2, 3)]


class Mgmtd:
    """One mgmtd "process": service, RPC server and its election loop."""

    def __init__(self, net: SimNetwork, store: MemoryHaStore, address: Address):
        self.address = address
        self.election = Election(store, holder=f"{address}/1", address=str(address), lease_s=LEASE_S,
                                 clock=LOOP_CLOCK)
        self.service = MgmtdService(ClusterState(lease_s=5.0), None, heartbeat_interval_s=0.5, clock=LOOP_CLOCK,
                                    election=self.election, ha_store=store)
        self.server = RpcServer(f"mgmtd-{address.host}", net.transport(address.host))
        self.server.add_service(self.service)
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.server.start(self.address)
        self.task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:  # as loomfs.mgmtd.server's loop
            await self.election.step()
            if self.election.is_primary and self.service.loaded_term != self.election.term:
                await self.service.take_over()
            await self.service.tick_ha()
            await asyncio.sleep(LEASE_S / 4)

    async def crash(self, net: SimNetwork) -> None:
        assert self.task is not None
        self.task.cancel()
        net.crash_host(self.address.host)


def _register(node_id: int) -> w.RegisterNodeReq:
    return w.RegisterNodeReq(node_id=node_id, kind=NodeKind.STORAGE, host="10.0.1.1", port=9000 + node_id)


def _run(coro: Coroutine[Any, Any, None]) -> None:
    run_virtual(asyncio.wait_for(coro, 60))


def test_calls_follow_the_hint_and_fail_over_when_the_primary_dies() -> None:
    async def scenario() -> None:
        net = SimNetwork(seed=1, faults=LinkFaults())
        store = MemoryHaStore(LOOP_CLOCK)
        ms = [Mgmtd(net, store, a) for a in ADDRS]
        for m in ms:  # 10.0.0.1 steps first: primary
            await m.start()
        await asyncio.sleep(0.1)
        assert [m.service.serving for m in ms] == [True, False, False]
        rpc = RpcClient(net.transport("10.0.9.9"), connect_timeout_s=0.2, call_timeout_s=1.0)
        routing = RoutingClient(rpc, list(reversed(ADDRS)))  # a standby first
        await routing.refresh()
        mgmtd = routing.mgmtd_set
        assert mgmtd.primary == ADDRS[0] and mgmtd.redirects == 1  # 10.0.0.3 named the primary
        await mgmtd.call(w.REGISTER_NODE, _register(1), timeout_s=1.0)
        before = routing.current.version

        # an error of the primary's own is its answer: raised at once, primary kept
        with pytest.raises(NotFound):
            await mgmtd.call(w.HEARTBEAT, w.HeartbeatReq(node_id=99), timeout_s=1.0)
        assert mgmtd.primary == ADDRS[0]

        await ms[0].crash(net)
        crashed_s = asyncio.get_running_loop().time()
        rsp = await mgmtd.call(w.REGISTER_NODE, _register(2), timeout_s=1.0, deadline_s=5.0)
        took_s = asyncio.get_running_loop().time() - crashed_s
        assert took_s <= LEASE_S + LEASE_S / 4 + 0.2
        assert mgmtd.primary in ADDRS[1:] and mgmtd.failovers >= 1
        assert rsp.body.routing_version > before
        new = next(m for m in ms if m.address == mgmtd.primary)
        assert set(new.service.state.nodes) == {1, 2}  # node 1 came back from the store
        await routing.refresh()
        assert routing.current.version == rsp.body.routing_version
        for m in ms[1:]:
            assert m.task is not None
            m.task.cancel()
        await rpc.close()

    _run(scenario())


def test_one_round_without_a_primary_raises_the_last_error() -> None:
    async def scenario() -> None:
        net = SimNetwork(seed=2, faults=LinkFaults())
        store = MemoryHaStore(LOOP_CLOCK)
        store.down = True  # nobody can win
        ms = [Mgmtd(net, store, a) for a in ADDRS[:2]]
        for m in ms:
            await m.start()
        await asyncio.sleep(0.5)
        rpc = RpcClient(net.transport("10.0.9.9"), connect_timeout_s=0.2, call_timeout_s=1.0)
        mgmtd = MgmtdSet(rpc, ADDRS)  # 10.0.0.3 is not even running
        with pytest.raises(OSError) as ei:
            await mgmtd.call(w.GET_ROUTING, w.GetRoutingReq(), timeout_s=0.5)
        assert mgmtd.primary is None
        assert "NOT_PRIMARY" in str(ei.value) or "refused" in str(ei.value).lower()
        store.down = False
        rsp = await mgmtd.call(w.GET_ROUTING, w.GetRoutingReq(), timeout_s=0.5, deadline_s=3.0)
        assert rsp.body.routing is not None and mgmtd.primary in ADDRS[:2]
        for m in ms:
            assert m.task is not None
            m.task.cancel()
        await rpc.close()

    _run(scenario())
