"""Revoked tokens live in mgmtd's cluster state (mgmtd/revoked.py), so they survive restarts
and reach a standby that takes over: three MgmtdService + RevokedTokens "processes" electing
on a MemoryHaStore over the simulated network (virtual time, no sockets), and one single mgmtd
on SQLite that restarts and picks up an old revoked.json."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from loomfs.common.clock import LOOP_CLOCK
from loomfs.common.routing import MgmtdSet
from loomfs.errors import LoomError
from loomfs.mgmtd.lease import Election, MemoryHaStore
from loomfs.mgmtd.revoked import RevokedTokens
from loomfs.mgmtd.service import MgmtdService
from loomfs.mgmtd.state import ClusterState
from loomfs.mgmtd.store import MgmtdStore
from loomfs.net.revocations import Revocations
from loomfs.net.rpc import CallContext, RpcClient, RpcServer
from loomfs.net.sim import LinkFaults, SimNetwork
from loomfs.net.transport import Address
from loomfs.testing.simloop import run_virtual
from loomfs.wire import auth as wa
from loomfs.wire.message import Empty
from loomfs.wire.status import Status

LEASE_S = 1.0
ADDRS = [Address(f"10.0.0.{i}", 8000) for i in (1, 2, 3)]
LATER_S = time.time() + 3600


class Mgmtd:
    """One mgmtd "process": service, revoked tokens, RPC server and the election loop of
    ``loomfs.mgmtd.server``."""

    def __init__(self, net: SimNetwork, store: MemoryHaStore, address: Address):
        self.address = address
        self.election = Election(store, holder=f"{address}/1", address=str(address), lease_s=LEASE_S,
                                 clock=LOOP_CLOCK)
        self.service = MgmtdService(ClusterState(lease_s=5.0), None, heartbeat_interval_s=0.5, clock=LOOP_CLOCK,
                                    election=self.election, ha_store=store)
        self.verifier_list = Revocations()  # this process's revocations.PROCESS
        self.revoked = RevokedTokens(self.service, target=self.verifier_list)
        self.server = RpcServer(f"mgmtd-{address.host}", net.transport(address.host))
        self.server.add_service(self.service)
        self.server.add_service(self.revoked)
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.server.start(self.address)
        self.task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await self.election.step()
            if self.election.is_primary and self.service.loaded_term != self.election.term:
                await self.service.take_over()
                await self.revoked.adopt()
            await self.service.tick_ha()
            await asyncio.sleep(LEASE_S / 4)


def _run(coro: Coroutine[Any, Any, None]) -> None:
    run_virtual(asyncio.wait_for(coro, 60))


def test_a_revocation_on_the_primary_survives_a_failover() -> None:
    async def scenario() -> None:
        net = SimNetwork(seed=4, faults=LinkFaults())
        store = MemoryHaStore(LOOP_CLOCK)
        ms = [Mgmtd(net, store, a) for a in ADDRS]
        for m in ms:
            await m.start()
        await asyncio.sleep(0.1)
        assert [m.service.serving for m in ms] == [True, False, False]
        rpc = RpcClient(net.transport("10.0.9.9"), connect_timeout_s=0.2, call_timeout_s=1.0)
        mgmtd = MgmtdSet(rpc, list(reversed(ADDRS)))  # asks a standby first: follows the hint
        rsp = (await mgmtd.call(wa.REVOKE_TOKEN, wa.RevokeTokenReq(token_id="tok-1", until_s=LATER_S),
                                timeout_s=1.0)).body
        assert rsp.token_ids == ["tok-1"] and mgmtd.primary == ADDRS[0]
        assert "tok-1" in ms[0].verifier_list.ids  # the primary's own verifier
        # a standby neither takes revocations nor serves a list of its own
        for m in ms[1:]:
            with pytest.raises(LoomError) as ei:
                await rpc.call(m.address, wa.LIST_REVOKED, Empty(), retry=False)
            assert ei.value.status is Status.NOT_PRIMARY
            with pytest.raises(LoomError) as ei:
                await rpc.call(m.address, wa.REVOKE_TOKEN, wa.RevokeTokenReq(token_id="x"), retry=False)
            assert ei.value.status is Status.NOT_PRIMARY
        # the primary dies; the one that takes over has the revocation (from the store)
        assert ms[0].task is not None
        ms[0].task.cancel()
        net.crash_host(ADDRS[0].host)
        listed = (await mgmtd.call(wa.LIST_REVOKED, Empty(), timeout_s=1.0, deadline_s=5.0)).body
        assert mgmtd.primary in ADDRS[1:]
        assert listed.token_ids == ["tok-1"] and listed.until_s == [pytest.approx(LATER_S)]
        new = next(m for m in ms if m.address == mgmtd.primary)
        assert "tok-1" in new.verifier_list.ids  # its verifier got the list when it took over
        await mgmtd.call(wa.REVOKE_TOKEN, wa.RevokeTokenReq(token_id="tok-2", until_s=LATER_S), timeout_s=1.0)
        assert (await mgmtd.call(wa.LIST_REVOKED, Empty(), timeout_s=1.0)).body.token_ids == ["tok-1", "tok-2"]
        for m in ms[1:]:
            assert m.task is not None
            m.task.cancel()
        await rpc.close()

    _run(scenario())


def _ctx() -> CallContext:
    return CallContext(payload=memoryview(b""), request_id=1, peer="test", deadline=None)


def test_single_mgmtd_keeps_revocations_in_its_store_and_adopts_the_old_file(tmp_path: Path) -> None:
    legacy = tmp_path / "revoked.json"
    legacy.write_text(json.dumps({"old-tok": LATER_S, "expired-tok": time.time() - 10}))
    url = f"sqlite:///{tmp_path / 'mgmtd.db'}"

    async def first() -> None:
        store = MgmtdStore(url)
        state = ClusterState(lease_s=5.0)
        store.load(state, 0.0)
        svc = MgmtdService(state, store, heartbeat_interval_s=0.5)
        target = Revocations()
        revoked = RevokedTokens(svc, legacy, target=target)
        await revoked.adopt()
        assert target.ids == {"old-tok"}  # the expired one is not adopted
        await revoked.revoke_token(wa.RevokeTokenReq(token_id="new-tok", until_s=LATER_S), _ctx())
        assert target.ids == {"old-tok", "new-tok"}
        store.close()

    async def restarted() -> None:
        legacy.unlink()  # the store alone holds them now
        store = MgmtdStore(url)
        state = ClusterState(lease_s=5.0)
        store.load(state, 0.0)
        svc = MgmtdService(state, store, heartbeat_interval_s=0.5)
        target = Revocations()
        revoked = RevokedTokens(svc, legacy, target=target)
        await revoked.adopt()
        rsp = await revoked.list_revoked(Empty(), _ctx())
        assert rsp.token_ids == ["new-tok", "old-tok"] and target.ids == {"new-tok", "old-tok"}
        store.close()

    asyncio.run(first())
    asyncio.run(restarted())


def test_expired_entries_are_dropped() -> None:
    async def go() -> None:
        now = [1000.0]
        svc = MgmtdService(ClusterState(lease_s=5.0), None, heartbeat_interval_s=0.5)
        revoked = RevokedTokens(svc, target=Revocations(), wall_clock=lambda: now[0])
        await revoked.revoke_token(wa.RevokeTokenReq(token_id="a", until_s=1010.0), _ctx())
        await revoked.revoke_token(wa.RevokeTokenReq(token_id="b"), _ctx())  # a year from now
        assert (await revoked.list_revoked(Empty(), _ctx())).token_ids == ["a", "b"]
        now[0] = 1011.0
        assert (await revoked.list_revoked(Empty(), _ctx())).token_ids == ["b"]
        assert svc.state.revoked_tokens.keys() == {"b"}

    asyncio.run(go())
