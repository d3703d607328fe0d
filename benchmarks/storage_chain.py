"""3-replica chain over loopback, one OS process per storage node, vs raw TCP.

    python benchmarks/storage_chain.py [--mib 512] [--inflight 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import crc32c

from loomfs.net.rpc import RpcClient, RpcServer
from loomfs.net.tcp import TcpTransport
from loomfs.net.transport import Address
from loomfs.storage.engine.file import FileEngine
from loomfs.storage.service import StaticRouting, StorageService
from loomfs.storage.target import StorageTarget
from loomfs.wire.storage import READ, WRITE, ChunkId, ReadReq, WriteReq
from loomfs.wire.types import ChainInfo, NodeInfo, RoutingInfo, TargetInfo

CHUNK = 4 << 20


def routing(ports: list[int]) -> RoutingInfo:
    n = len(ports)
    return RoutingInfo(
        version=1,
        nodes=[NodeInfo(node_id=i + 1, kind=3, host="127.0.0.1", port=p) for i, p in enumerate(ports)],
        targets=[TargetInfo(target_id=(i + 1) * 1000 + 1, node_id=i + 1, chain_id=1) for i in range(n)],
        chains=[ChainInfo(chain_id=1, version=1, targets=[(i + 1) * 1000 + 1 for i in range(n)])],
    )


async def node_main(index: int, ports: list[int], root: str) -> None:
    rt = StaticRouting(routing(ports))
    target = StorageTarget((index + 1) * 1000 + 1, FileEngine(os.path.join(root, f"n{index}")))
    service = StorageService([target], rt, RpcClient(TcpTransport()))
    server = RpcServer(f"s{index}", TcpTransport())
    server.add_service(service)
    await server.start(Address("127.0.0.1", ports[index]))
    print("ready", flush=True)
    await asyncio.Event().wait()


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def raw_tcp_mb_s(total: int) -> float:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def sink() -> None:
        c, _ = srv.accept()
        buf = memoryview(bytearray(CHUNK))
        got = 0
        while got < total:
            n = c.recv_into(buf)
            if not n:
                break
            got += n
        c.sendall(b"k")
        c.close()

    t = threading.Thread(target=sink)
    t.start()
    s = socket.create_connection(("127.0.0.1", port))
    data = bytearray(os.urandom(CHUNK))
    t0 = time.perf_counter()
    for _ in range(total // CHUNK):
        s.sendall(data)
    s.recv(1)
    dt = time.perf_counter() - t0
    s.close()
    t.join()
    srv.close()
    return total / dt / 1e6


async def client_main(ports: list[int], mib: int, inflight: int) -> dict[str, float]:
    rpc = RpcClient(TcpTransport())
    data = bytearray(os.urandom(CHUNK))
    crc = crc32c.crc32c(data)
    count = max(inflight, (mib << 20) // CHUNK)
    head, tail = Address("127.0.0.1", ports[0]), Address("127.0.0.1", ports[-1])
    sem = asyncio.Semaphore(inflight)

    async def write(i: int) -> None:
        async with sem:
            req = WriteReq(chain_id=1, chain_version=1, chunk=ChunkId(inode=1, index=i % 64), length=CHUNK,
                           chunk_size=CHUNK, data_crc=crc)
            await rpc.call(head, WRITE, req, payload=data, payload_crc=crc)

    bufs = [bytearray(CHUNK) for _ in range(inflight)]

    async def read(i: int) -> None:
        async with sem:
            buf = bufs.pop()
            try:
                req = ReadReq(chain_id=1, chain_version=1, chunk=ChunkId(inode=1, index=i % 64), length=CHUNK)
                await rpc.call(Address("127.0.0.1", ports[i % len(ports)]) if i % 2 else tail, READ, req,
                               recv_into=memoryview(buf))
            finally:
                bufs.append(buf)

    await asyncio.gather(*(write(i) for i in range(64)))  # warm-up: files exist
    out = {}
    for name, fn in (("write", write), ("read", read)):
        t0 = time.perf_counter()
        await asyncio.gather(*(fn(i) for i in range(count)))
        out[name] = count * CHUNK / (time.perf_counter() - t0) / 1e6
    await rpc.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--inflight", type=int, default=4)
    ap.add_argument("--node", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--ports", default="", help=argparse.SUPPRESS)
    ap.add_argument("--root", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.node >= 0:
        asyncio.run(node_main(args.node, json.loads(args.ports), args.root))
        return
    ports = free_ports(3)
    root = tempfile.mkdtemp(prefix="loomfs-chain-")
    procs = [
        subprocess.Popen([sys.executable, __file__, "--node", str(i), "--ports", json.dumps(ports), "--root", root],
                         stdout=subprocess.PIPE)
        for i in range(3)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
        raw = raw_tcp_mb_s(args.mib << 20)
        res = asyncio.run(client_main(ports, args.mib, args.inflight))
    finally:
        for p in procs:
            p.terminate()
            p.wait()
    print(f"raw loopback TCP            {raw:8.0f} MB/s")
    print(f"3-replica write (4 MiB)     {res['write']:8.0f} MB/s  = {res['write'] / (raw / 3):.2f} x raw/3 (target >= 0.4)")
    print(f"read (4 MiB, any replica)   {res['read']:8.0f} MB/s  = {res['read'] / raw:.2f} x raw (target >= 0.5)")


if __name__ == "__main__":
    main()
