"""MetaService over RpcServer on the simulated network: every method round-trips, errors map."""

from __future__ import annotations

import asyncio
import os
import random

import pytest
from test_meta_namespace import FakeRouting

from loomfs.common.clock import ManualClock
from loomfs.errors import AlreadyExists, InvalidArgument, IsADirectory, NotFound, RemoteError
from loomfs.meta.ops.namespace import Namespace
from loomfs.meta.service import MetaService
from loomfs.meta.store.base import MetaStore
from loomfs.net.rpc import RpcClient, RpcServer
from loomfs.net.sim import LinkFaults, SimNetwork
from loomfs.net.transport import Address
from loomfs.wire import meta as w
from loomfs.wire.message import Empty
from loomfs.wire.status import Status
from loomfs.wire.types import FileType, Layout


def test_all_methods_over_rpc() -> None:
    async def go() -> None:
        net = SimNetwork(seed=1, faults=LinkFaults(latency_s=0.0, jitter_s=0.0))
        store = MetaStore.open("sqlite://:memory:")
        ns = Namespace(store, routing=FakeRouting(), clock=ManualClock(), rng=random.Random(1))
        await ns.init()
        server = RpcServer("meta", net.transport("10.0.0.1"))
        server.add_service(MetaService(ns))
        addr = await server.start(Address("10.0.0.1", 8100))
        c = RpcClient(net.transport("10.0.0.2"), call_timeout_s=2.0)

        async def call(m, req):  # type: ignore[no-untyped-def]
            return (await c.call(addr, m, req)).body

        assert (await call(w.MKDIR, w.MkdirReq(path="/d"))).attr.type == FileType.DIRECTORY
        o = await call(w.OPEN, w.OpenReq(path="/d/f", flags=os.O_WRONLY | os.O_CREAT, client_id=4, chunked=True))
        assert o.session_id and o.attr.layout.chains and o.session_lease_s == ns.session_lease_s > 0
        renew = w.RenewSessionsReq(client_id=4, session_ids=[o.session_id, o.session_id + 1000])
        assert (await call(w.RENEW_SESSIONS, renew)).renewed == 1
        assert (await call(w.SYNC, w.SyncReq(inode=o.attr.inode, length=10))).attr.size == 10
        a = await call(w.CLOSE, w.CloseReq(inode=o.attr.inode, session_id=o.session_id, length=20))
        assert a.attr.size == 20
        assert (await call(w.STAT, w.PathReq(path="/d/f"))).attr.inode == o.attr.inode
        r = await call(w.READDIR, w.ReaddirReq(path="/d", with_attrs=True))
        assert [e.name for e in r.entries] == ["f"] and r.entries[0].attr.size == 20 and not r.more
        await call(w.SYMLINK, w.SymlinkReq(target="/d/f", path="/l"))
        assert (await call(w.READLINK, w.PathReq(path="/l"))).target == "/d/f"
        assert (await call(w.LINK, w.LinkReq(src="/d/f", dst="/h"))).attr.nlink == 2
        s = await call(w.SETATTR, w.SetattrReq(path="/h", size=5))
        assert s.truncated_from == 20 and s.attr.size == 5
        await call(w.RENAME, w.RenameReq(src="/h", dst="/h2"))
        u = await call(w.UNLINK, w.PathReq(path="/h2"))
        assert u.inode == o.attr.inode and not u.gc_queued
        u = await call(w.UNLINK, w.PathReq(path="/d/f"))
        assert u.gc_queued
        lay = Layout(chunk_size=1 << 20, stripe=2, table_id=1)
        assert (await call(w.SET_LAYOUT, w.SetLayoutReq(path="/d", layout=lay))).attr.layout == lay
        assert (await call(w.RMDIR, w.PathReq(path="/d"))).inode > 1
        st = await call(w.STATFS, Empty())
        assert (st.files, st.directories, st.bytes_used, st.gc_pending) == (0, 1, 0, 1)
        await call(w.META_PING, Empty())
        with pytest.raises(NotFound):
            await call(w.STAT, w.PathReq(path="/nope"))
        with pytest.raises(AlreadyExists):
            await call(w.MKDIR, w.MkdirReq(path="/"))
        with pytest.raises(IsADirectory):
            await call(w.UNLINK, w.PathReq(path="/"))
        with pytest.raises(InvalidArgument):
            await call(w.SET_LAYOUT, w.SetLayoutReq(path="/", layout=None))
        await c.close()
        await server.close()
        await store.close()

    asyncio.run(asyncio.wait_for(go(), 20))


def test_no_chain_table_status_over_rpc() -> None:
    async def go() -> None:
        net = SimNetwork(seed=2, faults=LinkFaults(latency_s=0.0, jitter_s=0.0))
        store = MetaStore.open("sqlite://:memory:")
        ns = Namespace(store, routing=FakeRouting(chains=0))
        await ns.init()
        server = RpcServer("meta", net.transport("10.0.0.1"))
        server.add_service(MetaService(ns))
        addr = await server.start(Address("10.0.0.1", 8100))
        c = RpcClient(net.transport("10.0.0.2"), call_timeout_s=2.0)
        with pytest.raises(RemoteError) as ei:
            await c.call(addr, w.OPEN, w.OpenReq(path="/f", flags=os.O_WRONLY | os.O_CREAT))
        assert ei.value.status is Status.NO_CHAIN_TABLE
        await c.close()
        await server.close()
        await store.close()

    asyncio.run(asyncio.wait_for(go(), 20))
