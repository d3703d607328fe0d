"""The send side of ``FrameProtocol`` (``net.protocol``): one frame at a time, small ones
through the asyncio transport, large payloads with ``socket.send`` on a dup of the socket and
``FileRegion`` payloads with ``os.sendfile`` (``net.sendfile``), and the waits for the
transport's buffer or the socket to drain.

A mixin: its methods run on a ``FrameProtocol``, whose ``__init__`` sets the state they use.
"""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING

from loomfs.net.sendfile import FileRegion, sendfile_some

LARGE_PAYLOAD_BYTES = 128 << 10


def _set_once(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class FrameSender:
    """``FrameProtocol``'s sending methods (and the write pause/resume callbacks)."""

    # set by FrameProtocol.__init__ / connection_made
    transport: asyncio.Transport | None
    _closed: bool
    _raw: socket.socket | None
    _send_lock: asyncio.Lock
    _write_paused: bool
    _drain_waiters: list[asyncio.Future[None]]

    if TYPE_CHECKING:
        def abort(self, exc: BaseException | None = None) -> None: ...

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
            try:
                if self._write_paused:
                    await self._drained()
                if region is not None:
                    await self._raw_sendfile(region)
                elif large:
                    assert payload is not None and not isinstance(payload, FileRegion)
                    await self._raw_send(memoryview(payload).cast("B"))
            except asyncio.CancelledError:
                if large:  # the header went, the payload not all of it: a torn frame nobody
                    # can finish; the next frame's bytes would be read as this payload (then
                    # fail its CRC): the connection goes now, its calls fail and are retried
                    self.abort(ConnectionResetError("a large send was cancelled midway"))
                raise

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
