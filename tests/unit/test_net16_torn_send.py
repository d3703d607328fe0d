"""A large frame's send cancelled after its header went out (the caller timed out while the
payload waited for the socket) left a torn frame on the connection: the next frame's bytes
were read by the peer as the rest of this payload (then failed its CRC, or were taken for
it). The connection is aborted now (session 16). No sockets: a fake transport and raw dup."""

from __future__ import annotations

import asyncio
from typing import Any

from test_fuzz_frame import Tr

from loomfs.net import protocol_send
from loomfs.net.protocol import FrameProtocol


class Raw:
    """Stands in for the socket's dup: the kernel takes nothing (a full socket buffer)."""

    def fileno(self) -> int:
        return -1

    def send(self, view: Any) -> int:
        raise BlockingIOError


class WriteTr(Tr):
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))

    def get_write_buffer_size(self) -> int:
        return 0


def _proto() -> tuple[FrameProtocol, WriteTr]:
    proto = FrameProtocol(lambda ch: None)  # type: ignore[arg-type,return-value]
    tr = WriteTr()
    proto.connection_made(tr)  # type: ignore[arg-type]
    proto._raw = Raw()  # type: ignore[assignment]  # noqa: SLF001
    return proto, tr


def test_a_large_send_cancelled_after_its_header_aborts_the_connection(monkeypatch: Any) -> None:
    async def main() -> None:
        proto, tr = _proto()
        blocked = asyncio.Event()

        async def never_writable(self: Any, loop: Any, fd: int) -> None:
            blocked.set()
            await asyncio.Event().wait()

        monkeypatch.setattr(FrameProtocol, "_writable", never_writable)
        send = asyncio.ensure_future(proto.send(b"H" * 40, bytearray(protocol_send.LARGE_PAYLOAD_BYTES)))
        await asyncio.wait_for(blocked.wait(), 5)
        assert tr.written == [b"H" * 40]  # the header went; the payload waits
        send.cancel()
        await asyncio.gather(send, return_exceptions=True)
        assert tr.aborted and proto.closed

    asyncio.run(main())


def test_a_small_send_cancelled_while_draining_keeps_the_connection() -> None:
    async def main() -> None:
        proto, tr = _proto()
        proto._write_paused = True  # noqa: SLF001  (the transport's buffer is not empty)
        tr.get_write_buffer_size = lambda: 1  # type: ignore[method-assign]
        send = asyncio.ensure_future(proto.send(b"H" * 40, b"small"))
        for _ in range(5):
            await asyncio.sleep(0)
        assert tr.written == [b"H" * 40, b"small"]  # whole in the transport's buffer
        send.cancel()
        await asyncio.gather(send, return_exceptions=True)
        assert not tr.aborted and not proto.closed

    asyncio.run(main())
