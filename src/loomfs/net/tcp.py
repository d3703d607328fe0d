"""TCP transport: asyncio streams replaced by ``FrameProtocol`` (BufferedProtocol)."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from typing import Any

from loomfs.errors import ConnectionFailed, ConnectRefused, TimedOut
from loomfs.net.auth import AuthConfig, process_auth
from loomfs.net.bulkrecv import DEFAULT_BULK, BulkReceiver
from loomfs.net.protocol import FrameProtocol
from loomfs.net.transport import Address, Channel, Listener, SinkFactory, Transport
from loomfs.wire import frame as fr

SOCKET_BUFFER_BYTES = 4 << 20


def _tune(sock: socket.socket | None) -> None:
    if sock is None:
        return
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)
        except OSError:
            pass


class _TcpListener(Listener):
    def __init__(self, server: asyncio.Server, address: Address):
        self._server = server
        self.address = address

    async def close(self) -> None:
        self._server.close()
        try:
            await asyncio.wait_for(self._server.wait_closed(), 2.0)
        except TimeoutError:
            pass


_PROCESS: Any = object()  # TcpTransport(auth=...) default: the process's (``net.auth.process_auth``)
BULK_ENV = "LOOMFS_BULK_RECV"  # "0": receive every payload on the event loop (A/B measurements)


def _default_bulk() -> BulkReceiver | None:
    return None if os.environ.get(BULK_ENV, "1") == "0" else DEFAULT_BULK


class TcpTransport(Transport):
    def __init__(self, *, max_payload_bytes: int = fr.DEFAULT_MAX_PAYLOAD_BYTES,
                 auth: AuthConfig | None = _PROCESS, bulk: BulkReceiver | None = _PROCESS):
        """``auth``: credentials and TLS of this transport's servers and clients (default: the
        process's, from its config or $LOOMFS_TOKEN_FILE; None: no auth, plain TCP).
        ``bulk``: receive threads for large reply payloads on connections this transport
        makes (``net.bulkrecv``; default: the process's pool unless $LOOMFS_BULK_RECV=0;
        None: on the loop); connections it accepts always receive on the loop."""
        self.max_payload_bytes = max_payload_bytes
        self.auth = process_auth() if auth is _PROCESS else auth
        self.bulk = _default_bulk() if bulk is _PROCESS else bulk

    async def connect(self, address: Address, sink_factory: SinkFactory, *, timeout_s: float) -> Channel:
        loop = asyncio.get_running_loop()
        tls = self.auth.tls_client if self.auth is not None else None
        try:
            async with asyncio.timeout(timeout_s):  # not wait_for: on 3.11 it can lose a cancel
                _, proto = await loop.create_connection(
                    lambda: FrameProtocol(sink_factory, max_payload_bytes=self.max_payload_bytes, bulk=self.bulk),
                    address.host,
                    address.port,
                    ssl=tls,
                    server_hostname=address.host if tls is not None else None,
                )
        except TimeoutError as exc:
            raise TimedOut(f"connect to {address} timed out") from exc
        except ConnectionRefusedError as exc:
            raise ConnectRefused(f"connect to {address}: connection refused") from exc
        except ssl.SSLError as exc:
            raise ConnectionFailed(f"connect to {address}: TLS: {exc.reason or exc}") from exc
        except OSError as exc:
            raise ConnectionFailed(f"connect to {address}: {exc.strerror or exc}") from exc
        _tune(proto.transport.get_extra_info("socket") if proto.transport else None)
        return proto

    async def listen(self, address: Address, sink_factory: SinkFactory) -> Listener:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: FrameProtocol(sink_factory, max_payload_bytes=self.max_payload_bytes),
            address.host,
            address.port,
            ssl=self.auth.tls_server if self.auth is not None else None,
            reuse_address=True,
            backlog=1024,
        )
        sock = server.sockets[0]
        _tune(sock)
        host, port = sock.getsockname()[:2]
        return _TcpListener(server, Address(host, port))


def default_transport(*, max_payload_bytes: int = fr.DEFAULT_MAX_PAYLOAD_BYTES,
                      auth: AuthConfig | None = _PROCESS) -> Transport:
    """The transport services and clients use: TCP with the process's credentials (``auth``
    overrides), wrapped in fault injection when ``$LOOMFS_FAULTS_FILE`` is set (tests only)."""
    from loomfs.net.faults import maybe_faulty

    return maybe_faulty(TcpTransport(max_payload_bytes=max_payload_bytes, auth=auth))
