"""RpcServer(eager=True): handlers start at once, a Task only when they suspend (no sockets).

The same requests are served eagerly and the ordinary way (a Task each) and must get the same
answers: replies, error statuses, deadlines, cancellations, budgets, observers, contexts.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any, cast

import pytest

from loomfs.common import trace
from loomfs.errors import NotFound, RemoteError, TimedOut
from loomfs.net.budget import ByteBudget
from loomfs.net.rpc import CallContext, RpcClient, RpcServer, handles
from loomfs.net.rpc_eager import first_step, resume
from loomfs.net.sim import LinkFaults, SimNetwork
from loomfs.net.transport import Address
from loomfs.testing.simloop import run_virtual
from loomfs.wire.message import Method
from loomfs.wire.meta import STAT, AttrRsp, PathReq
from loomfs.wire.status import Status
from loomfs.wire.storage import WRITE, WriteReq, WriteRsp
from loomfs.wire.types import Attr

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("test_rpc_eager_var", default="")
FWD = Method(STAT.service, 98, "eager_fwd", PathReq, AttrRsp)


class Svc:
    def __init__(self) -> None:
        self.in_task: list[bool] = []  # per request: was a Task current when the handler started
        self.cancelled = 0
        self.leaked: list[str] = []
        self.onward: tuple[RpcClient, Address] | None = None
        self.hanging = asyncio.Event()
        self.after_yield: list[bool] = []  # per request that yielded once: a Task current after it

    @handles(STAT)
    async def stat(self, req: PathReq, ctx: CallContext) -> AttrRsp:
        self.in_task.append(asyncio.current_task() is not None)
        self.leaked.append(VAR.get())
        path = req.path
        if path == "/raise":
            raise RuntimeError("bug before any await")
        if path == "/missing":
            raise NotFound("no such file", path=path)
        if path.startswith("/wait"):
            token = VAR.set(path)  # reset after the suspension: only works in the same context
            try:
                await asyncio.sleep(0.01)
                if path == "/wait-missing":
                    raise NotFound("gone while we waited", path=path)
                return AttrRsp(attr=Attr(inode=len(VAR.get())))
            finally:
                VAR.reset(token)
        if path.startswith("/yield"):  # a bare yield first, as a writer waiting for its group's COMMIT
            token = VAR.set(path)
            try:
                if path == "/yield-late":  # the request's deadline passes before its second step
                    loop = asyncio.get_running_loop()
                    loop._virtual_s += 5.0  # type: ignore[attr-defined]
                await asyncio.sleep(0)
                self.after_yield.append(asyncio.current_task() is not None)
                if path == "/yield-missing":
                    raise NotFound("gone after a yield", path=path)
                if path == "/yield-twice":
                    await asyncio.sleep(0)
                if path in ("/yield-wait", "/yield-late"):
                    await asyncio.sleep(0.01)
                return AttrRsp(attr=Attr(inode=len(VAR.get())))
            finally:
                VAR.reset(token)
        if path == "/hang":
            self.hanging.set()
            try:
                await asyncio.sleep(100)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        if path == "/onward":
            assert self.onward is not None
            client, addr = self.onward
            rsp = await client.call(addr, FWD, PathReq(path="/back"), timeout_s=1.0)
            return rsp.body  # type: ignore[no-any-return]
        VAR.set("set by " + path)  # never seen by the next request
        return AttrRsp(attr=Attr(inode=len(path)))

    @handles(WRITE)
    async def write(self, req: WriteReq, ctx: CallContext) -> WriteRsp:
        if req.offset == 1:
            await asyncio.sleep(0.01)
        return WriteRsp(chunk_length=len(ctx.payload))


class Back:
    @handles(FWD)
    async def fwd(self, req: PathReq, ctx: CallContext) -> AttrRsp:
        await asyncio.sleep(0.02)
        return AttrRsp(attr=Attr(inode=trace.current() & 0xFFFF))


def run(coro):  # type: ignore[no-untyped-def]
    return run_virtual(asyncio.wait_for(coro, 30))


async def _setup(eager: bool, budget: ByteBudget | None = None):  # type: ignore[no-untyped-def]
    net = SimNetwork(seed=5, faults=LinkFaults())
    kw = {"budget": budget} if budget is not None else {}
    server = RpcServer("svc", net.transport("10.0.0.1"), eager=eager, **kw)  # type: ignore[arg-type]
    svc = Svc()
    server.add_service(svc)
    addr = await server.start(Address("10.0.0.1", 7000))
    client = RpcClient(net.transport("10.0.0.2"), call_timeout_s=1.0)
    return net, server, svc, addr, client


@pytest.mark.parametrize("eager", [True, False])
def test_answers_are_the_same_both_ways(eager: bool) -> None:
    seen: list[tuple[str, int]] = []

    class Obs:
        def on_call(self, side: str, method: str, status: int, seconds: float, bytes_in: int,
                    bytes_out: int) -> None:
            seen.append((method, status))

    async def go() -> None:
        net, server, svc, addr, client = await _setup(eager)
        server.observers.append(Obs())
        assert (await client.call(addr, STAT, PathReq(path="/abc"))).body.attr.inode == 4
        with pytest.raises(RemoteError) as ei:
            await client.call(addr, STAT, PathReq(path="/raise"))
        assert ei.value.status is Status.INTERNAL
        with pytest.raises(NotFound):
            await client.call(addr, STAT, PathReq(path="/missing"))
        # suspends: continues in a Task, in the context the first step ran in
        assert (await client.call(addr, STAT, PathReq(path="/wait"))).body.attr.inode == 5
        with pytest.raises(NotFound):
            await client.call(addr, STAT, PathReq(path="/wait-missing"))
        # a context variable a request set is not seen by the next one
        await client.call(addr, STAT, PathReq(path="/x"))
        assert svc.leaked == [""] * 6
        # eagerly, only a handler that suspended ever ran in a Task, and none started in one
        assert svc.in_task == [not eager] * 6
        assert server.errors_total == 3
        conn = next(iter(server._connections))
        assert conn.inflight == 0 and conn.inflight_bytes == 0 and server.budget.used_bytes == 0
        await asyncio.sleep(0)
        assert not conn._tasks

    run(go())
    assert seen == [("stat", 0), ("stat", int(Status.INTERNAL)), ("stat", int(Status.ENOENT)), ("stat", 0),
                    ("stat", int(Status.ENOENT)), ("stat", 0)]


@pytest.mark.parametrize("eager", [True, False])
def test_a_suspended_handler_is_cancelled_at_its_deadline(eager: bool) -> None:
    statuses: list[int] = []
    answered = asyncio.Event()

    class Obs:
        def on_call(self, side: str, method: str, status: int, seconds: float, bytes_in: int,
                    bytes_out: int) -> None:
            statuses.append(status)
            answered.set()

    async def go() -> None:
        net, server, svc, addr, client = await _setup(eager)
        server.observers.append(Obs())
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(TimedOut):
            await client.call(addr, STAT, PathReq(path="/hang"), timeout_s=0.5, retry=False)
        # the server gave up at the request's deadline (not 100 s later), and said so
        await answered.wait()
        assert loop.time() - t0 < 1.0
        assert svc.cancelled == 1 and statuses == [int(Status.DEADLINE_EXCEEDED)]
        conn = next(iter(server._connections))
        assert conn.inflight == 0 and server.budget.used_bytes == 0
        # and goes on serving
        assert (await client.call(addr, STAT, PathReq(path="/ok"))).body.attr.inode == 3

    run(go())


@pytest.mark.parametrize("eager", [True, False])
def test_a_cancelled_handler_answers_shutting_down(eager: bool) -> None:
    async def go() -> None:
        net, server, svc, addr, client = await _setup(eager)
        call = asyncio.ensure_future(client.call(addr, STAT, PathReq(path="/hang"), timeout_s=5.0, retry=False))
        await svc.hanging.wait()
        conn = next(iter(server._connections))
        assert len(conn._tasks) == 1
        for t in list(conn._tasks):
            t.cancel()
        with pytest.raises(RemoteError) as ei:
            await call
        assert ei.value.status is Status.SHUTTING_DOWN and svc.cancelled == 1
        assert conn.inflight == 0

    run(go())


@pytest.mark.parametrize("eager", [True, False])
def test_payload_bytes_go_back_to_the_budget(eager: bool) -> None:
    async def go() -> None:
        budget = ByteBudget(1 << 20)
        net, server, svc, addr, client = await _setup(eager, budget)
        rsps = await asyncio.gather(*(
            client.call(addr, WRITE, WriteReq(length=1000, offset=i % 2), payload=bytes(1000))
            for i in range(20)))
        assert [r.body.chunk_length for r in rsps] == [1000] * 20
        assert budget.used_bytes == 0 and budget.peak_bytes >= 1000

    run(go())


def test_an_onward_call_from_the_first_step_runs_in_a_task_of_its_own() -> None:
    """``asyncio.timeout`` needs a current task; the client makes one when there is none."""

    async def go() -> None:
        net, server, svc, addr, client = await _setup(True)
        back = RpcServer("back", net.transport("10.0.0.3"), eager=True)
        back.add_service(Back())
        svc.onward = (RpcClient(net.transport("10.0.0.1")), await back.start(Address("10.0.0.3", 7001)))
        trace.TRACE.set(0x1234)
        # the first connects (suspends before the call); the second calls in the first step
        for _ in range(2):
            assert (await client.call(addr, STAT, PathReq(path="/onward"))).body.attr.inode == 0x1234
        assert svc.in_task == [False, False]

    run(go())


class _TimedConnect:
    """A transport whose connect runs under ``asyncio.timeout``, as ``TcpTransport``'s does
    (the simulated one does not): it needs a current task."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def connect(self, address: Address, sink_factory: Any, *, timeout_s: float) -> Any:
        async with asyncio.timeout(timeout_s):
            return await self.inner.connect(address, sink_factory, timeout_s=timeout_s)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_connect_from_the_first_step_runs_in_a_task_of_its_own() -> None:
    """A handler's first onward call connects before it calls: a transport connect that uses
    ``asyncio.timeout`` (TCP's) must not meet a first step with no task (it raised
    ``RuntimeError: Timeout should be used inside a task``)."""

    async def go() -> None:
        net, server, svc, addr, client = await _setup(True)
        back = RpcServer("back", net.transport("10.0.0.3"), eager=True)
        back.add_service(Back())
        onward = RpcClient(cast(Any, _TimedConnect(net.transport("10.0.0.1"))))
        svc.onward = (onward, await back.start(Address("10.0.0.3", 7001)))
        trace.TRACE.set(0x4321)
        for _ in range(2):  # the first connects in the first step; the second calls in it
            assert (await client.call(addr, STAT, PathReq(path="/onward"))).body.attr.inode == 0x4321
        assert svc.in_task == [False, False]

    run(go())


