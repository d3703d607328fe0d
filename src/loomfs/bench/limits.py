"""Raw limits of this machine, measured in the same run as the benchmark they qualify."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import tempfile
import time

BLOCK_BYTES = 4 << 20


def _sender(port: int, total_bytes: int) -> None:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = memoryview(bytearray(os.urandom(BLOCK_BYTES)))
    sent = 0
    while sent < total_bytes:
        s.sendall(buf)
        sent += len(buf)
    s.close()


def loopback_tcp_bytes_per_s(total_bytes: int = 1 << 30) -> float:
    """One TCP stream between two Python processes on 127.0.0.1 (sendall / recv_into)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=_sender, args=(port, total_bytes), daemon=True)
    p.start()
    conn, _ = srv.accept()
    buf = memoryview(bytearray(BLOCK_BYTES))
    got = 0
    t0 = time.perf_counter()
    while True:
        n = conn.recv_into(buf)
        if not n:
            break
        got += n
    dt = time.perf_counter() - t0
    conn.close()
    srv.close()
    p.join(10)
    return got / dt


def memcpy_bytes_per_s(size_bytes: int = 64 << 20, rounds: int = 8) -> float:
    a = bytearray(size_bytes)
    b = bytearray(size_bytes)
    b[:] = a  # touch once
    t0 = time.perf_counter()
    for _ in range(rounds):
        b[:] = a
    return size_bytes * rounds / (time.perf_counter() - t0)


def disk_write_read_bytes_per_s(directory: str, size_bytes: int = 256 << 20) -> tuple[float, float]:
    """Sequential write+fsync and read (page cache warm) of one file in ``directory``."""
    buf = memoryview(bytearray(os.urandom(BLOCK_BYTES)))
    fd, path = tempfile.mkstemp(dir=directory, prefix="limits-")
    try:
        t0 = time.perf_counter()
        for _ in range(size_bytes // BLOCK_BYTES):
            os.write(fd, buf)
        os.fsync(fd)
        w = size_bytes / (time.perf_counter() - t0)
        os.lseek(fd, 0, os.SEEK_SET)
        rb = bytearray(BLOCK_BYTES)
        t0 = time.perf_counter()
        while os.readv(fd, [rb]):
            pass
        r = size_bytes / (time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.unlink(path)
    return w, r
