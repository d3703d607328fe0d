"""Large payloads received on receive threads (``loomfs.net.bulkrecv``) over real sockets on
127.0.0.1: bytes and CRC verdicts as on the loop, small frames in between, a peer that
stops or closes mid-payload, and an abort after which nothing more lands in the buffer."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Callable

import pytest

from loomfs.net.bulkrecv import BULK_MIN_BYTES, BulkReceiver
from loomfs.net.protocol import FrameProtocol
from loomfs.net.tcp import TcpTransport
from loomfs.net.transport import Address, Channel
from loomfs.wire import frame as fr

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

WAIT_S = 20.0


def _frame(rid: int, payload: bytes, *, bad_crc: bool = False) -> bytes:
    h = fr.Header(1, 1, rid, 0, 0, "", {})
    crc = fr.crc(payload) ^ (1 if bad_crc else 0) if payload else 0
    return fr.encode(fr.KIND_RESPONSE, h, payload, crc) + payload


class Sink:
    """Receives into buffers it hands out (like a client's ``recv_into``) and records frames."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.frames: list[tuple[int, bytes, bool]] = []
        self.bufs: dict[int, bytearray] = {}
        self.lost: BaseException | None | bool = False
        self.changed = asyncio.Event()

    def payload_buffer(self, kind: int, header: fr.Header, length: int) -> memoryview:
        buf = self.bufs.setdefault(header.request_id, bytearray(length))
        return memoryview(buf)[:length]

    def frame_received(self, kind: int, header: fr.Header, payload: memoryview, crc_ok: bool) -> None:
        self.frames.append((header.request_id, bytes(payload), crc_ok))
        self.changed.set()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = exc if exc is not None else True
        self.changed.set()

    async def until(self, cond: Callable[[], bool]) -> None:
        """Wait for ``cond`` (checked on every event of this sink, and every 10 ms for state
        outside it, such as the pool's job count)."""
        async with asyncio.timeout(WAIT_S):
            while not cond():
                self.changed.clear()
                try:
                    await asyncio.wait_for(self.changed.wait(), 0.01)
                except TimeoutError:
                    pass


class Peer:
    """A plain-socket server on 127.0.0.1 that writes whatever the test tells it to."""

    def __init__(self) -> None:
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(1)
        self.conn: socket.socket | None = None
        self.accepted = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.conn, _ = self.srv.accept()
        self.accepted.set()

    @property
    def address(self) -> Address:
        return Address("127.0.0.1", self.srv.getsockname()[1])

    def send(self, data: bytes) -> None:
        assert self.accepted.wait(WAIT_S) and self.conn is not None
        self.conn.sendall(data)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.srv.close()


async def _connect(peer: Peer, pool: BulkReceiver) -> tuple[FrameProtocol, Sink]:
    sink = Sink(asyncio.get_running_loop())

    def factory(ch: Channel) -> Sink:
        return sink

    ch = await TcpTransport(auth=None, bulk=pool).connect(peer.address, factory, timeout_s=WAIT_S)
    assert isinstance(ch, FrameProtocol)
    return ch, sink


def test_large_and_small_frames_arrive_whole_with_crc_verdicts() -> None:
    pool = BulkReceiver(2)
    sizes = [BULK_MIN_BYTES - 1, BULK_MIN_BYTES + 1, 4 << 20, 3, 9 << 20 | 12345, 0, 2 << 20]
    payloads = {i + 1: os.urandom(n) for i, n in enumerate(sizes)}

    async def run() -> None:
        peer = Peer()
        try:
            proto, sink = await _connect(peer, pool)
            stream = b"".join(_frame(rid, p, bad_crc=(rid == 5)) for rid, p in payloads.items())
            sender = threading.Thread(target=peer.send, args=(stream,))
            sender.start()
            await sink.until(lambda: len(sink.frames) == len(payloads))
            sender.join()
            assert [(rid, ok) for rid, _, ok in sink.frames] == [(rid, rid != 5) for rid in payloads]
            assert all(got == payloads[rid] for rid, got, _ in sink.frames)
            assert pool.jobs_total >= 3 and sink.lost is False  # the big ones went to receive threads
            proto.abort()
        finally:
            peer.close()

    asyncio.run(run())


def test_peer_closing_mid_payload_loses_the_connection() -> None:
    pool = BulkReceiver(1)

    async def run() -> None:
        peer = Peer()
        try:
            proto, sink = await _connect(peer, pool)
            peer.send(_frame(1, os.urandom(4 << 20))[: 2 << 20])
            await sink.until(lambda: pool.jobs_total == 1)
            assert peer.conn is not None
            peer.conn.close()
            await sink.until(lambda: sink.lost is not False)
            assert sink.frames == [] and proto.closed
        finally:
            peer.close()

    asyncio.run(run())


def test_abort_mid_payload_stops_writing_into_the_buffer() -> None:
    pool = BulkReceiver(1)
    size = 8 << 20

    async def run() -> None:
        peer = Peer()
        try:
            proto, sink = await _connect(peer, pool)
            data = _frame(7, os.urandom(size))
            peer.send(data[: len(data) // 2])
            await sink.until(lambda: pool.jobs_total == 1)
            proto.abort()  # a caller that timed out: from here its buffer is its own again
            buf = sink.bufs[7]
            before = bytes(buf)
            try:
                peer.send(data[len(data) // 2 :])
            except OSError:
                pass  # the connection is gone: also fine
            for _ in range(20):
                await asyncio.sleep(0)
            assert bytes(buf) == before and sink.frames == []
            await sink.until(lambda: sink.lost is not False)
            # the receive thread is free for the next connection
            peer2 = Peer()
            try:
                proto2, sink2 = await _connect(peer2, pool)
                big = os.urandom(4 << 20)  # big enough for a receive thread
                peer2.send(_frame(1, big))
                await sink2.until(lambda: len(sink2.frames) == 1)
                assert sink2.frames == [(1, big, True)]
                proto2.abort()
            finally:
                peer2.close()
        finally:
            peer.close()

    asyncio.run(run())


def test_a_forked_child_gets_a_fresh_pool_lock() -> None:
    from loomfs.net.bulkrecv import DEFAULT_BULK

    with DEFAULT_BULK._lock:  # as if a receive thread held it when a DataLoader worker forked
        pid = os.fork()
        if pid == 0:  # the child: the lock must be free, the pool empty
            ok = DEFAULT_BULK._lock.acquire(timeout=5) and DEFAULT_BULK._threads == 0
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_stalled_peer_does_not_hold_up_other_connections_large_replies() -> None:
    """Every receive thread busy with a peer that stopped mid-payload: another connection's large
    reply is received on the loop at once (the reviewer's R1: it used to queue behind the stalled
    one until that call's deadline)."""
    pool = BulkReceiver(1)
    size = 4 << 20

    async def run() -> None:
        slow, fast = Peer(), Peer()
        try:
            proto1, sink1 = await _connect(slow, pool)
            proto2, sink2 = await _connect(fast, pool)
            stalled = _frame(1, os.urandom(size))
            slow.send(stalled[: len(stalled) // 2])  # the only receive thread waits for the rest
            await sink1.until(lambda: pool.jobs_total == 1)
            big = os.urandom(size)
            fast.send(_frame(2, big))
            await sink2.until(lambda: len(sink2.frames) == 1)
            assert sink2.frames == [(2, big, True)] and pool.busy_total == 1 and sink1.frames == []
            slow.send(stalled[len(stalled) // 2 :])  # the stalled one still completes on its thread
            await sink1.until(lambda: len(sink1.frames) == 1)
            assert sink1.frames[0][0] == 1 and sink1.frames[0][2] is True
            proto1.abort()
            proto2.abort()
        finally:
            slow.close()
            fast.close()

    asyncio.run(run())