def test_two_first_steps_in_one_loop_step_share_one_connect() -> None:
    """Two requests parsed from one read: two eager first steps ask for the same new
    connection before either task ran. They must share one connect (review2's R4: each made
    its own, and the first connection was never closed by the client)."""
    net = SimNetwork(seed=5, faults=LinkFaults())
    timed = _TimedConnect(net.transport("10.0.0.1"))
    connects: list[Address] = []
    inner_connect = timed.connect

    async def counting(address: Address, sink_factory: Any, *, timeout_s: float) -> Any:
        connects.append(address)
        return await inner_connect(address, sink_factory, timeout_s=timeout_s)

    timed.connect = counting  # type: ignore[method-assign]

    async def go() -> None:
        back = RpcServer("back", net.transport("10.0.0.3"), eager=True)
        back.add_service(Back())
        addr = await back.start(Address("10.0.0.3", 7001))
        rpc = RpcClient(cast(Any, timed))
        got: list[Any] = []
        tasks: list[asyncio.Task[Any]] = []

        async def handler() -> None:
            got.append(await rpc.connection(addr))

        stepped = asyncio.Event()

        def two_requests() -> None:
            for _ in range(2):
                coro = handler()
                done, y = first_step(coro)
                if not done:
                    tasks.append(asyncio.ensure_future(resume(coro, y)))
            stepped.set()

        asyncio.get_running_loop().call_soon(two_requests)
        await stepped.wait()
        assert len(tasks) == 2
        await asyncio.gather(*tasks)
        assert len(connects) == 1 and got[0] is got[1]
        await rpc.close()
        await back.close()

    run(go())


