"""CPU and wall time per small-file operation, per process: ``python -m loomfs.bench.opcost``.

The small-file rows of ``loomfs bench`` give files/s, which on a shared 2-core VM swings with
whatever else runs. This tool says where one operation's time goes: for a loop of creates
(``pipe`` of 4 KiB), cold stats and cold reads (``cat``) through the blocking client, it prints
wall microseconds per operation, the client's CPU microseconds per operation (all its threads)
and meta's (``/proc/PID/schedstat``: nanoseconds on a CPU, all threads), plus meta's context
switches per operation. CPU per operation is what a change to a hot path is judged by (it
barely moves with the machine's load); wall time is printed for the record.

``--dir`` measures an existing local cluster (``loomfs local up``); otherwise a throwaway one
(one storage node, one replica) is started and removed. Rounds alternate the phases, and the
median of the rounds is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

PHASES = ("create", "stat", "read")


def proc_cpu_ns(pid: int) -> int:
    """Nanoseconds process ``pid`` has run on a CPU, all threads (``/proc/PID/schedstat``
    is per thread; the sum over ``/proc/PID/task``)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended meanwhile
    return total


def proc_switches(pid: int) -> int:
    """Voluntary + involuntary context switches of ``pid``'s threads."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                        total += int(line.split()[1])
        except (OSError, ValueError):
            pass
    return total


def measure(n: int, fn: Callable[[], None], meta_pid: int) -> dict[str, float]:
    """Run ``fn`` (``n`` operations) and return per-operation costs."""
    c0, m0, s0, t0 = time.process_time_ns(), proc_cpu_ns(meta_pid), proc_switches(meta_pid), time.perf_counter()
    fn()
    t1, c1, m1, s1 = time.perf_counter(), time.process_time_ns(), proc_cpu_ns(meta_pid), proc_switches(meta_pid)
    return {"wall_us": (t1 - t0) * 1e6 / n, "client_cpu_us": (c1 - c0) / 1e3 / n,
            "meta_cpu_us": (m1 - m0) / 1e3 / n, "meta_switches": (s1 - s0) / n}


def one_round(where: str, meta_pid: int, files: int, size_bytes: int, rnd: int) -> dict[str, dict[str, float]]:
    import loomfs

    data = os.urandom(size_bytes)
    base = f"/opcost/r{rnd}"
    paths = [f"{base}/d{i % 10}/f{i:06d}" for i in range(files)]
    order = paths[:]
    random.Random(rnd).shuffle(order)
    out: dict[str, dict[str, float]] = {}
    with loomfs.connect(where) as fs:
        for d in range(10):
            fs.makedirs(f"{base}/d{d}", exist_ok=True)
        fs.stat(base)  # connections up before timing

        def create() -> None:
            for p in paths:
                fs.pipe(p, data)

        out["create"] = measure(files, create, meta_pid)
    for kind in ("stat", "read"):
        with loomfs.connect(where) as cold:
            cold.stat("/")  # the fast path's socket up before timing

            def loop(c: Any = cold, k: str = kind) -> None:
                if k == "stat":
                    for p in order:
                        c.stat(p)
                else:
                    for p in order:
                        c.cat(p)

            out[kind] = measure(files, loop, meta_pid)
    with loomfs.connect(where) as fs:
        fs.rmtree(base)
    return out


@contextlib.contextmanager
def cluster_for(cluster_dir: str | None, prefix: str) -> Iterator[Any]:
    """The running local cluster in ``cluster_dir``, or a throwaway one (1 storage node, 1
    replica) started here and removed afterwards."""
    from loomfs.testing.cluster import LocalCluster

    if cluster_dir:
        yield LocalCluster.from_dir(cluster_dir)
        return
    tmp = tempfile.mkdtemp(prefix=prefix)
    cluster = LocalCluster(tmp, storage_nodes=1, targets_per_node=1, replicas=1)
    cluster.start(timeout_s=60)
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m loomfs.bench.opcost", description=__doc__.split("\n")[0])
    ap.add_argument("--dir", help="a running local cluster's directory (default: start a throwaway one)")
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--size", type=int, default=4096, help="bytes per file")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--label", default="", help="printed in front of each line")
    args = ap.parse_args(argv)
    with cluster_for(args.dir, "loomfs-opcost-") as cluster:
        meta_pid = cluster.services["meta1"].pid
        where = str(cluster.root)
        rounds = [one_round(where, meta_pid, args.files, args.size, r) for r in range(args.rounds)]
        for ph in PHASES:
            walls = ", ".join(f"{r[ph]['wall_us']:.0f}" for r in rounds)
            med = {k: statistics.median(r[ph][k] for r in rounds) for k in rounds[0][ph]}
            print(f"{args.label}{ph:7s} wall {med['wall_us']:7.1f} us/op  client cpu {med['client_cpu_us']:6.1f}"
                  f"  meta cpu {med['meta_cpu_us']:6.1f}  meta switches {med['meta_switches']:.2f}/op"
                  f"   (rounds wall: {walls})")


if __name__ == "__main__":
    main()
