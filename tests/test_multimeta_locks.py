"""Locks across meta servers and meta restarts: two meta servers on one PostgreSQL database
(and then both restarted) answer one lock table (``loomfs.meta.locks``): a lock taken through
one is refused through the other, survives the restart of both, and goes when released
through either."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

import loomfs
from loomfs.net.rpc import RpcClient
from loomfs.net.tcp import TcpTransport
from loomfs.net.transport import Address
from loomfs.testing import LocalCluster
from loomfs.testing.pgserver import PgServer
from loomfs.wire import meta_lock as wl

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

A, B = 0x1111, 0x2222  # client ids


@pytest.fixture(scope="module")
def pg2(pg_server: PgServer) -> Iterator[LocalCluster]:
    url = pg_server.url(schema=f"multilocks{os.getpid()}")
    root = tempfile.mkdtemp(prefix="loomfs-multilocks-")
    c = LocalCluster(root, storage_nodes=1, targets_per_node=1, replicas=1, meta_nodes=2, meta_store=url)
    try:
        c.start(timeout_s=90)
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


def _metas(c: LocalCluster) -> list[Address]:
    return [Address.parse(s.address) for s in sorted(c.services.values(), key=lambda s: s.name) if s.kind == "meta"]


def test_two_meta_servers_and_their_restart_share_the_locks(pg2: LocalCluster) -> None:
    fs = loomfs.connect(str(pg2.root))
    try:
        with fs.open("/locked", "wb") as f:
            f.write(b"x")
        inode = fs.attr("/locked").inode
    finally:
        fs.close()

    def lock(client: int, type_: int, first: int, last: int) -> wl.LockReq:
        return wl.LockReq(inode=inode, kind=2, client_id=client, owner=7, type=type_, first=first, last=last,
                          lease_s=60)

    async def call(rpc: RpcClient, addr: Address, m: object, req: object) -> object:
        return (await rpc.call(addr, m, req, timeout_s=30.0)).body  # type: ignore[arg-type]

    async def before(rpc: RpcClient) -> None:
        m1, m2 = _metas(pg2)
        got = await call(rpc, m1, wl.LOCK_SET, lock(A, 2, 0, 99))
        assert isinstance(got, wl.LockRsp) and got.granted
        got = await call(rpc, m2, wl.LOCK_SET, lock(B, 2, 50, 50))
        assert isinstance(got, wl.LockRsp) and not got.granted and got.conflict is not None
        assert (got.conflict.client_id, got.conflict.first, got.conflict.last) == (A, 0, 99)

    async def after(rpc: RpcClient) -> None:
        m1, m2 = _metas(pg2)
        got = await call(rpc, m2, wl.LOCK_GET, lock(B, 2, 50, 50))
        assert isinstance(got, wl.LockRsp) and got.conflict is not None and got.conflict.client_id == A
        got = await call(rpc, m1, wl.LOCK_SET, lock(B, 2, 50, 50))
        assert isinstance(got, wl.LockRsp) and not got.granted
        rel = await call(rpc, m2, wl.LOCK_RELEASE, wl.LockReleaseReq(inode=inode, kind=2, client_id=A, owner=7))
        assert isinstance(rel, wl.LockReleaseRsp) and rel.released == 1
        got = await call(rpc, m1, wl.LOCK_SET, lock(B, 2, 50, 50))
        assert isinstance(got, wl.LockRsp) and got.granted

    async def with_rpc(fn: object) -> None:
        rpc = RpcClient(TcpTransport())
        try:
            await fn(rpc)  # type: ignore[operator]
        finally:
            await rpc.close()

    asyncio.run(with_rpc(before))
    for s in sorted(s.name for s in pg2.services.values() if s.kind == "meta"):
        pg2.restart_service(s)
    asyncio.run(with_rpc(after))
