"""Resource limits without sockets: the byte budget, a framing protocol that waits for a
payload buffer, receive buffers given back, the connection sweeper, and a server that holds
its in-flight bytes to the budget (over the simulated network)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from loomfs.net.budget import ByteBudget
from loomfs.net.limits import ServerLimits, sweep_once
from loomfs.net.protocol import RECV_POOL, FrameProtocol
from loomfs.net.rpc import CallContext, RpcClient, RpcServer
from loomfs.net.sim import SimNetwork
from loomfs.net.transport import Address
from loomfs.testing.simloop import run_virtual
from loomfs.wire import frame as fr
from loomfs.wire.storage import WRITE, WriteReq, WriteRsp


def test_budget_fifo_oversize_and_cancel() -> None:
    b = ByteBudget(100)
    assert b.try_acquire(60) and not b.try_acquire(60)
    order: list[str] = []
    b.wait(60, lambda: order.append("a"))
    cancel_b = b.wait(10, lambda: order.append("b"))
    b.wait(30, lambda: order.append("c"))
    assert not b.try_acquire(1)  # queued waiters go first
    cancel_b()
    b.release(60)
    assert order == ["a", "c"] and b.used_bytes == 90
    b.release(90)
    assert b.try_acquire(500)  # larger than the budget: admitted when nothing is in flight
    assert not b.try_acquire(1)
    b.release(500)
    assert b.used_bytes == 0 and repr(b).startswith("ByteBudget(used=0")


class FakeTransport:
    def __init__(self) -> None:
        self.paused = False
        self.aborted = False

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else None

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def abort(self) -> None:
        self.aborted = True


class GatedSink:
    def __init__(self) -> None:
        self.open = False
        self.asked = 0
        self.frames: list[tuple[int, bytes, bool]] = []

    def payload_buffer(self, kind: int, header: fr.Header, length: int) -> memoryview | None:
        self.asked += 1
        return memoryview(bytearray(length)) if self.open else None

    def frame_received(self, kind: int, header: fr.Header, payload: memoryview, crc_ok: bool) -> None:
        self.frames.append((header.request_id, bytes(payload), crc_ok))

    def connection_lost(self, exc: BaseException | None) -> None:
        pass


def _frame(rid: int, payload: bytes) -> bytes:
    h = fr.Header(1, 2, rid, 0, 0, "", {})
    return fr.encode(fr.KIND_REQUEST, h, payload) + payload


def _feed(proto: FrameProtocol, data: bytes) -> None:
    view = memoryview(data)
    while view:
        dest = proto.get_buffer(len(view))
        n = min(len(dest), len(view))
        dest[:n] = view[:n]
        proto.buffer_updated(n)
        view = view[n:]


def _protocol(sink: GatedSink) -> tuple[FrameProtocol, FakeTransport]:
    async def make() -> tuple[FrameProtocol, FakeTransport]:
        proto = FrameProtocol(lambda ch: sink)  # type: ignore[arg-type,return-value]
        tr = FakeTransport()
        proto.connection_made(tr)  # type: ignore[arg-type]
        return proto, tr

    return asyncio.run(make())


def test_protocol_waits_for_a_payload_buffer_then_resumes() -> None:
    sink = GatedSink()
    proto, tr = _protocol(sink)
    _feed(proto, _frame(1, b"a" * 1000) + _frame(2, b"b" * 10))
    assert tr.paused and proto.stalled and not proto.partial_frame and sink.frames == []
    sink.open = True
    proto.resume_reading()
    assert not tr.paused and not proto.stalled
    assert sink.frames == [(1, b"a" * 1000, True), (2, b"b" * 10, True)]


def test_protocol_stall_mid_stream_keeps_the_rest_buffered() -> None:
    sink = GatedSink()
    sink.open = True
    proto, tr = _protocol(sink)
    first = _frame(1, b"x" * 5)
    data = first + _frame(2, b"y" * 300_000)
    sink_open_after_first = data[: len(first) + 100]
    _feed(proto, sink_open_after_first)
    assert sink.frames == [(1, b"x" * 5, True)] and proto.partial_frame
    _feed(proto, data[len(first) + 100 :])
    assert sink.frames[-1] == (2, b"y" * 300_000, True)
    sink.open = False
    _feed(proto, _frame(3, b"z"))
    assert proto.stalled and tr.paused
    proto.resume_reading()  # still no buffer: stays paused, asks again
    assert proto.stalled and tr.paused and sink.asked == 4


def test_receive_buffers_go_back_to_the_pool() -> None:
    sink = GatedSink()
    sink.open = True
    proto, _ = _protocol(sink)
    _feed(proto, _frame(1, b"q" * 3))
    hits = RECV_POOL.hits
    assert proto.release_idle_buffer()
    assert not proto.release_idle_buffer()  # nothing held any more
    _feed(proto, _frame(2, b"r" * 3))  # taken again on the next read: from the pool
    assert RECV_POOL.hits == hits + 1 and sink.frames[-1] == (2, b"rrr", True)
    proto.connection_lost(None)
    assert not proto.release_idle_buffer()


@dataclass
class FakeConn:
    frames_in: int = 0
    inflight: int = 0
    held: bool = False
    partial: bool = False
    seen_frames: int = 0
    active_at: float = 0.0
    partial_since: float | None = None
    closed: str = ""
    released: int = 0

    @property
    def reading_held(self) -> bool:
        return self.held

    def partial_frame(self) -> bool:
        return self.partial

    def release_buffer(self) -> None:
        self.released += 1

    def close_for(self, reason: str) -> None:
        self.closed = reason


def test_sweeper_idle_first_frame_and_slow_loris() -> None:
    lim = ServerLimits(idle_timeout_s=10, first_frame_timeout_s=3, frame_timeout_s=5, buffer_release_s=1)
    silent, idle, loris, busy = FakeConn(), FakeConn(frames_in=1), FakeConn(frames_in=1), FakeConn(frames_in=1)
    loris.partial = True
    busy.inflight = 1
    conns = [silent, idle, loris, busy]
    for now in (0.0, 0.5):
        sweep_once(conns, lim, now)
    assert not any(c.closed for c in conns)
    sweep_once(conns, lim, 1.5)
    assert idle.released == 1 and not busy.released
    sweep_once(conns, lim, 3.0)
    assert silent.closed.startswith("idle") and not idle.closed
    sweep_once(conns, lim, 5.5)
    assert loris.closed.startswith("frame not completed")
    loris2 = FakeConn(frames_in=1, partial=True)
    sweep_once([loris2], lim, 6.0)
    loris2.frames_in = 2  # progress: a frame completed, the clock restarts
    sweep_once([loris2], lim, 10.0)
    sweep_once([loris2], lim, 14.0)
    assert not loris2.closed
    sweep_once(conns, lim, 10.5)
    assert idle.closed and not busy.closed


def test_server_holds_inflight_bytes_to_the_budget() -> None:
    chunk = 300_000
    budget = ByteBudget(700_000)  # two writes fit, the third waits

    async def go() -> None:
        net = SimNetwork(seed=3)
        gate = asyncio.Event()
        running: list[int] = []

        async def write(req: WriteReq, ctx: CallContext) -> WriteRsp:
            running.append(len(ctx.payload))
            await gate.wait()
            return WriteRsp(chunk_length=len(ctx.payload))

        server = RpcServer("svc", net.transport("10.0.0.1"), budget=budget)
        server.register(WRITE, write)
        addr = await server.start(Address("10.0.0.1", 7000))
        clients = [RpcClient(net.transport(f"10.0.0.{2 + i}"), call_timeout_s=60) for i in range(3)]
        calls = [asyncio.ensure_future(c.call(addr, WRITE, WriteReq(length=chunk), payload=b"p" * chunk))
                 for c in clients]
        for _ in range(200):
            await asyncio.sleep(0.01)
            if len(running) == 2 and budget.waiting == 1:
                break
        assert len(running) == 2 and budget.waiting == 1 and budget.used_bytes <= budget.limit_bytes
        gate.set()
        rsps = await asyncio.gather(*calls)
        assert [r.body.chunk_length for r in rsps] == [chunk] * 3
        assert budget.used_bytes == 0 and budget.peak_bytes <= budget.limit_bytes
        await server.close()

    run_virtual(asyncio.wait_for(go(), 30))


def test_connection_cap_refuses_with_a_status() -> None:
    async def go() -> None:
        from loomfs.errors import ConnectionFailed

        net = SimNetwork(seed=4)
        server = RpcServer("svc", net.transport("10.0.0.1"), limits=ServerLimits(connections_max=1))

        async def write(req: WriteReq, ctx: CallContext) -> WriteRsp:
            return WriteRsp(chunk_length=len(ctx.payload))

        server.register(WRITE, write)
        addr = await server.start(Address("10.0.0.1", 7000))
        first = RpcClient(net.transport("10.0.0.2"), call_timeout_s=5)
        second = RpcClient(net.transport("10.0.0.3"), call_timeout_s=0.5)
        await first.call(addr, WRITE, WriteReq(length=1), payload=b"1")
        with pytest.raises(ConnectionFailed, match="too many connections"):
            await second.call(addr, WRITE, WriteReq(length=1), payload=b"2", retry=False)
        assert server.refused_total >= 1 and server.connections == 1
        await first.call(addr, WRITE, WriteReq(length=1), payload=b"3")  # the first is unaffected
        await server.close()

    run_virtual(asyncio.wait_for(go(), 30))


def test_an_out_of_range_integer_in_a_handler_is_bad_request() -> None:
    async def go() -> None:
        from loomfs.errors import LoomError
        from loomfs.wire.status import Status

        net = SimNetwork(seed=5)
        server = RpcServer("svc", net.transport("10.0.0.1"))

        async def write(req: WriteReq, ctx: CallContext) -> WriteRsp:
            raise OverflowError("Python int too large to convert to SQLite INTEGER")

        server.register(WRITE, write)
        addr = await server.start(Address("10.0.0.1", 7000))
        client = RpcClient(net.transport("10.0.0.2"), call_timeout_s=5)
        with pytest.raises(LoomError) as ei:
            await client.call(addr, WRITE, WriteReq(length=1), payload=b"1", retry=False)
        assert ei.value.status is Status.BAD_REQUEST and "out of range" in str(ei.value)
        await server.close()

    run_virtual(asyncio.wait_for(go(), 30))


def test_client_replaces_a_connection_idle_longer_than_its_bound() -> None:
    async def go() -> None:
        net = SimNetwork(seed=6)
        server = RpcServer("svc", net.transport("10.0.0.1"), limits=ServerLimits(idle_timeout_s=100))

        async def write(req: WriteReq, ctx: CallContext) -> WriteRsp:
            return WriteRsp(chunk_length=len(ctx.payload))

        server.register(WRITE, write)
        addr = await server.start(Address("10.0.0.1", 7000))
        client = RpcClient(net.transport("10.0.0.2"), call_timeout_s=5, idle_reconnect_s=50)
        await client.call(addr, WRITE, WriteReq(length=1), payload=b"1", retry=False)
        first = client._conns[addr]
        await asyncio.sleep(20)
        await client.call(addr, WRITE, WriteReq(length=1), payload=b"2", retry=False)
        assert client._conns[addr] is first  # used within the bound: kept
        await asyncio.sleep(60)
        await client.call(addr, WRITE, WriteReq(length=1), payload=b"3", retry=False)
        assert client._conns[addr] is not first and first.closed  # replaced before the server's 100 s
        await asyncio.sleep(150)  # the server closes an idle connection; the next call reconnects
        assert server.closed_total.get("idle", 0) >= 1 and server.connections == 0
        await client.call(addr, WRITE, WriteReq(length=1), payload=b"4", retry=False)
        await server.close()

    run_virtual(asyncio.wait_for(go(), 600))  # virtual time


def test_a_late_reply_payload_is_drained_into_the_pool() -> None:
    async def go() -> None:
        from loomfs.errors import TimedOut
        from loomfs.net.buffers import DEFAULT_POOL
        from loomfs.net.rpc import Reply
        from loomfs.net.sim import LinkFaults
        from loomfs.wire.storage import READ, ReadReq, ReadRsp

        net = SimNetwork(seed=7, faults=LinkFaults(latency_s=0.05, jitter_s=0.0))
        server = RpcServer("svc", net.transport("10.0.0.1"))

        async def read(req: ReadReq, ctx: CallContext) -> Reply:
            # done within the server's deadline, but the reply lands after the client's
            await asyncio.sleep(0.99 if req.length > 10 else 0)
            return Reply(ReadRsp(length=req.length), b"r" * req.length)

        server.register(READ, read)
        addr = await server.start(Address("10.0.0.1", 7000))
        client = RpcClient(net.transport("10.0.0.2"), call_timeout_s=1)
        with pytest.raises(TimedOut):
            await client.call(addr, READ, ReadReq(length=100_000), retry=False)
        conn = client._conns[addr]
        misses = DEFAULT_POOL.misses
        hits = DEFAULT_POOL.hits
        await asyncio.sleep(3)  # the reply arrives after its caller gave up
        assert conn._scratch is None and not conn.closed
        assert DEFAULT_POOL.hits + DEFAULT_POOL.misses == hits + misses + 1  # drained via the pool
        rsp = await client.call(addr, READ, ReadReq(length=10), timeout_s=5, retry=False)
        assert bytes(rsp.payload) == b"r" * 10
        await server.close()

    run_virtual(asyncio.wait_for(go(), 60))
