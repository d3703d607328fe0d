"""Per-tenant in-flight byte budgets (net/budget.py TenantBudgets, net/rpc_server.py): a tenant's
connections share one budget, taken before the process budget, so one tenant cannot hold the
whole process budget; services and admins have none. Pure bookkeeping first, then a server
over the simulated network (no sockets, virtual time)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from loomfs.common.identity import Right
from loomfs.net.auth import AuthConfig
from loomfs.net.budget import ByteBudget, TenantBudgets
from loomfs.net.credentials import create_token, rights_for
from loomfs.net.rpc import CallContext, RpcClient, RpcServer
from loomfs.net.sim import SimNetwork
from loomfs.net.transport import Address
from loomfs.testing.simloop import run_virtual
from loomfs.wire.storage import WRITE, WriteReq, WriteRsp

SECRET = b"t" * 32
CHUNK = 300_000


def test_tenant_budgets_are_shared_per_tenant_and_dropped_when_empty() -> None:
    tb = TenantBudgets(700)
    a1, a2, b = tb.attach("a"), tb.attach("a"), tb.attach("b")
    assert a1 is a2 and a1 is not b and len(tb) == 2 and a1.limit_bytes == 700
    assert a1.try_acquire(400) and not a2.try_acquire(400)  # the tenant's connections share it
    assert b.try_acquire(400)  # another tenant is not affected
    tb.detach("a")
    assert tb.get("a") is a1  # one connection left
    tb.detach("a")
    assert tb.get("a") is a1  # bytes still in flight: kept, a new connection shares it
    assert tb.attach("a") is a1
    a1.release(400)
    tb.detach("a")
    assert tb.get("a") is None and len(tb) == 1
    b.release(400)
    tb.detach("b")
    assert len(tb) == 0 and "tenants=0" in repr(tb)
    with pytest.raises(ValueError):
        TenantBudgets(0)


def _client(net: SimNetwork, host: str, tenant: str, rights: Right | None = None) -> RpcClient:
    t = net.transport(host)
    t.auth = AuthConfig(credential=create_token(SECRET, uid=1000, gid=1000, tenant=tenant, rights=rights,
                                                ttl_s=3600, now_s=time.time()))
    return RpcClient(t, call_timeout_s=60)


def test_one_tenant_cannot_take_the_process_budget() -> None:
    """Process budget 1.3 MB, tenant budget 700 KB: tenant a's four 300 KB writes (each on its
    own connection) get two in flight; tenant b's two writes are still read and run; an admin's
    write is bound by the process budget alone. All finish once the handlers are released."""
    budget = ByteBudget(1_300_000)
    tenants = TenantBudgets(700_000)

    async def go() -> None:
        net = SimNetwork(seed=5)
        gate = asyncio.Event()
        running: list[str] = []

        async def write(req: WriteReq, ctx: CallContext) -> WriteRsp:
            running.append(ctx.identity.tenant or "admin")
            await gate.wait()
            return WriteRsp(chunk_length=len(ctx.payload))

        t = net.transport("10.0.0.1")
        t.auth = AuthConfig(secret=SECRET)
        server = RpcServer("svc", t, budget=budget, tenant_budgets=tenants)
        server.register(WRITE, write)
        addr = await server.start(Address("10.0.0.1", 7000))
        a = [_client(net, f"10.0.1.{i}", "a") for i in range(4)]
        b = [_client(net, f"10.0.2.{i}", "b") for i in range(2)]
        admin = _client(net, "10.0.3.1", "", rights_for(admin=True))

        def send(c: RpcClient) -> asyncio.Future[Any]:
            return asyncio.ensure_future(c.call(addr, WRITE, WriteReq(length=CHUNK), payload=b"p" * CHUNK))

        calls = [send(c) for c in a]

        async def until(ok: object, what: str) -> None:
            for _ in range(500):
                if callable(ok) and ok():
                    return
                await asyncio.sleep(0.01)
            raise AssertionError(f"{what}: running={running} {budget!r} {tenants.get('a')!r}")

        await until(lambda: running.count("a") == 2 and (tenants.get("a") or budget).waiting >= 1,
                    "tenant a held at its budget")
        assert budget.waiting == 0 and budget.used_bytes < budget.limit_bytes
        calls += [send(c) for c in b]
        await until(lambda: running.count("b") == 2, "tenant b's writes run beside a's")
        assert running.count("a") == 2  # a still held
        ta, tb_ = tenants.get("a"), tenants.get("b")
        assert ta is not None and tb_ is not None
        assert ta.used_bytes <= ta.limit_bytes and tb_.used_bytes <= tb_.limit_bytes
        calls.append(send(admin))  # no tenant budget: waits for the process budget only
        await until(lambda: budget.waiting == 1, "the admin's write waits at the process budget")
        assert "admin" not in running
        gate.set()
        rsps = await asyncio.gather(*calls)
        assert [r.body.chunk_length for r in rsps] == [CHUNK] * 7
        assert running.count("a") == 4 and running.count("b") == 2 and running.count("admin") == 1
        assert budget.used_bytes == 0 and budget.peak_bytes <= budget.limit_bytes
        assert ta.peak_bytes <= ta.limit_bytes + 1_000  # + headers charged on arrival
        for c in (*a, *b, admin):
            await c.close()
        await until(lambda: len(tenants) == 0, "budgets dropped once their connections closed")
        await server.close()

    run_virtual(asyncio.wait_for(go(), 60))


def test_a_closed_connection_gives_its_tenant_bytes_back() -> None:
    """A connection queued at its tenant's budget (and one queued at the process budget after
    taking its tenant's bytes) closes: every byte comes back to both budgets."""
    budget = ByteBudget(700_000)
    tenants = TenantBudgets(700_000)

    async def go() -> None:
        net = SimNetwork(seed=6)
        gate = asyncio.Event()
        running: list[int] = []

        async def write(req: WriteReq, ctx: CallContext) -> WriteRsp:
            running.append(len(ctx.payload))
            await gate.wait()
            return WriteRsp(chunk_length=len(ctx.payload))

        t = net.transport("10.0.0.1")
        t.auth = AuthConfig(secret=SECRET)
        server = RpcServer("svc", t, budget=budget, tenant_budgets=tenants)
        server.register(WRITE, write)
        addr = await server.start(Address("10.0.0.1", 7000))
        holders = [_client(net, f"10.0.1.{i}", "a") for i in range(2)]
        for c in holders:
            asyncio.ensure_future(c.call(addr, WRITE, WriteReq(length=CHUNK), payload=b"p" * CHUNK))
        for _ in range(500):
            if len(running) == 2:
                break
            await asyncio.sleep(0.01)
        waiting = _client(net, "10.0.2.1", "a")
        fut = asyncio.ensure_future(waiting.call(addr, WRITE, WriteReq(length=CHUNK), payload=b"p" * CHUNK))
        ta = tenants.get("a")
        assert ta is not None
        for _ in range(500):
            if ta.waiting:
                break
            await asyncio.sleep(0.01)
        assert ta.waiting == 1
        await waiting.close()
        fut.cancel()
        for _ in range(500):
            if not ta.waiting:
                break
            await asyncio.sleep(0.01)
        gate.set()
        for c in holders:
            await c.close()
        for _ in range(500):
            if budget.used_bytes == 0 and len(tenants) == 0:
                break
            await asyncio.sleep(0.01)
        assert budget.used_bytes == 0 and ta.used_bytes == 0 and len(tenants) == 0
        await server.close()

    run_virtual(asyncio.wait_for(go(), 60))
