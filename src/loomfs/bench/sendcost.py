"""What it costs a storage server to send chunk bytes: read + send vs ``os.sendfile``.

``python -m loomfs.bench.sendcost [--gib 1] [--files 16] [--rounds 3]``: 4 MiB chunk files
(in the page cache: a warm chunk) are sent over loopback TCP to a receiver process that does
what a client does with a reply payload (``recv_into`` a reused buffer, CRC32C of each piece).
Modes, interleaved per round:

* ``direct``: ``pread`` with O_DIRECT into a reused aligned buffer, then ``send`` (what storage
  does for a whole-chunk read today: disk -> user buffer -> socket);
* ``buffered``: ``pread`` through the page cache into a reused buffer, then ``send``;
* ``sendfile``: ``os.sendfile`` of the file region (page cache -> socket, no user copy);
* ``sendfile_cold``: the same after dropping the file from the page cache (``posix_fadvise``
  DONTNEED): the kernel reads it from the disk into fresh page-cache pages first.

Prints wall GB/s and CPU-s per GiB of the sender and of the receiver (``getrusage``), medians
of the rounds. A measurement tool (docs/datapath.md), not part of ``loomfs bench``.
"""

from __future__ import annotations

import argparse
import mmap
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time

CHUNK_BYTES = 4 << 20
MODES = ("direct", "buffered", "sendfile", "sendfile_cold")

RECEIVER = r"""
import resource, socket, sys, crc32c
port, total = int(sys.argv[1]), int(sys.argv[2])
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
buf = memoryview(bytearray(4 << 20))
got = acc = 0
r0 = resource.getrusage(resource.RUSAGE_SELF)
while got < total:
    n = s.recv_into(buf, min(len(buf), total - got))
    if not n:
        break
    acc = crc32c.crc32c(buf[:n], acc)
    got += n
r1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
s.sendall(f"{got} {cpu}\n".encode())
s.close()
"""


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def make_files(directory: str, count: int) -> list[str]:
    paths = []
    data = os.urandom(CHUNK_BYTES)
    for i in range(count):
        p = os.path.join(directory, f"chunk{i:03d}")
        with open(p, "wb") as f:
            f.write(data)
        paths.append(p)
    return paths


def send_all(mode: str, paths: list[str], total_bytes: int) -> dict[str, float]:
    """Send ``total_bytes`` from ``paths`` (cycling) in ``mode``; the receiver's figures too."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    port = lsock.getsockname()[1]
    recv = subprocess.Popen([sys.executable, "-c", RECEIVER, str(port), str(total_bytes)],
                            stdout=subprocess.DEVNULL)
    conn, _ = lsock.accept()
    lsock.close()
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    flags = os.O_RDONLY | (os.O_DIRECT if mode == "direct" else 0)
    fds = [os.open(p, flags) for p in paths]
    buf = mmap.mmap(-1, CHUNK_BYTES)  # page-aligned: O_DIRECT takes it
    view = memoryview(buf)
    sent, i = 0, 0
    c0, t0 = _cpu_s(), time.perf_counter()
    try:
        while sent < total_bytes:
            fd = fds[i % len(fds)]
            i += 1
            n = min(CHUNK_BYTES, total_bytes - sent)
            if mode.startswith("sendfile"):
                if mode == "sendfile_cold":
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                off = 0
                while off < n:
                    off += os.sendfile(conn.fileno(), fd, off, n - off)
            else:
                got = os.preadv(fd, [view], 0) if mode == "direct" else os.preadv(fd, [view[:n]], 0)
                conn.sendall(view[: min(n, got)])
            sent += n
        reply = conn.makefile("rb").readline().split()
        wall = time.perf_counter() - t0
        cpu = _cpu_s() - c0
    finally:
        for fd in fds:
            os.close(fd)
        conn.close()
        view.release()
        buf.close()
        recv.wait(30)
    gib = sent / (1 << 30)
    return {"GBps": sent / wall / 1e9, "sender_cpu_s_per_gib": cpu / gib,
            "receiver_cpu_s_per_gib": float(reply[1]) / gib}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=1.0, help="bytes sent per mode and round")
    ap.add_argument("--files", type=int, default=16, help="4 MiB chunk files cycled over (page cache)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the chunk files go (default: a temp dir)")
    args = ap.parse_args(argv)
    total = int(args.gib * (1 << 30))
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="sendcost-") as d:
        paths = make_files(d, args.files)
        res: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
        for r in range(args.rounds):
            order = MODES if r % 2 == 0 else MODES[::-1]
            for m in order:
                res[m].append(send_all(m, paths, total))
    print(f"{'mode':<10} {'GB/s':>6} {'sender CPU-s/GiB':>17} {'receiver CPU-s/GiB':>19}   (medians of {args.rounds})")
    for m in MODES:
        med = {k: statistics.median(x[k] for x in res[m]) for k in res[m][0]}
        print(f"{m:<10} {med['GBps']:>6.2f} {med['sender_cpu_s_per_gib']:>17.3f} {med['receiver_cpu_s_per_gib']:>19.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
