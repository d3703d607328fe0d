"""A tiny read-only HTTP/1.1 server on the service's own event loop (no thread).

Routes map a path to a function returning ``HttpResponse``; every connection serves one
request and closes. Request heads are bounded; only GET and HEAD are answered. Used for the
dashboard's pages (``/metrics`` is prometheus_client's own server: ``metrics.service``);
``http_get`` is the scraper's client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

logger = logging.getLogger(__name__)

HEAD_BYTES_MAX = 16 << 10
READ_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class HttpResponse:
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    status: int = 200


Route = Callable[[dict[str, list[str]]], "HttpResponse | Awaitable[HttpResponse]"]

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            500: "Internal Server Error"}


class HttpServer:
    def __init__(self, routes: dict[str, Route], *, name: str = "http"):
        self.routes = dict(routes)
        self.name = name
        self._server: asyncio.Server | None = None
        self.requests_total = 0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen; returns the bound port (``port=0`` picks a free one)."""
        self._server = await asyncio.start_server(self._handle, host, port, limit=HEAD_BYTES_MAX)
        bound = int(self._server.sockets[0].getsockname()[1])
        logger.info("%s: http on %s:%d", self.name, host, bound)
        return bound

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            rsp, send_body = await self._respond(head)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            writer.close()
            return
        self.requests_total += 1
        reason = _REASONS.get(rsp.status, "OK")
        out = (f"HTTP/1.1 {rsp.status} {reason}\r\nContent-Type: {rsp.content_type}\r\n"
               f"Content-Length: {len(rsp.body)}\r\nCache-Control: no-store\r\n"
               "Connection: close\r\n\r\n").encode()
        try:
            writer.write(out + rsp.body if send_body else out)
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _respond(self, head: bytes) -> tuple[HttpResponse, bool]:
        try:
            method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
        except ValueError:
            return HttpResponse(b"bad request\n", status=400), True
        if method not in ("GET", "HEAD"):
            return HttpResponse(b"read-only: GET only\n", status=405), True
        parts = urlsplit(target)
        route = self.routes.get(parts.path)
        if route is None:
            return HttpResponse(f"no page {parts.path}\n".encode(), status=404), method == "GET"
        try:
            result = route(parse_qs(parts.query))
            rsp = await result if isinstance(result, Awaitable) else result
        except Exception as exc:
            logger.exception("%s: %s failed", self.name, parts.path)
            rsp = HttpResponse(f"{type(exc).__name__}: {exc}\n".encode(), status=500)
        return rsp, method == "GET"

    def __repr__(self) -> str:
        port = self.port if self._server is not None else None
        return f"HttpServer({self.name} port={port} requests={self.requests_total})"


async def http_get(host: str, port: int, path: str = "/metrics", *, timeout_s: float = 2.0) -> bytes:
    """GET ``path`` from ``host:port``; returns the body (raises OSError on failure or non-200)."""
    async with asyncio.timeout(timeout_s):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            data = await reader.read()
        finally:
            writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    if len(status_line) < 2 or status_line[1] != b"200":
        raise OSError(f"GET http://{host}:{port}{path}: {head[:80]!r}")
    return body
