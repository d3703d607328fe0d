"""Aggregate read throughput with 1, 2, 3 storage hosts (issue 12 item 7, ``--only hosts``).

For each N it starts a cluster of its own in network namespaces (``loomfs.testing.netns``:
mgmtd, meta and N storage hosts, one target each, 1 replica, so a file is striped over N
chains on N hosts) and two client hosts. A file is written from this process; then one
process per client host reads all of it at once (after a barrier, timed from the first
start to the last end): ``hosts_read_{N}storage`` = bytes read by both / that span.

The raw limit is measured in the same run on the same lab: plain TCP from N sender
processes (one on each storage host) to one receiver per client host, every sender to
every receiver (the read's traffic pattern), ``sendall``/``recv_into`` with reused
buffers. ``hosts_read_1storage``'s ratio to loopback TCP (limits.py) is in the extras.
The chunk files are in the page cache (just written): this measures the network and the
services, not the disk. This machine has 2 cores shared by everything: N hosts here do not
add CPUs, so the curve shows the cost of spreading, not the scaling real hosts would get.
Needs root (network namespaces); otherwise the group is refused with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loomfs.bench.workloads import Result

STORAGE_HOSTS = (1, 2, 3)
CLIENT_HOSTS = 2
CHUNK_BYTES = 4 << 20
BLOCK_BYTES = 16 << 20
RAW_PORT = 9100

# raw limit, sender: listen on ADDR, send BYTES to each of COUNT connections, then exit
_SENDER = """
import os, socket, sys, threading
addr, total, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((addr, PORT)); s.listen(count)
print("up", flush=True)
buf = memoryview(bytearray(os.urandom(4 << 20)))
def send(c):
    left = total
    while left > 0:
        n = min(len(buf), left); c.sendall(buf[:n]); left -= n
    c.close()
ts = [threading.Thread(target=send, args=(s.accept()[0],)) for _ in range(count)]
[t.start() for t in ts]; [t.join() for t in ts]
""".replace("PORT", str(RAW_PORT))

# raw limit, receiver: connect to every sender, wait for GO, drain all, print bytes/start/end
_RECEIVER = """
import json, os, socket, sys, threading, time
go, addrs = sys.argv[1], sys.argv[2:]
conns = [socket.create_connection((a, PORT)) for a in addrs]
while not os.path.exists(go): time.sleep(0.005)
got = [0] * len(conns)
def drain(i):
    buf = memoryview(bytearray(4 << 20))
    while n := conns[i].recv_into(buf): got[i] += n
