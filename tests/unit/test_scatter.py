"""Scatter receives (``net.scatter``): a payload lands in several buffers, in order, with its
CRC32C checked over the whole; and the KV cache's plan of a run's destinations."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fuzz_frame import Tr as FuzzTr

from loomfs.kvcache import _entry as E
from loomfs.kvcache._reads import Run
from loomfs.kvcache._scatter import scatter_plan
from loomfs.kvcache._values import Target
from loomfs.net.protocol import FrameProtocol
from loomfs.net.scatter import Scatter
from loomfs.wire import frame as fr


def _frame(payload: bytes, rid: int, *, crc: int | None = None) -> bytes:
    items = [1, 2, rid, 1000, 0, "", {}, 0]
    raw = msgpack.packb(items, use_bin_type=True)
    pcrc = (fr.crc(payload) if payload else 0) if crc is None else crc
    return fr.PREFIX.pack(fr.MAGIC, fr.VERSION, fr.KIND_RESPONSE, len(raw), len(payload), pcrc, fr.crc(raw)) + raw + payload


class ScatterSink:
    """Frame 1's payload goes into a Scatter of ``sizes``; others into fresh buffers."""

    def __init__(self, sizes: list[int]):
        self.bufs = [bytearray(n) for n in sizes]
        self.got: list[tuple[int, bytes, bool]] = []

    def payload_buffer(self, kind: int, header: fr.Header, length: int) -> Any:
        if header.request_id == 1:
            return Scatter(memoryview(b) for b in self.bufs)
        return memoryview(bytearray(length))

    def frame_received(self, kind: int, header: fr.Header, payload: memoryview, crc_ok: bool) -> None:
        self.got.append((header.request_id, bytes(payload), crc_ok))

    def connection_lost(self, exc: BaseException | None) -> None:
        pass


class Tr(FuzzTr):
    """test_fuzz_frame's fake transport; here a close is a failure."""

    def abort(self) -> None:
        raise AssertionError("the connection was closed")


def _feed(sink: ScatterSink, data: bytes, cuts: list[int]) -> None:
    async def go() -> None:
        proto = FrameProtocol(lambda ch: sink)
        proto.connection_made(Tr())
        view, i = memoryview(data), 0
        while view:
            dest = proto.get_buffer(len(view))
            n = max(1, min(len(dest), len(view), cuts[i % len(cuts)]))
            i += 1
            dest[:n] = view[:n]
            proto.buffer_updated(n)
            view = view[n:]

    asyncio.run(go())


@settings(max_examples=150, deadline=None, database=None)
@given(sizes=st.lists(st.integers(0, 5000), min_size=1, max_size=6).filter(lambda s: sum(s) > 0),
       cuts=st.lists(st.integers(1, 7000), min_size=1, max_size=5), bad=st.booleans())
def test_a_scatter_payload_lands_in_its_parts_in_order(sizes: list[int], cuts: list[int], bad: bool) -> None:
    payload = os.urandom(sum(sizes))
    after = os.urandom(300)
    sink = ScatterSink(sizes)
    wrong = (fr.crc(payload) ^ 1) if bad else None
    _feed(sink, _frame(payload, 1, crc=wrong) + _frame(after, 2), cuts)
    assert b"".join(sink.bufs) == payload
    assert sink.got == [(1, b"", not bad), (2, after, True)]  # the frame after it parses as usual


def test_scatter_write_and_zero_from() -> None:
    a, b, c = bytearray(3), bytearray(0), bytearray(4)
    s = Scatter([memoryview(a), memoryview(b), memoryview(c)])
    assert len(s) == 7 and len(s.parts) == 2
    assert s.write(b"abcdefgXYZ") == 7
    assert (a, c) == (b"abc", b"defg")
    s.write(b"12", at=2)
    assert (a, c) == (b"ab1", b"2efg")
    s.zero_from(5)
    assert (a, c) == (b"ab1", b"2e\0\0")


def _entry(off: int, n: int, chunk: int = 4 << 20) -> E.Entry:
    return E.Entry(key=b"k", touched_s=0.0, value_bytes=n, value_crc=0, seg_inode=7, seg_offset=off,
                   chunk_size=chunk)


def test_scatter_plan_of_a_run_with_gaps() -> None:
    mib = 1 << 20
    entries: list[E.Entry | None] = [_entry(0, 2 * mib - 100), _entry(2 * mib, 2 * mib - 8)]
    into = bytearray(2 * mib)
    plan = scatter_plan(Run(7, 0, 0, 4 * mib, [0, 1]), entries, [None, Target(into)], lambda e, b: b)
    assert plan is not None
    assert [len(p) for p in plan.scatter.parts] == [2 * mib - 100, 100, 2 * mib - 8, 8]
    assert plan.values[1][1].obj is into  # the caller's own buffer is a destination
    plan.scatter.write(bytes(range(256)) * (4 * mib // 256))
    got = plan.values[1][2]()  # a view of the caller's buffer: the value is 8 bytes shorter
    assert got.obj is into and len(got) == 2 * mib - 8 and bytes(got[:2]) == bytes([0, 1])


@pytest.mark.parametrize("case", ["small", "overlap"])
def test_scatter_plan_refuses(case: str) -> None:
    mib = 1 << 20
    if case == "small":  # small values keep the scratch (one recv per value would cost more)
        entries: list[E.Entry | None] = [_entry(0, 16 << 10), _entry(16 << 10, 16 << 10)]
        run = Run(7, 0, 0, 32 << 10, [0, 1])
    else:  # the same key asked twice
        entries = [_entry(0, 2 * mib), _entry(0, 2 * mib)]
        run = Run(7, 0, 0, 2 * mib, [0, 1])
    assert scatter_plan(run, entries, [None, None], lambda e, b: b) is None


def test_a_read_reply_scattered_over_the_simulated_network() -> None:
    """rpc_client hands a call's Scatter to the channel when the reply has its length (the sim
    channel fills the parts; Response.scattered says so); a shorter reply goes to a fresh
    buffer, as any reply the destination does not fit."""
    from loomfs.net.rpc import CallContext, Reply, RpcClient, RpcServer
    from loomfs.net.sim import SimNetwork
    from loomfs.net.transport import Address
    from loomfs.testing.simloop import run_virtual
    from loomfs.wire.storage import READ, ReadReq, ReadRsp

    data = os.urandom(10_000)

    async def go() -> None:
        net = SimNetwork(seed=7)
        server = RpcServer("storage", net.transport("10.0.0.1"))

        async def read(req: ReadReq, ctx: CallContext) -> Reply:
            return Reply(ReadRsp(length=req.length), payload=data[: req.length])

        server.register(READ, read)
        addr = await server.start(Address("10.0.0.1", 7000))
        client = RpcClient(net.transport("10.0.0.2"), call_timeout_s=5)
        a, b = bytearray(4_000), bytearray(6_000)
        rsp = await client.call(addr, READ, ReadReq(length=10_000), recv_into=Scatter([memoryview(a), memoryview(b)]))
        assert rsp.scattered == 10_000 and len(rsp.payload) == 0 and rsp.payload_crc == fr.crc(data)
        assert bytes(a + b) == data
        short = await client.call(addr, READ, ReadReq(length=7_000),
                                  recv_into=Scatter([memoryview(bytearray(4_000)), memoryview(bytearray(6_000))]))
        assert short.scattered == 0 and bytes(short.payload) == data[:7_000]
        await client.close()
        await server.close()

    run_virtual(go())
