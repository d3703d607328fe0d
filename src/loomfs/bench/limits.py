"""Raw limits of this machine, measured in the same run as the benchmark they qualify."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import tempfile
import time
from typing import Any

BLOCK_BYTES = 4 << 20
PINNED_CPUS_MAX = 4  # CPUs the pinned round-trip limit is tried on (the best one counts)
PINNED_ACCEPT_S = 60.0  # spawning the two pinned processes (a loaded machine is slow)


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


def _pin(cpu: int | None) -> None:
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})


def _pinned_echo(port: int, cpu: int | None) -> None:
    _pin(cpu)
    _echo(port)


def _pinned_pinger(cpu: int | None, count: int, warmup: int, message_bytes: int, out: Any) -> None:
    """Listen, accept the echo process, do ``warmup`` then ``count`` timed round trips and
    send the rate (or the error text) back through ``out``."""
    try:
        _pin(cpu)
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        out.send(srv.getsockname()[1])
        srv.settimeout(PINNED_ACCEPT_S)
        conn = srv.accept()[0]
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        msg = os.urandom(message_bytes)
        buf = bytearray(message_bytes)
        view = memoryview(buf)

        def rounds(n: int) -> None:
            for _ in range(n):
                conn.sendall(msg)
                got = 0
                while got < message_bytes:
                    k = conn.recv_into(view[got:])
                    if not k:
                        raise ConnectionError("echo process closed the connection")
                    got += k

        rounds(warmup)
        t0 = time.perf_counter()
        rounds(count)
        rate = count / (time.perf_counter() - t0)
        conn.close()
        srv.close()
        out.send(rate)
    except BaseException as exc:
        out.send(f"{type(exc).__name__}: {exc}")


def loopback_round_trips_pinned_per_s(count: int = 20000, message_bytes: int = 64,
                                      cpus_max: int = PINNED_CPUS_MAX) -> float:
    """64-byte request/reply round trips, one at a time, between two fresh processes that are
    both pinned to the same CPU: the best of one run on each of up to ``cpus_max`` CPUs this
    process may use (another busy process on one CPU slows the pair sharing it).

    The small-file limit: on a VM, cross-CPU wake-ups make the unpinned figure swing by 3x
    from run to run; on one CPU each round trip is two context switches and it holds steady.
    Unpinned (one run) where ``os.sched_setaffinity`` does not exist."""
    if not hasattr(os, "sched_getaffinity"):
        return pinned_pair_round_trips_per_s(None, count, message_bytes)
    cpus = sorted(os.sched_getaffinity(0))[-max(1, cpus_max):]
    return max(pinned_pair_round_trips_per_s(c, count, message_bytes) for c in cpus)


def pinned_pair_round_trips_per_s(cpu: int | None, count: int = 20000, message_bytes: int = 64) -> float:
    """One pinger and one echo process, both pinned to ``cpu`` (None: not pinned)."""
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe(duplex=False)
    pinger = ctx.Process(target=_pinned_pinger, args=(cpu, count, max(200, count // 10), message_bytes, there),
                         daemon=True)
    pinger.start()
    there.close()  # the child holds its own end
    echo = None

    def answer(wait_s: float, what: str) -> Any:
        if not here.poll(wait_s):
            raise TimeoutError(f"pinned round trips: {what} (no answer in {wait_s:.0f} s)")
        try:
            got = here.recv()
        except EOFError:
            pinger.join(5)
            raise OSError(f"pinned round trips: the pinger exited ({pinger.exitcode}) before {what}") from None
        if isinstance(got, str):
            raise OSError(f"pinned round trips: {got}")
        return got

    try:
        port = answer(PINNED_ACCEPT_S, "listening")
        echo = ctx.Process(target=_pinned_echo, args=(port, cpu), daemon=True)
        echo.start()
        return float(answer(PINNED_ACCEPT_S + count / 1000, "finishing"))
    finally:
        for p in (pinger, echo):
            if p is not None:
                p.join(10)
                if p.is_alive():
                    p.kill()
        here.close()


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
