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


def disk_write_read_bytes_per_s(
    directory: str, size_bytes: int = 512 << 20, threads: int = 2
) -> tuple[float, float]:
    """The local disk as the storage engine uses it: 4 MiB chunk files written with O_DIRECT
    (buffered where O_DIRECT is refused) and read back with O_DIRECT by ``threads`` threads."""
    import mmap
    from concurrent.futures import ThreadPoolExecutor

    direct = getattr(os, "O_DIRECT", 0)
    buf = mmap.mmap(-1, BLOCK_BYTES)
    buf.write(os.urandom(BLOCK_BYTES))
    root = tempfile.mkdtemp(dir=directory, prefix="limits-")
    paths = [os.path.join(root, f"c{i}") for i in range(max(1, size_bytes // BLOCK_BYTES))]

    def write(path: str) -> None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | direct, 0o644)
        except OSError:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.pwrite(fd, buf, 0)
        finally:
            os.close(fd)

    def read(part: list[str]) -> int:
        rb = mmap.mmap(-1, BLOCK_BYTES)
        n = 0
        for path in part:
            try:
                fd = os.open(path, os.O_RDONLY | direct)
            except OSError:
                fd = os.open(path, os.O_RDONLY)
            try:
                n += os.preadv(fd, [rb], 0)
            finally:
                os.close(fd)
        return n

    try:
        t0 = time.perf_counter()
        for p in paths:
            write(p)
        w = len(paths) * BLOCK_BYTES / (time.perf_counter() - t0)
        parts = [paths[i::threads] for i in range(threads)]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as ex:
            got = sum(ex.map(read, parts))
        r = got / (time.perf_counter() - t0)
    finally:
        for p in paths:
            try:
                os.unlink(p)
            except OSError:
                pass
        os.rmdir(root)
    return w, r
