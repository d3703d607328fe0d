"""The receive side of ``FrameProtocol`` (``net.protocol``): the asyncio ``get_buffer`` /
``buffer_updated`` callbacks, the pooled receive buffer, parsing frames out of it, payloads
received into a sink's buffer or ``Scatter``, large payloads handed to a receive thread
(``net.bulkrecv``), and a payload stalled until its sink has a buffer for it.

A mixin: its methods run on a ``FrameProtocol``, whose ``__init__`` sets the state they use.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import socket
from typing import TYPE_CHECKING

from loomfs.net.buffers import BufferPool
from loomfs.net.bulkrecv import BULK_MIN_BYTES, BulkJob, BulkReceiver
from loomfs.net.scatter import Scatter
from loomfs.wire import frame as fr

if TYPE_CHECKING:
    from loomfs.net.protocol import FrameSink

logger = logging.getLogger("loomfs.net.protocol")  # one logger for the connection, as before the split

INITIAL_RECV_BYTES = 256 << 10
# with a bulk receiver, a read that starts a new frame takes at most this much: the loop copies
# only the head of a large payload (the rest goes to a receive thread), not 256 KiB of it
BULK_HEAD_RECV_BYTES = 64 << 10
RECV_POOL = BufferPool(max_cached_bytes=16 << 20)  # receive buffers of idle/closed connections


class FrameReceiver:
    """``FrameProtocol``'s receiving methods."""

    # set by FrameProtocol.__init__ / connection_made
    max_payload_bytes: int
    sink: FrameSink | None
    transport: asyncio.Transport | None
    peer: str
    _bulk: BulkReceiver | None
    _bulk_job: BulkJob | None
    _buf: mmap.mmap | None
    _mv: memoryview
    _start: int
    _end: int
    _prefix: fr.Prefix | None
    _p_header: fr.Header | None
    _p_kind: int
    _p_dest: memoryview | None
    _p_pos: int
    _p_parts: list[memoryview] | None
    _p_crc: int
    _p_acc: int
    _stalled: tuple[int, fr.Header, int, int] | None
    _reading_paused: bool
    _closed: bool
    _raw: socket.socket | None

    if TYPE_CHECKING:
        def abort(self, exc: BaseException | None = None) -> None: ...

    # ---- receiving (asyncio callbacks) -------------------------------------------------
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
