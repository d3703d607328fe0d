"""The erasure-coding benchmark (issue 11 item 8, ``loomfs bench --only ec``).

It starts its own throwaway cluster of 6 storage nodes (each: 2 targets in a 3-replica
table, 1 in a single-replica table for EC groups), because it kills servers for the
degraded reads; the cluster the bench was pointed at is not touched. In one run:

* ``ec_encode_{k}+{m}``: the codec's raw encode rate (data bytes/s, one core, buffers
  reused, 1 MiB fragments), held against memcpy; target >= 4 GB/s.
* ``rep3_write`` / ``rep3_read``: a file written and read through the 3-replica table, held
  against raw TCP (the write against raw TCP / 3, as the bigfile group does).
* ``ec_write`` / ``ec_read``: the same bytes in an ``ec(4, 2)`` directory, held against the
  replicated figures of this run; targets: write >= 1.5x, read >= 0.8x.
* ``ec_read_degraded_1`` / ``ec_read_degraded_m``: the EC file read by a fresh client after
  killing 1, then m storage servers (each a fragment holder of the file) and mgmtd marking
  them dead (the steady state of a failure; the first lease after a kill costs a fast-failing
  try per stripe more), held against the healthy EC read.
* ``ec_space`` / ``rep3_space``: bytes of chunk files on the servers, % of the file's bytes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loomfs.bench.workloads import Result
from loomfs.ec.codec import make_codec

K, M = 4, 2
CHUNK_BYTES = 1 << 20
BLOCK_BYTES = 16 << 20
TARGETS = {"encode_Bps": 4e9, "write_vs_rep3": 1.5, "read_vs_rep3": 0.8}


def steps() -> int:
    return 5


def encode_rate(k: int, m: int, frag_bytes: int = CHUNK_BYTES, seconds: float = 0.5) -> tuple[float, str]:
    """Data bytes/s the codec encodes on this core with reused buffers; and its name."""
    codec = make_codec(k, m)
    data = [bytearray(os.urandom(frag_bytes)) for _ in range(k)]
    parity = [bytearray(frag_bytes) for _ in range(m)]
    codec.encode(data, parity)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        codec.encode(data, parity)
        n += 1
    return k * frag_bytes * n / (time.perf_counter() - t0), codec.name


def _write(fs: Any, path: str, total: int, block: memoryview) -> float:
    t0 = time.perf_counter()
    with fs.open(path, "wb") as f:
        done = 0
        while done < total:
            n = min(len(block), total - done)
            f.write(block[:n])
            done += n
    return total / (time.perf_counter() - t0)


def _read(fs: Any, path: str, into: memoryview) -> float:
    t0 = time.perf_counter()
    got = 0
    with fs.open(path, "rb") as f:
        while n := f.readinto(into):
            got += n
    return got / (time.perf_counter() - t0)


def _disk_bytes(root: Path, inode: int) -> int:
    return sum(p.stat().st_size for p in root.glob(f"storage*/target*/chunks/{inode & 0xFF:02x}/{inode:x}.*"))


def run_ec(size_bytes: int, lim: dict[str, float], step: Callable[[str], None], tag: str = "") -> list[Result]:
    import loomfs
    from loomfs.cli.layout import ec_layout
    from loomfs.testing.cluster import LocalCluster
    from loomfs.wire.types import Layout, NodeState

    out: list[Result] = []
    step(f"ec: raw encode rate {K}+{M} and 10+4{tag}")
    for k, m in ((K, M), (10, 4)):
        rate, name = encode_rate(k, m)
        out.append(Result(f"ec_encode_{k}+{m}", rate, "B/s", "memcpy", lim.get("memcpy_Bps", 0.0),
                          {"codec": name, "target_Bps": TARGETS["encode_Bps"]}))
    step(f"ec: starting a 6-node cluster{tag}")
    root = tempfile.mkdtemp(prefix="loomfs-bench-ec-")
    c = LocalCluster(root, storage_nodes=6, ec_targets_per_node=1, lease_s=3.0, gc_delay_s=1.0)
    c.start()
    try:
        fs = loomfs.connect(str(c.root))
        fs.makedirs("/rep", exist_ok=True)
        fs.makedirs("/ec", exist_ok=True)
        fs.set_layout("/rep", Layout(chunk_size=CHUNK_BYTES, stripe=16))
        fs.set_layout("/ec", ec_layout(Layout(chunk_size=CHUNK_BYTES), (K, M)))
        block = memoryview(bytearray(os.urandom(BLOCK_BYTES)))
        into = memoryview(bytearray(BLOCK_BYTES))
        step(f"ec: write/read, 3 replicas vs ec {K}+{M}{tag}")
        rw = _write(fs, "/rep/f", size_bytes, block)
        rr = _read(fs, "/rep/f", into)
        ew = _write(fs, "/ec/f", size_bytes, block)
        er = _read(fs, "/ec/f", into)
        tcp = lim.get("loopback_tcp_Bps", 0.0)
        out.append(Result("rep3_write", rw, "B/s", "raw TCP x1 / 3 replicas", tcp / 3))
        out.append(Result("rep3_read", rr, "B/s", "raw TCP x1", tcp))
        out.append(Result("ec_write", ew, "B/s", "rep3_write (same run)", rw,
                          {"target_ratio": TARGETS["write_vs_rep3"], "vs_tcp": ew / tcp if tcp else None}))
        out.append(Result("ec_read", er, "B/s", "rep3_read (same run)", rr,
                          {"target_ratio": TARGETS["read_vs_rep3"], "vs_tcp": er / tcp if tcp else None}))
        rep_used = _disk_bytes(c.root, fs.attr("/rep/f").inode)
        ec_used = _disk_bytes(c.root, fs.attr("/ec/f").inode)
        out.append(Result("rep3_space", 100 * rep_used / size_bytes, "% of data", "", 0.0, {"disk_bytes": rep_used}))
        out.append(Result("ec_space", 100 * ec_used / size_bytes, "% of data", "rep3_space (same run)",
                          100 * rep_used / size_bytes, {"disk_bytes": ec_used}))
        layout = fs.attr("/ec/f").layout
        assert layout is not None
        r = c.routing()
        chains = {ch.chain_id: ch for ch in r.chains}
        node_of = {t.target_id: t.node_id for t in r.targets}
        holders = [node_of[chains[cid].targets[0]] for cid in layout.chains]
        name_of = {s.node_id: s.name for s in c.services.values() if s.kind == "storage"}
        fs.close()
        for failures, label in ((1, "1"), (M, "m")):
            step(f"ec: degraded read, {failures} of {K + M} servers down{tag}")
            for node in holders[:failures]:
                if c.services[name_of[node]].alive():
                    c.kill_service(name_of[node])
            down = set(holders[:failures])  # steady state: mgmtd has marked them dead (one lease)
            c.wait_routing(lambda r, down=down: all(n.state != NodeState.ALIVE for n in r.nodes if n.node_id in down),
                           60, "killed servers marked dead")
            fs = loomfs.connect(str(c.root))
            dr = _read(fs, "/ec/f", into)
            fs.close()
            out.append(Result(f"ec_read_degraded_{label}", dr, "B/s", "ec_read (healthy, same run)", er,
                              {"failures": failures}))
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)
    return out
