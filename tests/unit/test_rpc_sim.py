"""RPC server and client over the simulated network: dispatch, errors, partitions (no sockets)."""

from __future__ import annotations

import asyncio

import pytest

from loomfs.errors import ChecksumError, ConnectionFailed, NotFound, RemoteError, TimedOut
from loomfs.net.rpc import CallContext, Reply, RpcClient, RpcServer, handles
from loomfs.net.sim import LinkFaults, SimNetwork
from loomfs.net.transport import Address
from loomfs.testing.simloop import run_virtual
from loomfs.wire.message import Empty
from loomfs.wire.meta import META_PING, STAT, AttrRsp, PathReq
from loomfs.wire.status import Status
from loomfs.wire.storage import READ, WRITE, ReadReq, ReadRsp, WriteReq, WriteRsp
from loomfs.wire.types import Attr


class Svc:
    def __init__(self) -> None:
        self.seen: list[bytes] = []

    @handles(STAT)
    async def stat(self, req: PathReq, ctx: CallContext) -> AttrRsp:
        if req.path == "/missing":
            raise NotFound("no such file", path=req.path)
        if req.path == "/boom":
            raise RuntimeError("bug")
        if req.path == "/slow":
            await asyncio.sleep(10)
        return AttrRsp(attr=Attr(inode=len(req.path)))

    @handles(WRITE)
    async def write(self, req: WriteReq, ctx: CallContext) -> WriteRsp:
        self.seen.append(bytes(ctx.payload))
        return WriteRsp(chunk_length=len(ctx.payload))

    @handles(READ)
    async def read(self, req: ReadReq, ctx: CallContext) -> Reply:
        data = bytes(range(256)) * (req.length // 256 + 1)
        return Reply(ReadRsp(length=req.length), memoryview(data)[: req.length])


def run(coro):  # type: ignore[no-untyped-def]
    return run_virtual(asyncio.wait_for(coro, 20))


async def _setup(seed: int = 1, faults: LinkFaults | None = None):  # type: ignore[no-untyped-def]
    net = SimNetwork(seed=seed, faults=faults or LinkFaults())
    server = RpcServer("svc", net.transport("10.0.0.1"))
    svc = Svc()
    server.add_service(svc)
    addr = await server.start(Address("10.0.0.1", 7000))
    client = RpcClient(net.transport("10.0.0.2"), call_timeout_s=1.0)
    return net, server, svc, addr, client


def test_roundtrip_payloads_and_errors() -> None:
    async def go() -> None:
        net, server, svc, addr, client = await _setup()
        rsp = await client.call(addr, STAT, PathReq(path="/abc"))
        assert rsp.body.attr.inode == 4
        await client.call(addr, WRITE, WriteReq(length=5), payload=b"hello")
        assert svc.seen == [b"hello"]
        into = memoryview(bytearray(1000))
        rsp = await client.call(addr, READ, ReadReq(length=700), recv_into=into)
        assert rsp.payload.obj is into.obj and bytes(rsp.payload) == (bytes(range(256)) * 3)[:700]
        with pytest.raises(NotFound):
            await client.call(addr, STAT, PathReq(path="/missing"))
        with pytest.raises(RemoteError) as ei:
            await client.call(addr, STAT, PathReq(path="/boom"))
        assert ei.value.status is Status.INTERNAL
        with pytest.raises(RemoteError) as ei:
            await client.call(addr, META_PING, Empty())
        assert ei.value.status is Status.UNKNOWN_METHOD
        # the server survived all of it
        assert (await client.call(addr, STAT, PathReq(path="/x"))).body.attr.inode == 2
        assert server.errors_total == 3

    run(go())


def test_bad_payload_crc_is_refused_not_fatal() -> None:
    async def go() -> None:
        net, server, svc, addr, client = await _setup()
        with pytest.raises(ChecksumError):
            await client.call(addr, WRITE, WriteReq(length=5), payload=b"hello", payload_crc=123, retry=False)
        assert svc.seen == []
        await client.call(addr, WRITE, WriteReq(length=2), payload=b"ok")
        assert svc.seen == [b"ok"]

    run(go())


def test_deadline_and_partition() -> None:
    async def go() -> None:
        net, server, svc, addr, client = await _setup()
        with pytest.raises(TimedOut):
            await client.call(addr, STAT, PathReq(path="/slow"), timeout_s=0.2)
        await client.call(addr, STAT, PathReq(path="/a"))
        net.partition("10.0.0.1", "10.0.0.2")
        with pytest.raises((TimedOut, ConnectionFailed)):
            await client.call(addr, STAT, PathReq(path="/a"), timeout_s=0.3)
        net.heal()
        assert (await client.call(addr, STAT, PathReq(path="/abc"))).body.attr.inode == 4

    run(go())


def test_bad_request_body() -> None:
    async def go() -> None:
        net, server, svc, addr, client = await _setup()
        from loomfs.wire.message import Message, Method, message

        @message
        class Evil(Message):
            path: int = 5

        evil = Method(STAT.service, STAT.method, "evil", Evil, AttrRsp)
        with pytest.raises(RemoteError) as ei:
            await client.call(addr, evil, Evil())
        assert ei.value.status is Status.BAD_REQUEST

    run(go())


def test_same_seed_same_schedule() -> None:
    async def trace(seed: int) -> list[int]:
        net, server, svc, addr, client = await _setup(seed, LinkFaults(latency_s=0.001, jitter_s=0.0009))
        order: list[int] = []

        async def one(i: int) -> None:
            await client.call(addr, STAT, PathReq(path="/" + "x" * i))
            order.append(i)

        await asyncio.gather(*(one(i) for i in range(20)))
        return order

    assert run(trace(5)) == run(trace(5))
    assert run(trace(5)) != run(trace(6))  # the seed really drives the schedule


def test_virtual_time_makes_long_sleeps_free() -> None:
    import time

    async def go() -> float:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.sleep(15)
        return loop.time() - t0

    wall = time.monotonic()
    assert run(go()) == 15
    assert time.monotonic() - wall < 10  # 15 virtual seconds; generous for a loaded runner


def test_observers_see_every_call_with_bytes_and_status() -> None:
    seen: list[tuple[str, str, int, int, int]] = []

    class Obs:
        def on_call(self, side: str, method: str, status: int, seconds: float, bytes_in: int,
                    bytes_out: int) -> None:
            assert seconds >= 0
            seen.append((side, method, status, bytes_in, bytes_out))

    async def go() -> None:
        net, server, svc, addr, client = await _setup()
        server.observers.append(Obs())
        client.observers.append(Obs())
        await client.call(addr, WRITE, WriteReq(length=5), payload=b"hello")
        await client.call(addr, READ, ReadReq(length=300))
        with pytest.raises(NotFound):
            await client.call(addr, STAT, PathReq(path="/missing"))

    run(go())
    assert ("server", "write", 0, 5, 0) in seen and ("client", "write", 0, 0, 5) in seen
    assert ("server", "read", 0, 0, 300) in seen and ("client", "read", 0, 300, 0) in seen
    assert ("server", "stat", int(Status.ENOENT), 0, 0) in seen
    assert ("client", "stat", int(Status.ENOENT), 0, 0) in seen


def test_trace_id_follows_a_request_across_servers() -> None:
    from loomfs.common import trace
    from loomfs.wire.message import Method

    fwd_method = Method(STAT.service, 99, "fwd", PathReq, AttrRsp)
    seen: dict[str, int] = {}

    class Front:
        def __init__(self, client: RpcClient, back: Address):
            self.client, self.back = client, back

        @handles(STAT)
        async def stat(self, req: PathReq, ctx: CallContext) -> AttrRsp:
            seen["front"] = trace.current()
            rsp = await self.client.call(self.back, fwd_method, PathReq(path=req.path))
            return rsp.body  # type: ignore[no-any-return]

    class Back:
        @handles(fwd_method)
        async def fwd(self, req: PathReq, ctx: CallContext) -> AttrRsp:
            seen["back"] = trace.current()
            return AttrRsp(attr=Attr(inode=42))

    async def go() -> None:
        net = SimNetwork(seed=3)
        back = RpcServer("back", net.transport("10.0.0.3"))
        back.add_service(Back())
        back_addr = await back.start(Address("10.0.0.3", 7001))
        front = RpcServer("front", net.transport("10.0.0.1"))
        front.add_service(Front(RpcClient(net.transport("10.0.0.1")), back_addr))
        front_addr = await front.start(Address("10.0.0.1", 7000))
        client = RpcClient(net.transport("10.0.0.2"))
        trace.TRACE.set(0xABC)
        rsp = await client.call(front_addr, STAT, PathReq(path="/x"))
        assert rsp.body.attr.inode == 42

    run(go())
    assert seen == {"front": 0xABC, "back": 0xABC}


# ---- network faults (the simulator's) ------------------------------------------------------------
def test_one_way_cut_holds_frames_until_heal() -> None:
    """TCP semantics: a cut delays frames (retransmission), it does not lose them; a request
    sent during the cut reaches the server after the heal even though its caller gave up."""

    async def go() -> None:
        net, server, svc, addr, client = await _setup()
        await client.call(addr, WRITE, WriteReq(length=1), payload=b"a")
        net.cut("10.0.0.2", "10.0.0.1")  # client -> server only
        assert net.is_cut("10.0.0.2", "10.0.0.1") and not net.is_cut("10.0.0.1", "10.0.0.2")
        with pytest.raises(TimedOut):
            await client.call(addr, WRITE, WriteReq(length=1), payload=b"b", timeout_s=0.5, retry=False)
        assert svc.seen == [b"a"]
        net.heal()
        await asyncio.sleep(0.01)
        assert svc.seen == [b"a", b"b"]  # the stale request arrives late
        await client.call(addr, WRITE, WriteReq(length=1), payload=b"c")
        assert svc.seen == [b"a", b"b", b"c"]

    run(go())


def test_connect_across_a_cut_times_out_and_a_dead_host_refuses() -> None:
    from loomfs.errors import ConnectRefused

    async def go() -> None:
        net, server, svc, addr, client = await _setup()
        net.cut("10.0.0.1", "10.0.0.2")  # replies cannot come back: the handshake fails too
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(TimedOut):
            await client.call(addr, STAT, PathReq(path="/a"), timeout_s=0.4, retry=False)
        assert loop.time() - t0 >= 0.4
        net.heal()
        net.crash_host("10.0.0.1")
        with pytest.raises(ConnectRefused):
            await client.call(addr, STAT, PathReq(path="/a"), timeout_s=0.4, retry=False)

    run(go())


def test_crash_host_resets_connections() -> None:
    async def go() -> None:
        net, server, svc, addr, client = await _setup()
        await client.call(addr, STAT, PathReq(path="/a"))
        call = asyncio.ensure_future(client.call(addr, STAT, PathReq(path="/slow"), retry=False))
        await asyncio.sleep(0.1)
        net.crash_host("10.0.0.1")
        with pytest.raises(ConnectionFailed):
            await call

    run(go())


def test_pause_holds_traffic_both_ways() -> None:
    async def go() -> None:
        net, server, svc, addr, client = await _setup()
        await client.call(addr, STAT, PathReq(path="/a"))
        net.pause("10.0.0.1")
        call = asyncio.ensure_future(client.call(addr, WRITE, WriteReq(length=1), payload=b"p", timeout_s=5.0))
        await asyncio.sleep(2.0)
        assert svc.seen == [] and not call.done()
        net.resume("10.0.0.1")
        await call
        assert svc.seen == [b"p"]

    run(go())


def test_duplicated_requests_arrive_again_on_a_new_connection() -> None:
    from loomfs.net.sim import LinkState

    async def go() -> None:
        net, server, svc, addr, client = await _setup()
        net.set_link("10.0.0.2", "10.0.0.1", LinkState(dup_rate=1.0, dup_delay_s=0.05))
        await client.call(addr, WRITE, WriteReq(length=1), payload=b"d")
        await asyncio.sleep(0.2)
        assert svc.seen == [b"d", b"d"] and net.frames_duplicated == 1
        net.set_link("10.0.0.2", "10.0.0.1", LinkState())
        await client.call(addr, WRITE, WriteReq(length=1), payload=b"e")
        await asyncio.sleep(0.2)
        assert svc.seen == [b"d", b"d", b"e"]

    run(go())


def test_resets_and_reordering() -> None:
    from loomfs.net.sim import LinkState

    async def go() -> None:
        net, server, svc, addr, client = await _setup(seed=4)
        net.set_link("10.0.0.2", "10.0.0.1", LinkState(reset_rate=1.0))
        with pytest.raises(ConnectionFailed):
            await client.call(addr, STAT, PathReq(path="/a"), retry=False)
        assert net.connections_reset == 1
        net.set_link("10.0.0.2", "10.0.0.1", LinkState(reorder_s=0.05))
        for i in range(20):
            await client.call(addr, WRITE, WriteReq(length=1), payload=bytes([i]))  # reconnects
        payloads = [bytes([i]) for i in range(20)]
        assert svc.seen == payloads  # one at a time: order kept by the caller
        sends = [client.call(addr, WRITE, WriteReq(length=1), payload=bytes([100 + i])) for i in range(20)]
        await asyncio.gather(*sends)
        late = svc.seen[20:]
        assert sorted(late) == [bytes([100 + i]) for i in range(20)] and late != sorted(late)

    run(go())


def test_cancelled_connector_does_not_cancel_the_callers_waiting_on_it() -> None:
    """Found by the simulator (seeds 239, 555): a request handler cancelled while it was
    connecting handed its CancelledError to every call waiting on the same connect — one of
    them the storage node's heartbeat loop, which died, and the node dropped out for good."""

    async def main() -> None:
        net, server, svc, addr, client = await _setup()
        first = asyncio.ensure_future(client.call(addr, STAT, PathReq(path="/a")))
        await asyncio.sleep(0)  # the first call is connecting
        second = asyncio.ensure_future(client.call(addr, STAT, PathReq(path="/bb")))
        await asyncio.sleep(0)  # the second waits on the same connect
        first.cancel()
        rsp = await second
        assert rsp.body.attr.inode == 3
        assert first.cancelled()
        await client.close()
        await server.close()

    run(main())
