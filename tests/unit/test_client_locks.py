"""``loomfs.client.locks.LockClient`` over meta's real lock handlers (``LockHandlers`` on an
in-memory SQLite store, called in process: no sockets): blocking waits granted when the other
client lets go, ended by ``interrupted()`` or ``wait_max_s``, release only for owners that
locked, and a lapsed lease's locks reported lost (by a renewal, and by a lock call that found
its lease new). The undo of grants no caller saw: test_client_lock_undo."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from loomfs.client.locks import FLOCK, POSIX, WRITE, LockClient
from loomfs.common.clock import ManualClock
from loomfs.meta.lock_service import LockHandlers
from loomfs.meta.store.base import MetaStore
from loomfs.net.rpc import CallContext
from loomfs.wire import meta_lock as wl
from loomfs.wire.message import Message, Method
from loomfs.wire.types import Attr, FileType


class Ns:
    def __init__(self, store: MetaStore, clock: ManualClock):
        self.store = store
        self.clock = clock


class InProcessMeta(LockHandlers):
    """``MetaClient.call`` for the lock methods, answered by meta's handlers in this process."""

    def __init__(self, store: MetaStore, clock: ManualClock):
        self.ns = Ns(store, clock)
        self.calls = 0
        self._by_method = {wl.LOCK_SET: self.lock_set, wl.LOCK_GET: self.lock_get,
                           wl.LOCK_RELEASE: self.lock_release, wl.LOCK_RENEW: self.lock_renew}

    async def call(self, m: Method, req: Message) -> Any:
        self.calls += 1
        ctx = CallContext(payload=memoryview(b""), request_id=self.calls, peer="test", deadline=None)
        return await self._by_method[m](req, ctx)


def run(body: Any) -> None:
    async def main() -> None:
        store = MetaStore.open("sqlite://:memory:")
        clock = ManualClock()
        try:
            async with store.write() as txn:
                await txn.put_inode(Attr(inode=5, type=FileType.FILE, mode=0o644, nlink=1))
            await body(InProcessMeta(store, clock), clock)
        finally:
            await store.close()

    asyncio.run(main())


def test_a_blocking_wait_is_granted_once_the_other_client_lets_go() -> None:
    async def body(meta: InProcessMeta, clock: ManualClock) -> None:
        a, b = LockClient(meta, 1), LockClient(meta, 2)
        await a.set(5, FLOCK, WRITE, owner=10)
        with pytest.raises(BlockingIOError):
            await b.set(5, FLOCK, WRITE, owner=20)
        polled = asyncio.Event()

        def poll() -> bool:  # asked at each poll: never stop
            if b.waits_total >= 2:
                polled.set()
            return False

        waiter = asyncio.ensure_future(b.set(5, FLOCK, WRITE, owner=20, wait=True, interrupted=poll))
        await asyncio.wait_for(polled.wait(), 10)
        assert not waiter.done()
        assert await a.release(5, FLOCK, 10) == 1
        await asyncio.wait_for(waiter, 10)
        assert await a.release(5, FLOCK, 10) == 0  # nothing held: no call
        info = await a.get(5, POSIX, WRITE, owner=10)
        assert info is None  # kinds do not meet
        await a.close()
        await b.close()

    run(body)


def test_waits_end_when_interrupted_or_past_their_limit() -> None:
    async def body(meta: InProcessMeta, clock: ManualClock) -> None:
        a, b = LockClient(meta, 1), LockClient(meta, 2)
        await a.set(5, POSIX, WRITE, 0, 99, owner=10)
        polled = asyncio.Event()

        def interrupted() -> bool:  # the kernel's INTERRUPT arrives after the first poll
            if b.waits_total >= 1:
                polled.set()
                return True
            return False

        with pytest.raises(InterruptedError):
            await asyncio.wait_for(b.set(5, POSIX, WRITE, 50, 50, owner=20, wait=True, interrupted=interrupted), 10)
        assert polled.is_set()
        with pytest.raises(BlockingIOError):
            await b.set(5, POSIX, WRITE, 50, 50, owner=20, wait=True, wait_max_s=0.02)
        calls = meta.calls
        assert not b.holds(5, POSIX, 20)  # b was refused each time: it holds nothing, no call
        assert await b.release(5, POSIX, 20) == 0
        assert meta.calls == calls
        await a.close()

    run(body)


def test_a_lapsed_lease_is_reported_lost() -> None:
    async def body(meta: InProcessMeta, clock: ManualClock) -> None:
        a = LockClient(meta, 1, lease_s=5)
        b = LockClient(meta, 2, lease_s=5)
        await a.set(5, POSIX, WRITE, 0, 9, owner=10)
        clock.advance(6)  # a was cut off past its lease: b takes the range over
        await b.set(5, POSIX, WRITE, 0, 9, owner=20)
        assert not await a.renew() and a.lost_total == 1 and not a.holds(5, POSIX, 10)
        await a.set(5, POSIX, WRITE, 100, 109, owner=11)
        clock.advance(6)
        await b.set(5, POSIX, WRITE, 100, 109, owner=21)  # drops a again
        await a.set(5, FLOCK, WRITE, owner=12)  # a's next call finds its lease new: 11's lock is gone
        assert a.lost_total == 2 and not a.holds(5, POSIX, 11) and a.holds(5, FLOCK, 12)
        await a.close()
        await b.close()

    run(body)


def test_a_mount_learns_whether_meta_keeps_locks() -> None:
    """Over the simulated network: a meta server with the lock calls (MetaService) says yes; one
    without them (an older meta: only its xattr service here) answers UNKNOWN_METHOD -> no."""
    import random

    from test_meta_namespace import FakeRouting

    from loomfs.client.locks import meta_has_locks
    from loomfs.meta.ops.namespace import Namespace
    from loomfs.meta.service import MetaService
    from loomfs.meta.xattr_service import XattrService
    from loomfs.net.rpc import RpcClient, RpcServer
    from loomfs.net.sim import LinkFaults, SimNetwork
    from loomfs.net.transport import Address

    class OneServer:
        def __init__(self, rpc: RpcClient, addr: Address):
            self.rpc, self.addr = rpc, addr

        async def call(self, m: Method, req: Message) -> Any:
            return (await self.rpc.call(self.addr, m, req)).body

    class Client:
        client_id = 0x77

        def __init__(self, meta: OneServer):
            self.meta = meta

    async def go() -> None:
        net = SimNetwork(seed=5, faults=LinkFaults(latency_s=0.0, jitter_s=0.0))
        store = MetaStore.open("sqlite://:memory:")
        ns = Namespace(store, routing=FakeRouting(), clock=ManualClock(), rng=random.Random(1))
        await ns.init()
        new, old = RpcServer("meta", net.transport("10.0.0.1")), RpcServer("meta", net.transport("10.0.0.3"))
        new.add_service(MetaService(ns))
        old.add_service(XattrService(ns))
        new_addr = await new.start(Address("10.0.0.1", 8100))
        old_addr = await old.start(Address("10.0.0.3", 8100))
        rpc = RpcClient(net.transport("10.0.0.2"), call_timeout_s=2.0)
        try:
            assert await meta_has_locks(Client(OneServer(rpc, new_addr)))
            assert not await meta_has_locks(Client(OneServer(rpc, old_addr)))
        finally:
            await rpc.close()
            await new.close()
            await old.close()
            await store.close()

    asyncio.run(go())
