"""The connection handshake end to end over the simulated network (no sockets, virtual time)."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import time
from pathlib import Path

import pytest

from loomfs.common.identity import SERVICE, TRUSTED, Identity, Right
from loomfs.errors import PermissionDenied
from loomfs.net.auth import AuthConfig, auth_config
from loomfs.net.credentials import Credential, create_token, rights_for, write_token_file
from loomfs.net.rpc import CallContext, RpcClient, RpcServer
from loomfs.net.sim import SimNetwork
from loomfs.net.transport import Address
from loomfs.testing.simloop import run_virtual
from loomfs.wire import mgmtd as wm
from loomfs.wire.message import Empty
from loomfs.wire.status import Status
from loomfs.wire.storage import WRITE, WriteReq, WriteRsp

SECRET = b"s" * 32


def _token(rights: Right | None = None, now_s: float | None = None) -> Credential:
    return create_token(SECRET, uid=1000, gid=100, rights=rights, ttl_s=3600,
                        now_s=time.time() if now_s is None else now_s)


async def _serve(net: SimNetwork, *, secret: bytes | None = SECRET) -> tuple[RpcServer, Address, list[Identity]]:
    t = net.transport("10.0.0.1")
    t.auth = AuthConfig(secret=secret) if secret else None
    server = RpcServer("svc", t)
    seen: list[Identity] = []

    async def write(req: WriteReq, ctx: CallContext) -> WriteRsp:
        seen.append(ctx.identity)
        return WriteRsp(chunk_length=len(ctx.payload))

    async def drain(req: wm.DrainReq, ctx: CallContext) -> wm.DrainRsp:
        seen.append(ctx.identity)
        return wm.DrainRsp()

    async def ping(req: Empty, ctx: CallContext) -> Empty:
        seen.append(ctx.identity)
        return Empty()

    server.register(WRITE, write)
    server.register(wm.DRAIN_NODE, drain)
    server.register(wm.MGMTD_PING, ping)
    return server, await server.start(Address("10.0.0.1", 7000)), seen


def _client(net: SimNetwork, host: str, auth: AuthConfig | None) -> RpcClient:
    t = net.transport(host)
    t.auth = auth
    return RpcClient(t, call_timeout_s=5)


def test_tokens_and_the_secret_authenticate_and_rights_gate_methods() -> None:
    async def go() -> None:
        net = SimNetwork(seed=1)
        server, addr, seen = await _serve(net)
        user = _client(net, "10.0.0.2", AuthConfig(credential=_token()))
        await user.call(addr, WRITE, WriteReq(length=1), payload=b"x")
        assert seen[-1].uid == 1000 and seen[-1].rights == Right.user()
        with pytest.raises(PermissionDenied) as ei:  # a user token cannot drain
            await user.call(addr, wm.DRAIN_NODE, wm.DrainReq(node_id=1))
        assert ei.value.errno == errno.EPERM and ei.value.status is Status.EPERM
        ro = _client(net, "10.0.0.3", AuthConfig(credential=_token(rights_for(read_only=True))))
        with pytest.raises(PermissionDenied) as ei:
            await ro.call(addr, WRITE, WriteReq(length=1), payload=b"x", retry=False)
        assert ei.value.errno == errno.EPERM
        await ro.call(addr, wm.MGMTD_PING, Empty())  # any authenticated caller may ping
        admin = _client(net, "10.0.0.4", AuthConfig(credential=_token(rights_for(admin=True))))
        await admin.call(addr, wm.DRAIN_NODE, wm.DrainReq(node_id=1))
        svc = _client(net, "10.0.0.5", AuthConfig(secret=SECRET, name="storage"))
        await svc.call(addr, wm.DRAIN_NODE, wm.DrainReq(node_id=1))
        assert seen[-1] is SERVICE
        assert server.auth_refused_total == 2  # the two EPERMs, logged
        for c in (user, ro, admin, svc):
            await c.close()
        await server.close()

    run_virtual(asyncio.wait_for(go(), 30))


def test_missing_forged_expired_and_foreign_credentials_are_refused() -> None:
    async def go() -> None:
        net = SimNetwork(seed=2)
        server, addr, seen = await _serve(net)
        anon = _client(net, "10.0.0.2", None)
        with pytest.raises(PermissionDenied) as ei:
            await anon.call(addr, WRITE, WriteReq(length=1), payload=b"x", retry=False)
        assert ei.value.status is Status.AUTH_REQUIRED and ei.value.errno == errno.EACCES
        await anon.close()  # (its connection stays open until then: it may still authenticate)
        good = _token()
        forged = Credential(dataclasses.replace(good.claims, uid=0, rights=int(Right.all())), good.key)
        expired = _token(now_s=1_000_000.0)
        foreign = AuthConfig(secret=b"o" * 32)  # another cluster's secret
        cases = [(AuthConfig(credential=forged), Status.AUTH_FAILED),
                 (AuthConfig(credential=expired), Status.AUTH_EXPIRED), (foreign, Status.AUTH_FAILED)]
        for i, (auth, status) in enumerate(cases):
            c = _client(net, f"10.0.1.{i}", auth)
            with pytest.raises(PermissionDenied) as ei:
                await c.call(addr, wm.MGMTD_PING, Empty())  # idempotent: still not retried
            assert ei.value.status is status, (i, ei.value)
            assert c.calls_total == 1
            await c.close()
        assert not seen  # no handler ran for any of them
        assert server.auth_refused_total == 4
        for _ in range(100):  # refused connections are closed shortly after the answer
            if server.connections == 0:
                break
            await asyncio.sleep(0.1)
        assert server.connections == 0
        await server.close()

    run_virtual(asyncio.wait_for(go(), 30))


def test_a_server_without_a_secret_trusts_everyone_and_a_client_checks_the_server() -> None:
    async def go() -> None:
        net = SimNetwork(seed=3)
        _, addr, seen = await _serve(net, secret=None)
        tok = _client(net, "10.0.0.2", AuthConfig(credential=_token()))
        await tok.call(addr, wm.DRAIN_NODE, wm.DrainReq(node_id=1))
        assert seen[-1] is TRUSTED
        # a server with another cluster's secret cannot prove ours: the client refuses it
        net2 = SimNetwork(seed=4)
        _, addr2, seen2 = await _serve(net2, secret=b"o" * 32)
        svc = _client(net2, "10.0.0.2", AuthConfig(secret=SECRET))
        with pytest.raises(PermissionDenied):
            await svc.call(addr2, wm.MGMTD_PING, Empty())
        assert not seen2

    run_virtual(asyncio.wait_for(go(), 30))


def test_a_token_that_expires_on_an_open_connection_is_refused_from_then_on() -> None:
    async def go() -> None:
        net = SimNetwork(seed=5)
        server, addr, seen = await _serve(net)
        assert server.verifier is not None
        now = [time.time()]
        server.verifier.wall_clock = lambda: now[0]
        c = _client(net, "10.0.0.2", AuthConfig(credential=_token()))
        await c.call(addr, wm.MGMTD_PING, Empty())
        now[0] += 3601  # the token's hour is over; the connection is still open
        with pytest.raises(PermissionDenied) as ei:
            await c.call(addr, wm.MGMTD_PING, Empty())
        assert ei.value.status is Status.AUTH_EXPIRED and len(seen) == 1
        await c.close()
        await server.close()

    run_virtual(asyncio.wait_for(go(), 30))


def test_a_renewed_token_file_serves_the_next_connection(tmp_path: Path) -> None:
    async def go() -> None:
        net = SimNetwork(seed=6)
        server, addr, seen = await _serve(net)
        assert server.verifier is not None
        now = [time.time()]
        server.verifier.wall_clock = lambda: now[0]
        path = tmp_path / "tok"
        first = _token()
        write_token_file(path, first)
        c = _client(net, "10.0.0.2", auth_config(token_file=str(path)))
        await c.call(addr, wm.MGMTD_PING, Empty())
        now[0] += 3601
        with pytest.raises(PermissionDenied):
            await c.call(addr, wm.MGMTD_PING, Empty())
        second = _token(now_s=now[0])
        write_token_file(path, second)
        os.utime(path, (now[0], now[0]))  # a new mtime, whatever the file system's resolution
        await c.call(addr, wm.MGMTD_PING, Empty())  # the refused connection was dropped: a new one
        assert [i.token_id for i in seen] == [first.claims.token_id, second.claims.token_id]
        await c.close()
        await server.close()

    run_virtual(asyncio.wait_for(go(), 30))
