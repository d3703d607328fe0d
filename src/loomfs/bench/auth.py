"""What authentication costs: 64-byte RPC round trips and connection set-up, auth off / token /
token + TLS, each against the raw loopback limits measured in the same run.

    python -m loomfs.bench.auth [--count N] [--rounds R]

Limits: pinned 64-byte socket round trips (``bench.limits``) and raw TCP connects (connect,
one 64-byte exchange, close). The RPC server runs in a child process; client and server are
pinned to one CPU, as the round-trip limit is (cross-CPU wake-ups on a VM swing by 3x).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from loomfs.bench import limits

MODES = ("off", "token", "tls+token")


def _pin() -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})


def _auth(mode: str, side: str, secret: bytes, certs: Any) -> Any:
    from loomfs.net.auth import AuthConfig, tls_contexts
    from loomfs.net.credentials import create_token

    if mode == "off":
        return None
    tls_server = tls_client = None
    if mode == "tls+token":
        tls_server, tls_client = tls_contexts(certs.cert_file, certs.key_file, certs.ca_file)
    if side == "server":
        return AuthConfig(secret=secret, tls_server=tls_server, tls_client=tls_client)
    token = create_token(secret, uid=1000, gid=1000, ttl_s=3600, now_s=time.time())
    return AuthConfig(credential=token, tls_client=tls_client)


def _serve(mode: str, secret: bytes, certs: Any, q: Any) -> None:
    _pin()
    from loomfs.net.rpc import Reply, RpcServer
    from loomfs.net.tcp import TcpTransport
    from loomfs.net.transport import Address
    from loomfs.wire.message import Empty
    from loomfs.wire.storage import STORAGE_PING

    async def main() -> None:
        s = RpcServer("bench", TcpTransport(auth=_auth(mode, "server", secret, certs)))

        async def echo(req: Empty, ctx: Any) -> Reply:
            return Reply(Empty(), bytes(ctx.payload))

        s.register(STORAGE_PING, echo)
        addr = await s.start(Address("127.0.0.1", 0))
        q.put(addr.port)
        await asyncio.Event().wait()

    asyncio.run(main())


async def _client_rates(mode: str, port: int, secret: bytes, certs: Any, count: int) -> tuple[float, float]:
    from loomfs.net.rpc import RpcClient
    from loomfs.net.tcp import TcpTransport
    from loomfs.net.transport import Address
    from loomfs.wire.message import Empty
    from loomfs.wire.storage import STORAGE_PING

    auth = _auth(mode, "client", secret, certs)
    addr, body, pl = Address("127.0.0.1", port), Empty(), b"x" * 64
    c = RpcClient(TcpTransport(auth=auth))
    for _ in range(200):
        await c.call(addr, STORAGE_PING, body, payload=pl)
    t = time.perf_counter()
    for _ in range(count):
        await c.call(addr, STORAGE_PING, body, payload=pl)
    rtt = count / (time.perf_counter() - t)
    await c.close()
    conns = max(50, count // 20)
    t = time.perf_counter()
    for _ in range(conns):  # a new client each time: connect, handshake, one call, close
        c = RpcClient(TcpTransport(auth=auth))
        await c.call(addr, STORAGE_PING, body, payload=pl)
        await c.close()
    return rtt, conns / (time.perf_counter() - t)


def raw_connects_per_s(count: int) -> float:
    """TCP connect + one 64-byte exchange + close, against an echo thread, pinned."""
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(128)
    port = srv.getsockname()[1]

    def echo() -> None:
        for _ in range(count):
            conn, _ = srv.accept()
            conn.sendall(conn.recv(64))
            conn.close()

    th = threading.Thread(target=echo, daemon=True)
    th.start()
    msg = b"x" * 64
    t = time.perf_counter()
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(msg)
        s.recv(64)
        s.close()
    rate = count / (time.perf_counter() - t)
    th.join(5)
    srv.close()
    return rate


def run(count: int = 5000, rounds: int = 3) -> list[dict[str, Any]]:
    from loomfs.testing.certs import make_cert_set, openssl_available

    _pin()
    secret = os.urandom(32)
    tmp = tempfile.mkdtemp(prefix="loomfs-bench-auth-")
    certs = make_cert_set(Path(tmp, "certs")) if openssl_available() else None
    modes = [m for m in MODES if certs is not None or "tls" not in m]
    ctx = mp.get_context("spawn")
    rows: list[dict[str, Any]] = []
    for rnd in range(rounds):
        rtt_limit = limits.loopback_round_trips_pinned_per_s(count, message_bytes=64, cpus_max=1)
        conn_limit = raw_connects_per_s(max(50, count // 20))
        for mode in modes:
            q: Any = ctx.Queue()
            p = ctx.Process(target=_serve, args=(mode, secret, certs, q), daemon=True)
            p.start()
            try:
                port = q.get(timeout=60)
                rtt, conns = asyncio.run(_client_rates(mode, port, secret, certs, count))
            finally:
                p.kill()
                p.join(5)
            rows.append({"round": rnd, "mode": mode, "rpc_64B_round_trips_per_s": rtt,
                         "rtt_ratio": rtt / rtt_limit, "raw_round_trips_per_s": rtt_limit,
                         "connects_per_s": conns, "connect_ratio": conns / conn_limit,
                         "raw_connects_per_s": conn_limit})
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m loomfs.bench.auth", description=__doc__)
    p.add_argument("--count", type=int, default=5000, help="round trips per measurement")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    for r in run(args.count, args.rounds):
        print(f"round {r['round']} {r['mode']:>9}: rpc 64 B {r['rpc_64B_round_trips_per_s']:8,.0f}/s = "
              f"{r['rtt_ratio']:.3f} of raw {r['raw_round_trips_per_s']:,.0f}/s; connection set-up "
              f"{r['connects_per_s']:7,.0f}/s = {r['connect_ratio']:.3f} of raw {r['raw_connects_per_s']:,.0f}/s")


if __name__ == "__main__":
    main()
