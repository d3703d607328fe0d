"""asyncio ``BufferedProtocol`` that splits a byte stream into frames.

Prefixes and headers are received into one preallocated per-connection buffer; a frame's
payload is received straight into a destination the owner picks (``PayloadSink``): the
caller's own buffer for a read reply, a pooled buffer for a server request. Small frames
that arrive together are parsed from one ``recv``. A malformed frame closes this connection.

Receive buffers are anonymous mmaps from a small shared pool (``RECV_POOL``): pages are
resident only once touched, an idle connection can hand its buffer back
(``release_idle_buffer``) and a closed one always does, so memory of idle and closed
connections goes back to the pool or, past its bound, to the OS. A sink may answer
``payload_buffer`` with ``None`` (no budget for the payload now): the protocol then stops
reading and asks again on ``resume_reading``.

With a ``bulk`` receiver (the client side), the rest of a large payload is received on a
receive thread (``net.bulkrecv``) while this connection's reading is paused; the server side
passes none and receives everything on its loop. A sink may also answer a ``Scatter``
(``net.scatter``): the payload is received into its parts in order, always on the loop (a
receive thread for them cost the client more CPU for no wall gain: docs/kvcache.md, session 11).
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import socket
from collections.abc import Callable
from typing import Protocol

from loomfs.net.buffers import BufferPool
from loomfs.net.bulkrecv import BULK_MIN_BYTES, BulkJob, BulkReceiver
from loomfs.net.scatter import Scatter
from loomfs.net.sendfile import FileRegion, sendfile_some
from loomfs.wire import frame as fr

logger = logging.getLogger(__name__)

INITIAL_RECV_BYTES = 256 << 10
# with a bulk receiver, a read that starts a new frame takes at most this much: the loop copies
# only the head of a large payload (the rest goes to a receive thread), not 256 KiB of it
BULK_HEAD_RECV_BYTES = 64 << 10
LARGE_PAYLOAD_BYTES = 128 << 10
RECV_POOL = BufferPool(max_cached_bytes=16 << 20)  # receive buffers of idle/closed connections
KEEPALIVE_IDLE_S = 60  # TCP keepalive: a peer that vanished (half-open) is found in ~90 s
KEEPALIVE_INTERVAL_S = 10
KEEPALIVE_PROBES = 3


def _set_once(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class FrameSink(Protocol):
    """What a connection owner implements."""

    def payload_buffer(self, kind: int, header: fr.Header, length: int) -> memoryview | Scatter | None:
        """Where to receive a payload of ``length`` bytes (exactly that long; a ``Scatter``:
        its parts in order, and ``frame_received`` then gets an empty payload); ``None``:
        not now (the channel stops reading and asks again when reading resumes)."""
        ...

    def frame_received(
        self, kind: int, header: fr.Header, payload: memoryview, crc_ok: bool
    ) -> None: ...

    def connection_lost(self, exc: BaseException | None) -> None: ...


class FrameProtocol(asyncio.BufferedProtocol):
    def __init__(
        self,
        sink_factory: Callable[[FrameProtocol], FrameSink],
        *,
        max_payload_bytes: int = fr.DEFAULT_MAX_PAYLOAD_BYTES,
        bulk: BulkReceiver | None = None,
    ):
        self.max_payload_bytes = max_payload_bytes
        self._bulk = bulk
        self._bulk_job: BulkJob | None = None  # the payload being received on a receive thread
        self._sink_factory = sink_factory
        self.sink: FrameSink | None = None
        self.transport: asyncio.Transport | None = None
        self._buf: mmap.mmap | None = None  # taken from RECV_POOL on first use
        self._mv = memoryview(b"")
        self._start = 0
        self._end = 0
        self._prefix: fr.Prefix | None = None
        # payload in progress
        self._p_header: fr.Header | None = None
        self._p_kind = 0
        self._p_dest: memoryview | None = None  # the payload's buffer (a scatter's current part)
        self._p_pos = 0
        self._p_parts: list[memoryview] | None = None  # a scatter's parts (the ones after _p_dest)
        self._p_crc = 0
        self._p_acc = 0  # CRC32C of the payload bytes received so far (hashed while cache-hot)
        self._stalled: tuple[int, fr.Header, int, int] | None = None  # waiting for a payload buffer
        self._reading_paused = False
        self._closed = False
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._send_lock = asyncio.Lock()
        self._raw: socket.socket | None = None  # dup of the socket for zero-copy large sends
        self.peer = ""

    # ---- asyncio callbacks -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tr: asyncio.Transport = transport  # type: ignore[assignment]  # uvloop's are not asyncio.Transport subclasses
        self.transport = tr
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                if hasattr(socket, "TCP_KEEPIDLE"):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_S)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES)
            except OSError:
                pass
            loop = asyncio.get_running_loop()
            # uvloop refuses add_writer on its fds; under TLS the bytes must go through the SSL layer
            if type(loop).__module__.startswith("asyncio") and transport.get_extra_info("ssl_object") is None:
                try:
                    self._raw = sock.dup()
                    self._raw.setblocking(False)
                except OSError:
                    self._raw = None
        # pause/resume == buffer non-empty/empty. A plain transport pauses at size > high, the
        # TLS one (sslproto) at size >= high: high=0 there paused with an EMPTY buffer and, as
        # no later write came to resume it, a send could wait in _drained() forever.
        tls = transport.get_extra_info("ssl_object") is not None
        tr.set_write_buffer_limits(high=1 if tls else 0, low=0)
        self.sink = self._sink_factory(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._p_dest is not None:
            return self._p_dest[self._p_pos :]
        if self._buf is None:
            self._take_buffer(INITIAL_RECV_BYTES)
        if self._end == len(self._mv):
            self._make_room(len(self._mv) - (self._end - self._start) or 1)
        if self._bulk is not None and self._end == self._start:
            return self._mv[self._end : self._end + BULK_HEAD_RECV_BYTES]
        return self._mv[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._closed:
            return
        try:
            if self._p_dest is not None:
                self._p_acc = fr.crc(self._p_dest[self._p_pos : self._p_pos + nbytes], self._p_acc)
                self._p_pos += nbytes
                if self._p_pos == len(self._p_dest):
                    if self._p_parts:  # a scatter: on to its next part
                        self._p_dest, self._p_pos = self._p_parts.pop(), 0
                    else:
                        self._finish_payload()
                return
            self._end += nbytes
            if self._stalled is None:
                self._parse()
        except fr.FrameError as exc:
            logger.warning("closing connection from %s: %s", self.peer, exc)
            self.abort(exc)

    def eof_received(self) -> bool | None:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._stalled = None
        self._cancel_bulk()
        self._give_back_buffer()
        if self._raw is not None:
            try:
                asyncio.get_running_loop().remove_writer(self._raw.fileno())
            except (RuntimeError, ValueError, OSError):
                pass
            self._raw.close()
            self._raw = None
        for w in self._drain_waiters:
            if not w.done():
                w.set_exception(ConnectionResetError("connection lost"))
        self._drain_waiters.clear()
        if self.sink is not None:
            self.sink.connection_lost(exc)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        for w in self._drain_waiters:
            if not w.done():
                w.set_result(None)
        self._drain_waiters.clear()

    # ---- sending ---------------------------------------------------------------------------
    async def send(self, prefix_and_header: bytes,
                   payload: bytes | bytearray | memoryview | FileRegion | None) -> None:
        """Send one frame; when this returns the payload may be reused.

        Frames go out one at a time (a lock keeps them whole). Small ones go through the
        asyncio transport. A large payload is sent with ``socket.send`` on a dup of the
        socket, straight from the caller's buffer, once the transport's own buffer is empty:
        on Python 3.11 the transport would copy whatever the kernel does not take at once
        into a freshly grown buffer, and fresh memory is slow on this VM. A ``FileRegion``
        payload goes out with ``os.sendfile`` on that dup (page cache -> socket), or is read
        into memory first where there is no dup (TLS, uvloop).
        """
        if self._closed or self.transport is None:
            raise ConnectionResetError("connection closed")
        if isinstance(payload, FileRegion) and self._raw is None:
            payload = bytes(payload)
        async with self._send_lock:
            if self._closed:
                raise ConnectionResetError("connection closed")
            region = payload if isinstance(payload, FileRegion) else None
            large = payload is not None and (region is not None or (
                len(payload) >= LARGE_PAYLOAD_BYTES and self._raw is not None))
            self.transport.write(prefix_and_header)
            if payload is not None and len(payload) and not large:
                self.transport.write(payload)  # type: ignore[arg-type]  # not a FileRegion: large
            if self._write_paused:
                await self._drained()
            if region is not None:
                await self._raw_sendfile(region)
            elif large:
                assert payload is not None and not isinstance(payload, FileRegion)
                await self._raw_send(memoryview(payload).cast("B"))

    async def _raw_sendfile(self, region: FileRegion) -> None:
        """``region`` with ``os.sendfile`` on the dup of the socket; a failure midway (the
        file ended early, the socket broke) leaves a torn frame: the connection is aborted."""
        assert self._raw is not None
        loop = asyncio.get_running_loop()
        fd = self._raw.fileno()
        off, total = 0, len(region)
        while off < total:
            if self._closed:
                raise ConnectionResetError("connection closed")
            try:
                off += sendfile_some(fd, region, off)
            except OSError as exc:
                self.abort(exc)
                raise ConnectionResetError(f"sendfile failed: {exc}") from exc
            if off < total:
                await self._writable(loop, fd)

    async def _writable(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        """Wait until the socket (the dup ``fd``) takes more bytes, or the connection is lost."""
        fut: asyncio.Future[None] = loop.create_future()
        loop.add_writer(fd, _set_once, fut)
        self._drain_waiters.append(fut)
        try:
            await fut
        finally:
            loop.remove_writer(fd)

    async def _drained(self) -> None:
        """Wait until the transport's buffer is empty (pause == non-empty, see connection_made)."""
        while self._write_paused:
            if self._closed:
                raise ConnectionResetError("connection closed")
            if self.transport is not None and self.transport.get_write_buffer_size() == 0:
                return  # nothing left to drain, whatever the last pause/resume said
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(fut)
            await fut

    async def _raw_send(self, view: memoryview) -> None:
        assert self._raw is not None
        loop = asyncio.get_running_loop()
        fd = self._raw.fileno()
        off, total = 0, len(view)
        while off < total:
            if self._closed:
                raise ConnectionResetError("connection closed")
            try:
                off += self._raw.send(view[off:])
            except (BlockingIOError, InterruptedError):
                pass
            except OSError as exc:
                self.abort(exc)
                raise ConnectionResetError(f"send failed: {exc}") from exc
            if off < total:
                await self._writable(loop, fd)

    async def drain(self) -> None:
        if self._closed:
            raise ConnectionResetError("connection closed")

    def abort(self, exc: BaseException | None = None) -> None:
        self._cancel_bulk()  # before returning: nothing lands in a caller's buffer after abort
        if self.transport is not None and not self._closed:
            self.transport.abort()
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def pause_reading(self) -> None:
        self._reading_paused = True
        if self.transport is not None and not self._closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        """Read again; a payload that was waiting for a buffer asks for one first."""
        self._reading_paused = False
        if self._closed:
            return
        if self._stalled is not None:
            try:
                if not self._resume_stalled():
                    return
                self._parse()
            except fr.FrameError as exc:
                logger.warning("closing connection from %s: %s", self.peer, exc)
                self.abort(exc)
                return
            if self._reading_paused or self._stalled is not None or self._closed:
                return  # the sink paused us again while frames were being parsed
        if self.transport is not None and self._bulk_job is None:
            self.transport.resume_reading()

    @property
    def partial_frame(self) -> bool:
        """Part of a frame has arrived and the rest has not (not counting a payload that
        waits for a buffer on our side)."""
        if self._stalled is not None:
            return False
        return self._p_dest is not None or self._end > self._start

    @property
    def stalled(self) -> bool:
        return self._stalled is not None

    def release_idle_buffer(self) -> bool:
        """Give the receive buffer back when nothing is buffered (idle connection)."""
        if self._buf is None or self._end != self._start or self._p_dest is not None or self._stalled:
            return False
        self._give_back_buffer()
        return True

    def _take_buffer(self, n: int) -> None:
        buf = RECV_POOL.acquire(n)
        assert isinstance(buf, mmap.mmap)
        self._buf, self._mv = buf, memoryview(buf)
        self._start = self._end = 0

    def _give_back_buffer(self) -> None:
        buf, self._buf = self._buf, None
        if buf is not None:
            self._mv.release()
            self._mv = memoryview(b"")
            self._start = self._end = 0
            RECV_POOL.release(buf)

    # ---- parsing ---------------------------------------------------------------------------
    def _make_room(self, need: int) -> None:
        """Compact the receive buffer; grow it (bounded) when a header will not fit."""
        assert self._buf is not None
        live = self._end - self._start
        if self._start:
            self._buf.move(0, self._start, live)
            self._start, self._end = 0, live
        if len(self._buf) - live < need:
            size = len(self._buf)
            while size - live < need:
                size *= 2
            if size > fr.MAX_HEADER_BYTES + fr.PREFIX_SIZE + INITIAL_RECV_BYTES:
                raise fr.FrameError("receive buffer would exceed its bound")
            old, old_mv = self._buf, self._mv
            new = RECV_POOL.acquire(size)
            assert isinstance(new, mmap.mmap)
            new[:live] = old[:live]
            old_mv.release()
            RECV_POOL.release(old)
            self._buf, self._mv = new, memoryview(new)

    def _parse(self) -> None:
        assert self.sink is not None
        while not self._closed:
            avail = self._end - self._start
            if self._prefix is None:
                if avail < fr.PREFIX_SIZE:
                    break
                self._prefix = fr.parse_prefix(
                    self._mv[self._start : self._start + fr.PREFIX_SIZE], self.max_payload_bytes
                )
            prefix = self._prefix
            need = fr.PREFIX_SIZE + prefix.header_len
            if avail < need:
                if len(self._mv) - self._start < need:
                    self._make_room(need)
                break
            hstart = self._start + fr.PREFIX_SIZE
            header = fr.decode_header(prefix, self._mv[hstart : hstart + prefix.header_len])
            header.payload_crc = prefix.payload_crc
            self._start += need
            self._prefix = None
            plen = prefix.payload_len
            if plen == 0:
                self.sink.frame_received(prefix.kind, header, memoryview(b""), prefix.payload_crc == 0)
                continue
            if not self._begin_payload(prefix.kind, header, plen, prefix.payload_crc):
                break
            if self._p_dest is not None:
                # the rest of the payload goes straight into dest
                self._start = self._end = 0
                break
        if self._start == self._end:
            self._start = self._end = 0

    def _begin_payload(self, kind: int, header: fr.Header, plen: int, pcrc: int) -> bool:
        """Start receiving a payload; False when the sink has no buffer for it yet."""
        assert self.sink is not None
        dest = self.sink.payload_buffer(kind, header, plen)
        if dest is None:
            self._stalled = (kind, header, plen, pcrc)
            if not self._reading_paused:
                self._reading_paused = True
                if self.transport is not None:
                    self.transport.pause_reading()
            return False
        if len(dest) != plen:
            raise fr.FrameError("payload sink returned a buffer of the wrong size")
        take = min(plen, self._end - self._start)
        if isinstance(dest, Scatter):
            return self._begin_scatter(kind, header, dest, take, pcrc)
        if take:
            dest[:take] = self._mv[self._start : self._start + take]
            self._start += take
        self._p_header, self._p_kind, self._p_dest = header, kind, dest
        self._p_pos, self._p_crc = take, pcrc
        self._p_acc = fr.crc(dest[:take]) if take else 0
        if take == plen:
            self._finish_payload()
        elif self._bulk is not None and self._raw is not None and plen - take >= BULK_MIN_BYTES:
            self._start_bulk()
        return True

    def _begin_scatter(self, kind: int, header: fr.Header, dest: Scatter, take: int, pcrc: int) -> bool:
        """A payload received into ``dest``'s parts (on the loop, never on a receive thread)."""
        head = self._mv[self._start : self._start + take]
        dest.write(head)
        self._start += take
        self._p_acc = fr.crc(head) if take else 0
        parts = dest.parts[::-1]  # popped from the end: the next part last
        cur = parts.pop()
        pos = take
        while pos >= len(cur) and parts:
            pos -= len(cur)
            cur = parts.pop()
        self._p_header, self._p_kind, self._p_dest, self._p_parts = header, kind, cur, parts
        self._p_pos, self._p_crc = pos, pcrc
        if take == dest.nbytes:
            self._finish_payload()
        return True

    # ---- large payloads on a receive thread ------------------------------------------------
    def _start_bulk(self) -> None:
        assert self._bulk is not None and self._raw is not None and self._p_dest is not None
        # stop reading first: the epoll change is done before a receive thread wakes up and
        # competes for the GIL
        if self.transport is not None:
            self.transport.pause_reading()  # the receive thread owns the socket's input now
        try:
            self._bulk_job = self._bulk.start(self._raw, self._p_dest, self._p_pos, self._p_acc, self._bulk_done)
        except OSError as exc:  # no fd for the dup (EMFILE), no thread: receive it on the loop
            logger.debug("receiving a payload from %s on the loop: %s", self.peer, exc)
            if self.transport is not None and not self._reading_paused:
                self.transport.resume_reading()

    def _bulk_done(self, job: BulkJob) -> None:
        if job is not self._bulk_job:
            return  # cancelled (the connection was aborted or lost meanwhile)
        self._bulk_job = None
        if self._closed:
            return
        if job.error is not None:
            logger.warning("closing connection to %s: receiving a payload failed: %s", self.peer, job.error)
            self.abort(job.error)
            return
        self._p_pos, self._p_acc = job.pos, job.acc
        self._finish_payload()
        if not self._closed and not self._reading_paused and self._stalled is None and self.transport is not None:
            self.transport.resume_reading()

    def _cancel_bulk(self) -> None:
        job, self._bulk_job = self._bulk_job, None
        if job is not None:
            job.cancel()

    def _resume_stalled(self) -> bool:
        """Ask again for the stalled payload's buffer; True once it is being received."""
        assert self._stalled is not None
        kind, header, plen, pcrc = self._stalled
        self._stalled = None
        if not self._begin_payload(kind, header, plen, pcrc):
            return False
        if self._p_dest is not None:
            self._start = self._end = 0  # everything buffered went into dest
        return True

    def _finish_payload(self) -> None:
        assert self.sink is not None and self._p_dest is not None and self._p_header is not None
        dest, header, kind, want = self._p_dest, self._p_header, self._p_kind, self._p_crc
        if self._p_parts is not None:  # a scatter: its bytes are in its parts
            dest, self._p_parts = memoryview(b""), None
        self._p_dest = self._p_header = None
        self._p_pos = 0
        ok = self._p_acc == want
        self.sink.frame_received(kind, header, dest, ok)
