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

from loomfs.net.bulkrecv import BulkJob, BulkReceiver
from loomfs.net.protocol_recv import (
    BULK_HEAD_RECV_BYTES,
    INITIAL_RECV_BYTES,
    RECV_POOL,
    FrameReceiver,
)
from loomfs.net.protocol_send import LARGE_PAYLOAD_BYTES, FrameSender
from loomfs.net.scatter import Scatter
from loomfs.wire import frame as fr

__all__ = ["BULK_HEAD_RECV_BYTES", "INITIAL_RECV_BYTES", "KEEPALIVE_IDLE_S", "KEEPALIVE_INTERVAL_S",
           "KEEPALIVE_PROBES", "LARGE_PAYLOAD_BYTES", "RECV_POOL", "FrameProtocol", "FrameSink"]

logger = logging.getLogger(__name__)

KEEPALIVE_IDLE_S = 60  # TCP keepalive: a peer that vanished (half-open) is found in ~90 s
KEEPALIVE_INTERVAL_S = 10
KEEPALIVE_PROBES = 3


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


class FrameProtocol(FrameSender, FrameReceiver, asyncio.BufferedProtocol):
    """One connection: lifecycle and state here, receiving in ``FrameReceiver``
    (``net.protocol_recv``), sending in ``FrameSender`` (``net.protocol_send``)."""

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