t0 = time.monotonic()
ts = [threading.Thread(target=drain, args=(i,)) for i in range(len(conns))]
[t.start() for t in ts]; [t.join() for t in ts]
print(json.dumps({"bytes": sum(got), "t0": t0, "t1": time.monotonic()}))
""".replace("PORT", str(RAW_PORT))

# LoomFS reader: connect, open the file, wait for GO, read it all into one reused buffer
_READER = """
import json, os, sys, time
import loomfs
root, path, go = sys.argv[1:4]
fs = loomfs.connect(root)
buf = memoryview(bytearray(BLOCK))
f = fs.open(path, "rb")
while not os.path.exists(go): time.sleep(0.005)
t0 = time.monotonic(); got = 0
while n := f.readinto(buf): got += n
t1 = time.monotonic(); f.close(); fs.close()
print(json.dumps({"bytes": got, "t0": t0, "t1": t1}))
""".replace("BLOCK", str(BLOCK_BYTES))


def check_netns() -> str | None:
    """None when the group can run here, else why not."""
    from loomfs.testing.netns import available

    return available() or None


def steps(configs: tuple[int, ...] = STORAGE_HOSTS) -> int:
    return 2 * len(configs)


def _gather(procs: list[subprocess.Popen[bytes]], go: Path, timeout_s: float) -> float:
    """Start the timed phase (the GO file), wait for every program; aggregate bytes/s."""
    time.sleep(0.3)  # let the programs reach their barrier (connect, open): not timed
    go.touch()
    rows = []
    for p in procs:
        out, _ = p.communicate(timeout=timeout_s)
        if p.returncode != 0:
            raise RuntimeError(f"bench program failed ({p.returncode}): {out.decode(errors='replace')[-2000:]}")
        rows.append(json.loads(out.decode().strip().splitlines()[-1]))
    span = max(r["t1"] for r in rows) - min(r["t0"] for r in rows)
    return sum(r["bytes"] for r in rows) / span


def raw_tcp_Bps(lab: Any, senders: list[Any], receivers: list[Any], bytes_per_stream: int, go: Path,
                timeout_s: float = 300.0) -> float:
    """Plain TCP, every sender host to every receiver host at once: aggregate bytes/s."""
    sp = [lab.popen(h, [sys.executable, "-c", _SENDER, h.address, str(bytes_per_stream), str(len(receivers))],
                    stdout=subprocess.PIPE) for h in senders]
    try:
        for p in sp:
            assert p.stdout is not None
            if p.stdout.readline().strip() != b"up":
                raise RuntimeError("raw TCP sender did not start")
        rp = [lab.popen(h, [sys.executable, "-c", _RECEIVER, str(go), *(s.address for s in senders)],
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for h in receivers]
        return _gather(rp, go, timeout_s)
    finally:
        for p in sp:
            p.kill() if p.poll() is None else None
            p.wait()
        go.unlink(missing_ok=True)


def run_hosts(lim: dict[str, float], *, size_bytes: int, step: Callable[[str], None] = lambda s: None,
              configs: tuple[int, ...] = STORAGE_HOSTS) -> list[Result]:
    import loomfs
    from loomfs.testing.netns import NetnsLab
    from loomfs.testing.netns_cluster import NetnsCluster

    size_bytes = max(CHUNK_BYTES, size_bytes // CHUNK_BYTES * CHUNK_BYTES)
    out: list[Result] = []
    root = tempfile.mkdtemp(prefix="loomfs-bench-hosts-")
    per: dict[int, tuple[float, float]] = {}
    try:
        for n in configs:
            step(f"hosts: {n} storage host(s) in network namespaces, cluster up, write")
            with NetnsLab() as lab:
                c = NetnsCluster(f"{root}/s{n}", lab, storage_nodes=n, targets_per_node=1, replicas=1)
                c.start(timeout_s=120)
                try:
                    clients = [c.add_client_host(f"client{i}") for i in range(1, CLIENT_HOSTS + 1)]
                    storage = [c.host(f"storage{i}") for i in range(1, n + 1)]
                    block = memoryview(bytearray(os.urandom(BLOCK_BYTES)))
                    with loomfs.connect(str(c.root)) as fs, fs.open("/hosts.bin", "wb") as f:
                        for off in range(0, size_bytes, BLOCK_BYTES):
                            f.write(block[: min(BLOCK_BYTES, size_bytes - off)])
                    step(f"hosts: {n} storage host(s), raw TCP and LoomFS reads from {CLIENT_HOSTS} client hosts")
                    go = c.root / "go"
                    raw = raw_tcp_Bps(lab, storage, clients, size_bytes // n, go)
                    readers = [lab.popen(h, [sys.executable, "-c", _READER, str(c.root), "/hosts.bin", str(go)],
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=c.client_env())
                               for h in clients]
                    time.sleep(1.0)  # imports and connects before the barrier (not timed)
                    got = _gather(readers, go, 300.0)
                    per[n] = (got, raw)
                finally:
                    c.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = per.get(configs[0], (0.0, 0.0))[0]
    for n, (got, raw) in per.items():
        extra: dict[str, Any] = {"storage_hosts": n, "client_hosts": CLIENT_HOSTS, "file_bytes": size_bytes,
                                 "vs_1storage": got / base if base else None}
        if lim.get("loopback_tcp_2streams_Bps"):
            extra["vs_loopback_tcp_2streams"] = got / lim["loopback_tcp_2streams_Bps"]
        out.append(Result(f"hosts_read_{n}storage", got, "B/s",
                          f"raw TCP {n} host(s) -> {CLIENT_HOSTS} hosts", raw, extra))
    return out


def curve_lines(doc: dict[str, Any]) -> list[str]:
    """The storage-hosts curve as text (empty without the group's rows)."""
    rows = sorted((r for r in doc["results"] if r["name"].startswith("hosts_read_")),
                  key=lambda r: r["extra"]["storage_hosts"])
    if not rows:
        return []
    lines = ["", f"aggregate read vs storage hosts ({CLIENT_HOSTS} client hosts, network namespaces)",
             f"{'storage hosts':>13} {'read MiB/s':>11} {'raw TCP MiB/s':>14} {'ratio':>6} {'vs 1 host':>9}"]
    for r in rows:
        v1 = r["extra"].get("vs_1storage")
        lines.append(f"{r['extra']['storage_hosts']:>13} {r['value'] / 2**20:>11,.0f} "
                     f"{r['limit_value'] / 2**20:>14,.0f} {r['value'] / r['limit_value']:>6.2f} "
                     f"{'' if v1 is None else f'{v1:.2f}':>9}")
    return lines


def plot_curve(doc: dict[str, Any], path: str) -> bool:
    """Draw the curve (LoomFS and raw TCP vs storage hosts) into ``path``; False without rows."""
    rows = sorted((r for r in doc["results"] if r["name"].startswith("hosts_read_")),
                  key=lambda r: r["extra"]["storage_hosts"])
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [r["extra"]["storage_hosts"] for r in rows]
    ax.plot(xs, [r["value"] / 2**20 for r in rows], "o-", label="LoomFS aggregate read")
    ax.plot(xs, [r["limit_value"] / 2**20 for r in rows], "s--", color="gray", label="raw TCP, same pattern")
    ax.set_xticks(xs)
    ax.set_xlabel("storage hosts (network namespaces, 1 target each, 1 replica)")
    ax.set_ylabel("MiB/s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"aggregate read from {CLIENT_HOSTS} client hosts" + (" (--quick)" if doc.get("quick") else ""))
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True