def test_resume_forwards_results_throws_and_close() -> None:
    async def inner(fut: asyncio.Future[int]) -> int:
        try:
            return await fut + 1
        except ZeroDivisionError:
            return -1

    async def go() -> None:
        loop = asyncio.get_running_loop()
        done, value = first_step(inner(loop.create_future()))
        assert not done
        fut: asyncio.Future[int] = loop.create_future()
        coro = inner(fut)
        done, value = first_step(coro)
        assert not done and value is fut
        task = loop.create_task(_await(resume(coro, value)))
        loop.call_soon(fut.set_result, 41)
        assert await task == 42
        # a throw from the Task reaches the coroutine
        fut2: asyncio.Future[int] = loop.create_future()
        coro2 = inner(fut2)
        _, y = first_step(coro2)
        task2 = loop.create_task(_await(resume(coro2, y)))
        loop.call_soon(fut2.set_exception, ZeroDivisionError())
        assert await task2 == -1
        # finished at once
        assert first_step(_const()) == (True, 7)

    async def _await(aw):  # type: ignore[no-untyped-def]
        return await aw

    async def _const() -> int:
        return 7

    run(go())


def test_eager_under_tls_too_and_meta_only_on_sqlite(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eager handlers are on under TLS as well (FrameProtocol's TLS write limits no longer pause
    with an empty buffer: tests/integration/test_tls_write_flow.py); meta only on SQLite."""
    import ssl

    from loomfs.meta.server import eager_handlers
    from loomfs.meta.store.base import MetaStore
    from loomfs.meta.store.sqlite import SqliteStore
    from loomfs.net.auth import AuthConfig
    from loomfs.net.tcp import TcpTransport

    tls = TcpTransport(auth=AuthConfig(tls_server=ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)))
    assert RpcServer("meta", tls, eager=True).eager
    assert RpcServer("meta", TcpTransport(), eager=True).eager
    assert not RpcServer("meta", TcpTransport()).eager  # not by default

    monkeypatch.delenv("LOOMFS_RPC_EAGER", raising=False)
    assert eager_handlers(object.__new__(SqliteStore))
    monkeypatch.setenv("LOOMFS_RPC_EAGER", "0")
    assert not eager_handlers(object.__new__(SqliteStore))
    assert not eager_handlers(cast(MetaStore, object()))  # PostgreSQL: asyncpg uses asyncio.timeout


def test_eager_runs_do_not_nest() -> None:
    """A frame that arrives while an eager request runs (a budget wake-up resuming another
    connection's reading) is served in a Task: the stack stays flat."""

    async def go() -> None:
        net, server, svc, addr, client = await _setup(True)
        assert (await client.call(addr, STAT, PathReq(path="/a"))).body.attr.inode == 2
        server.eager_running = True  # as inside another request's eager run
        try:
            assert (await client.call(addr, STAT, PathReq(path="/ab"))).body.attr.inode == 3
        finally:
            server.eager_running = False
        assert svc.in_task == [False, True]

    run(go())


@pytest.mark.parametrize("eager", [True, False])
def test_a_handler_that_yields_once_is_stepped_again_without_a_task(eager: bool) -> None:
    """A bare yield (``asyncio.sleep(0)``: meta's writers wait one loop turn for their group's
    COMMIT) is stepped again from a loop callback, in the request's context: the same answers
    as in a Task, no Task; a second suspension goes to a Task; a deadline passed by then bites
    where the handler waits next (DEADLINE_EXCEEDED), as in a Task."""

    statuses: list[int] = []
    answered = asyncio.Event()

    class Obs:
        def on_call(self, side: str, method: str, status: int, seconds: float, bytes_in: int,
                    bytes_out: int) -> None:
            statuses.append(status)
            answered.set()

    async def go() -> None:
        net, server, svc, addr, client = await _setup(eager)
        server.observers.append(Obs())
        assert (await client.call(addr, STAT, PathReq(path="/yield"))).body.attr.inode == 6
        with pytest.raises(NotFound):
            await client.call(addr, STAT, PathReq(path="/yield-missing"))
        assert (await client.call(addr, STAT, PathReq(path="/yield-twice"))).body.attr.inode == 12
        assert (await client.call(addr, STAT, PathReq(path="/yield-wait"))).body.attr.inode == 11
        answered.clear()
        with pytest.raises((RemoteError, TimedOut)):  # the client's own timer may fire first
            await client.call(addr, STAT, PathReq(path="/yield-late"), timeout_s=1.0, retry=False)
        await answered.wait()
        assert statuses == [0, int(Status.ENOENT), 0, 0, int(Status.DEADLINE_EXCEEDED)]
        assert svc.after_yield == [not eager] * 5
        assert svc.leaked == [""] * 5  # each reset its variable in its own context
        conn = next(iter(server._connections))
        await asyncio.sleep(0)
        assert conn.inflight == 0 and conn.inflight_bytes == 0 and server.budget.used_bytes == 0
        assert not conn._tasks
        assert (await client.call(addr, STAT, PathReq(path="/ok"))).body.attr.inode == 3

    run(go())
