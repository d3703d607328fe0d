"""Resource limits over real TCP (issue 13 item 3): an RPC server in its own process with short
timeouts; slow-loris and silent connections are closed, connections over the cap are refused
with a status, and the memory of 500 idle connections goes back once they close."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from loomfs.wire import frame as fr
from loomfs.wire.status import Status

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SERVER = r"""
import asyncio, sys
from loomfs.net.limits import ServerLimits
from loomfs.net.rpc import Reply, RpcServer
from loomfs.net.tcp import TcpTransport
from loomfs.net.transport import Address
from loomfs.wire.message import Empty, Method

ECHO = Method(999, 1, "echo", Empty, Empty)
HOLD = Method(999, 2, "hold", Empty, Empty)  # keeps its payload in flight for 0.3 s
PEAK = Method(999, 3, "peak", Empty, Empty)  # the budget's peak, as decimal text

async def main() -> None:
    limits = ServerLimits(connections_max=int(sys.argv[1]), first_frame_timeout_s=1.0, frame_timeout_s=1.0,
                          idle_timeout_s=60.0, buffer_release_s=0.5)
    server = RpcServer("limits", TcpTransport(), limits=limits)
    async def echo(req, ctx):
        return Reply(Empty(), bytes(ctx.payload))
    async def hold(req, ctx):
        await asyncio.sleep(0.3)
        return Empty()
    async def peak(req, ctx):
        return Reply(Empty(), str(server.budget.peak_bytes).encode())
    server.register(ECHO, echo)
    server.register(HOLD, hold)
    server.register(PEAK, peak)
    addr = await server.start(Address("127.0.0.1", 0))
    print(addr.port, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""

BUDGET_BYTES = 2 << 20
REQUEST = fr.encode(fr.KIND_REQUEST, fr.Header(999, 1, 7, 0, 0, "", {}), b"x" * 64) + b"x" * 64


@pytest.fixture()
def server(request: pytest.FixtureRequest) -> Iterator[tuple[int, int]]:
    cap = getattr(request, "param", 1000)
    env = {**os.environ, "LOOMFS_INFLIGHT_BUDGET_BYTES": str(BUDGET_BYTES)}
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(cap)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield proc.pid, port
    finally:
        proc.kill()
        proc.wait(10)


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        while True:
            if not sock.recv(4096):
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _reply(sock: socket.socket) -> tuple[int, int]:
    sock.settimeout(10)
    buf = b""
    while True:
        if len(buf) >= fr.PREFIX_SIZE:
            p = fr.parse_prefix(buf, 1 << 20)
            if len(buf) >= fr.PREFIX_SIZE + p.header_len + p.payload_len:
                h = fr.decode_header(p, buf[fr.PREFIX_SIZE : fr.PREFIX_SIZE + p.header_len])
                return h.request_id, h.status
        chunk = sock.recv(65536)
        assert chunk, "closed before a reply"
        buf += chunk


def test_slow_loris_and_silent_connections_are_closed(server: tuple[int, int]) -> None:
    _, port = server
    silent = socket.create_connection(("127.0.0.1", port))
    loris = socket.create_connection(("127.0.0.1", port))
    loris.sendall(REQUEST[:30])  # prefix and part of the header, then nothing
    started = time.monotonic()
    assert _closed_within(loris, 10) and _closed_within(silent, 10)
    assert 0.9 < time.monotonic() - started < 10  # closed by the 1 s timeouts, not at once
    busy = socket.create_connection(("127.0.0.1", port))
    busy.sendall(REQUEST)  # a well-behaved connection is served as before
    assert _reply(busy) == (7, Status.OK)
    for s in (silent, loris, busy):
        s.close()


@pytest.mark.parametrize("server", [20], indirect=True)
def test_connections_over_the_cap_are_refused_with_a_status(server: tuple[int, int]) -> None:
    _, port = server
    kept = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
    for s in kept:
        s.sendall(REQUEST)
        assert _reply(s) == (7, Status.OK)
    extra = socket.create_connection(("127.0.0.1", port))
    assert _reply(extra) == (0, Status.TOO_MANY_CONNECTIONS)
    assert _closed_within(extra, 5)
    kept.pop().close()  # a slot frees up: a new connection is served
    deadline = time.monotonic() + 10
    while True:
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(REQUEST)
        rid, status = _reply(s)
        if status == Status.OK or time.monotonic() > deadline:
            break
        s.close()
    assert (rid, status) == (7, Status.OK)
    for k in [*kept, s, extra]:
        k.close()


def test_memory_of_idle_and_closed_connections_comes_back(server: tuple[int, int]) -> None:
    pid, port = server
    before = _rss_mib(pid)
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(500)]
    for s in socks:
        s.sendall(REQUEST)
    for s in socks:
        assert _reply(s) == (7, Status.OK)
    idle = _rss_mib(pid)
    for s in socks:
        s.close()
    deadline = time.monotonic() + 20
    while _rss_mib(pid) - before > 16 and time.monotonic() < deadline:
        time.sleep(0.2)
    after = _rss_mib(pid)
    print(f"server RSS: {before:.1f} MiB, 500 idle connections {idle:.1f} MiB, closed {after:.1f} MiB")
    # 500 x 256 KiB receive buffers would be 125 MiB; only touched pages count and they come back
    assert idle - before < 40, (before, idle)
    assert after - before < 16, (before, after)


def _reply_payload(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    buf = b""
    while True:
        if len(buf) >= fr.PREFIX_SIZE:
            p = fr.parse_prefix(buf, 1 << 20)
            if len(buf) >= fr.PREFIX_SIZE + p.header_len + p.payload_len:
                return buf[fr.PREFIX_SIZE + p.header_len : fr.PREFIX_SIZE + p.header_len + p.payload_len]
        chunk = sock.recv(65536)
        assert chunk, "closed before a reply"
        buf += chunk


def test_payloads_in_flight_stay_within_the_process_budget(server: tuple[int, int]) -> None:
    _, port = server
    payload = b"p" * (700 << 10)  # 8 of these are 5.6 MiB; the budget is 2 MiB
    hold = fr.encode(fr.KIND_REQUEST, fr.Header(999, 2, 9, 0, 0, "", {}), payload) + payload
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
    for s in socks:
        s.sendall(hold)  # the kernel buffers what the server does not read yet
    started = time.monotonic()
    for s in socks:
        assert _reply(s) == (9, Status.OK)
    elapsed = time.monotonic() - started
    peek = socket.create_connection(("127.0.0.1", port))
    peek.sendall(fr.encode(fr.KIND_REQUEST, fr.Header(999, 3, 1, 0, 0, "", {})))
    peak = int(_reply_payload(peek))
    print(f"budget peak {peak} bytes of {BUDGET_BYTES}; 8 held requests took {elapsed:.2f}s")
    assert 0 < peak <= BUDGET_BYTES
    assert elapsed >= 0.3 * 3  # at most two at a time (2 x 700 KiB fit, 3 do not): >= 4 rounds of 0.3 s
    for s in [*socks, peek]:
        s.close()
