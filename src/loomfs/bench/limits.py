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


def loopback_tcp_bytes_per_s(total_bytes: int = 1 << 30, streams: int = 1) -> float:
    """``streams`` TCP streams from sender processes to this one on 127.0.0.1 (sendall /
    recv_into, one receiving thread per stream); ``total_bytes`` per stream."""
    from concurrent.futures import ThreadPoolExecutor

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(streams)
    port = srv.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_sender, args=(port, total_bytes), daemon=True) for _ in range(streams)]
    for p in procs:
        p.start()
    conns = [srv.accept()[0] for _ in range(streams)]

    def drain(conn: socket.socket) -> tuple[int, float, float]:
        buf = memoryview(bytearray(BLOCK_BYTES))
        got = 0
        t0 = time.perf_counter()
        while n := conn.recv_into(buf):
            got += n
        return got, t0, time.perf_counter()

    with ThreadPoolExecutor(streams) as ex:
        parts = list(ex.map(drain, conns))
    for c in conns:
        c.close()
    srv.close()
    for p in procs:
        p.join(10)
    span = max(e for _, _, e in parts) - min(s for _, s, _ in parts)
    return sum(g for g, _, _ in parts) / span


def _echo(port: int) -> None:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while msg := s.recv(4096):
        s.sendall(msg)
    s.close()


def loopback_round_trips_per_s(count: int = 20000, pairs: int = 1, message_bytes: int = 128) -> float:
    """Small request/reply round trips between processes (one at a time per pair): the
    ceiling for any one-at-a-time RPC workload (stat, create, 4 KiB reads)."""
    from concurrent.futures import ThreadPoolExecutor

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(pairs)
    port = srv.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_echo, args=(port,), daemon=True) for _ in range(pairs)]
    for p in procs:
        p.start()
    conns = [srv.accept()[0] for _ in range(pairs)]
    msg = os.urandom(message_bytes)

    def ping(conn: socket.socket) -> tuple[float, float]:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray(message_bytes)
        t0 = time.perf_counter()
        for _ in range(count):
            conn.sendall(msg)
            got = 0
            while got < message_bytes:
                got += conn.recv_into(memoryview(buf)[got:])
        return t0, time.perf_counter()

    with ThreadPoolExecutor(pairs) as ex:
        spans = list(ex.map(ping, conns))
    for c in conns:
        c.close()
    srv.close()
    for p in procs:
        p.join(10)
    return count * pairs / (max(e for _, e in spans) - min(s for s, _ in spans))


def disk_fsync_write_read_bytes_per_s(directory: str, size_bytes: int = 256 << 20) -> tuple[float, float]:
    """One file written in 4 MiB blocks then fsync'd (page cache + flush), read back after
    dropping it from the page cache (posix_fadvise DONTNEED)."""
    buf = memoryview(bytearray(os.urandom(BLOCK_BYTES)))
    fd, path = tempfile.mkstemp(dir=directory, prefix="limits-fsync-")
    try:
        blocks = max(1, size_bytes // BLOCK_BYTES)
        t0 = time.perf_counter()
        for _ in range(blocks):
            os.write(fd, buf)
        os.fsync(fd)
        w = blocks * BLOCK_BYTES / (time.perf_counter() - t0)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        rb = bytearray(BLOCK_BYTES)
        os.lseek(fd, 0, os.SEEK_SET)
        got = 0
        t0 = time.perf_counter()
        while n := os.readv(fd, [rb]):
            got += n
        r = got / (time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.unlink(path)
    return w, r


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
