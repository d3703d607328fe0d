"""Per-tenant in-flight limits over real TCP (issue 13 item 3): an authenticating RPC server in
its own process, process budget 4 MiB, tenant budget 1.5 MiB. Tenant a floods it with eight
700 KiB requests (each held 0.3 s) on eight connections; at most two of a's run at a time, and
tenant b's requests sent meanwhile are read and answered at once instead of queueing behind a's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loomfs.net.credentials import create_token, write_secret_file, write_token_file
from loomfs.testing.rawauth import authenticate_socket
from loomfs.wire import frame as fr
from loomfs.wire.status import Status

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SERVER = r"""
import asyncio, json, sys
from loomfs.net.auth import AuthConfig
from loomfs.net.credentials import load_secret_file
from loomfs.net.rpc import Reply, RpcServer
from loomfs.net.tcp import TcpTransport
from loomfs.net.transport import Address
from loomfs.wire.message import Empty, Method

HOLD = Method(999, 2, "hold", Empty, Empty)  # keeps its payload in flight for 0.3 s
PEAK = Method(999, 3, "peak", Empty, Empty)  # most requests of each tenant seen running at once

async def main() -> None:
    server = RpcServer("tenants", TcpTransport(auth=AuthConfig(secret=load_secret_file(sys.argv[1]))))
    running, peak = {}, {}
    async def hold(req, ctx):
        t = ctx.identity.tenant
        running[t] = running.get(t, 0) + 1
        peak[t] = max(peak.get(t, 0), running[t])
        await asyncio.sleep(0.3)
        running[t] -= 1
        return Empty()
    async def report(req, ctx):
        return Reply(Empty(), json.dumps({"peak": peak, "budget_peak": server.budget.peak_bytes}).encode())
    server.register(HOLD, hold)
    server.register(PEAK, report)
    addr = await server.start(Address("127.0.0.1", 0))
    print(addr.port, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""

PROCESS_BUDGET_BYTES = 4 << 20
TENANT_BUDGET_BYTES = 1536 << 10  # two 700 KiB requests fit, three do not
PAYLOAD = b"p" * (700 << 10)


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    secret = os.urandom(32)
    write_secret_file(tmp_path / "secret", secret)
    for tenant in ("a", "b"):
        write_token_file(tmp_path / f"{tenant}.token",
                         create_token(secret, uid=1000, gid=1000, tenant=tenant, ttl_s=600, now_s=time.time()))
    env = {**os.environ, "LOOMFS_INFLIGHT_BUDGET_BYTES": str(PROCESS_BUDGET_BYTES),
           "LOOMFS_TENANT_INFLIGHT_BUDGET_BYTES": str(TENANT_BUDGET_BYTES)}
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(tmp_path / "secret")], stdout=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline()), tmp_path
    finally:
        proc.kill()
        proc.wait(10)


def _connect(port: int, token: Path) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    authenticate_socket(s, token)
    return s


def _reply(sock: socket.socket) -> tuple[int, int, bytes]:
    buf = b""
    while True:
        if len(buf) >= fr.PREFIX_SIZE:
            p = fr.parse_prefix(buf, fr.DEFAULT_MAX_PAYLOAD_BYTES)
            end = fr.PREFIX_SIZE + p.header_len + p.payload_len
            if len(buf) >= end:
                _, header, payload = fr.decode_frame(buf[:end])
                return header.request_id, header.status, bytes(payload)
        chunk = sock.recv(1 << 20)
        assert chunk, "closed before a reply"
        buf += chunk


def _hold(rid: int) -> bytes:
    return fr.encode(fr.KIND_REQUEST, fr.Header(999, 2, rid, 0, 0, "", {}), PAYLOAD) + PAYLOAD


def test_one_tenant_cannot_hold_the_process_budget(server: tuple[int, Path]) -> None:
    port, d = server
    flood = [_connect(port, d / "a.token") for _ in range(8)]
    others = [_connect(port, d / "b.token") for _ in range(2)]
    started = time.monotonic()
    for i, s in enumerate(flood):
        s.sendall(_hold(10 + i))  # the kernel buffers what the server does not read yet
    b_sent = time.monotonic()
    for i, s in enumerate(others):
        s.sendall(_hold(20 + i))
    for i, s in enumerate(others):
        assert _reply(s)[:2] == (20 + i, Status.OK)
    b_done = time.monotonic() - b_sent
    for i, s in enumerate(flood):
        assert _reply(s)[:2] == (10 + i, Status.OK)
    a_done = time.monotonic() - started
    peek = _connect(port, d / "b.token")
    peek.sendall(fr.encode(fr.KIND_REQUEST, fr.Header(999, 3, 1, 0, 0, "", {})))
    report = json.loads(_reply(peek)[2])
    print(f"tenant a: 8 held requests in {a_done:.2f}s, peak {report['peak']['a']} at once; "
          f"tenant b: 2 in {b_done:.2f}s; process budget peak {report['budget_peak']} of {PROCESS_BUDGET_BYTES}")
    assert report["peak"]["a"] <= 2  # a's budget holds two of its 700 KiB requests
    assert report["peak"]["b"] == 2  # b's both ran together, beside a's
    assert a_done >= 0.3 * 4  # a: at most two at a time, so at least four rounds of 0.3 s
    assert b_done < a_done  # b did not wait behind a's whole backlog
    assert 0 < report["budget_peak"] <= PROCESS_BUDGET_BYTES
    for s in [*flood, *others, peek]:
        s.close()
