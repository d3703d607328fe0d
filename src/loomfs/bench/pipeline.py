"""Pipelining measurements (issue 16 item 3): does the blocking API scale with threads, and
what does a create cost the metadata store?

    python -m loomfs.bench.pipeline [--synchronous FULL] [--seconds 2] [--json out.json]

Starts a local cluster in a temporary directory, then, through one blocking client:

* ``stat_<k>t``: ``fs.stat`` of a few existing files from ``k`` threads for ``seconds``;
* ``cat_<k>t``: ``fs.cat`` of the same (one-byte) files;
* ``pipe_<k>t``: ``fs.pipe`` of ``size_bytes`` new files from ``k`` threads;
* per create: the meta process's committed write transactions (its ``/metrics``) and its
  fsync/fdatasync calls (``perf stat`` on the meta process, when perf can trace syscalls);
* ``*_cpu_us``: CPU microseconds per operation of the meta process and of this (client) one.

Rates are operations per second; ``ratio`` is the rate over the one-thread rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

SYNC_EVENTS = "syscalls:sys_enter_fsync,syscalls:sys_enter_fdatasync"


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rate(threads: int, seconds: float, op: Callable[[int, int], object],
          cpu: dict[str, int] | None = None) -> tuple[float, dict[str, float]]:
    """Run ``op(thread, i)`` in a loop from ``threads`` threads for ``seconds``; ops/s, and
    the CPU microseconds per op of each process in ``cpu`` (name -> pid)."""
    cpu = cpu or {}
    counts = [0] * threads
    stop = threading.Event()
    start = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        start.wait()
        i = 0
        try:
            while not stop.is_set():
                op(k, i)
                i += 1
        except BaseException as exc:  # reported below: a bench must not hide failures
            errors.append(exc)
        counts[k] = i

    ts = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(threads)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    c0 = {name: _cpu_s(pid) for name, pid in cpu.items()}
    time.sleep(seconds)
    stop.set()
    c1 = {name: _cpu_s(pid) for name, pid in cpu.items()}
    for t in ts:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    ops = max(1, sum(counts))
    return ops / elapsed, {name: (c1[name] - c0[name]) * 1e6 / ops for name in cpu}


class _SyncCounter:
    """``perf stat`` of fsync/fdatasync calls of one process (None when perf cannot)."""

    def __init__(self, pid: int, enabled: bool = True):
        self.pid = pid
        self.enabled = enabled
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> _SyncCounter:
        if self.enabled and shutil.which("perf"):
            self.proc = subprocess.Popen(
                ["perf", "stat", "-x", ",", "-e", SYNC_EVENTS, "-p", str(self.pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )
            time.sleep(0.5)  # attached
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def count(self) -> int | None:
        if self.proc is None:
            return None
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=10)
        total, seen = 0, False
        for line in err.splitlines():
            parts = line.split(",")
            if len(parts) > 2 and parts[2].startswith("syscalls:") and parts[0].strip().isdigit():
                total += int(parts[0])
                seen = True
        return total if seen else None


def _meta_commits(cluster: Any) -> float | None:
    from loomfs.metrics import http_get, parse_metrics
    from loomfs.wire.types import NodeKind

    try:
        r = cluster.routing()
        node = next(n for n in r.nodes if n.kind == NodeKind.META and n.metrics_port)
        body = asyncio.run(http_get(node.host, node.metrics_port))
    except Exception:  # no metrics: the figure is left out
        return None
    return parse_metrics(body.decode()).total("loomfs_meta_store_commits_total")


def run(args: argparse.Namespace) -> dict[str, Any]:
    import loomfs
    from loomfs.testing.cluster import LocalCluster

    out: dict[str, Any] = {"synchronous": args.synchronous, "seconds": args.seconds,
                           "size_bytes": args.size_bytes, "cpus": os.cpu_count()}
    root = tempfile.mkdtemp(prefix="loomfs-pipeline-")
    env = {"LOOMFS_META_SQLITE_SYNCHRONOUS": args.synchronous}
    cluster = LocalCluster(root, storage_nodes=args.storage_nodes, replicas=args.replicas,
                           targets_per_node=1, extra_env=env)
    cluster.start()
    try:
        fs = loomfs.connect(root)
        try:
            fs.mkdir("/s")
            stat_paths = [f"/s/f{i}" for i in range(16)]
            for p in stat_paths:
                fs.pipe(p, b"x")
            meta_pid = cluster.services["meta1"].pid
            procs = {"meta": meta_pid, "client": os.getpid()}
            for k in args.stat_threads:
                rate, us = _rate(k, args.seconds, lambda t, i: fs.stat(stat_paths[(t + i) % 16]), procs)
                out[f"stat_{k}t"] = round(rate)
                out[f"stat_{k}t_cpu_us"] = {n: round(v) for n, v in us.items()}
            for k in args.cat_threads:
                rate, us = _rate(k, args.seconds, lambda t, i: fs.cat(stat_paths[(t + i) % 16]), procs)
                out[f"cat_{k}t"] = round(rate)
                out[f"cat_{k}t_cpu_us"] = {n: round(v) for n, v in us.items()}
            data = os.urandom(args.size_bytes)
            for k in args.pipe_threads:
                for t in range(k):
                    fs.makedirs(f"/p{k}/t{t}", exist_ok=True)
                before = _meta_commits(cluster)
                done = [0] * k

                def create(t: int, i: int, k: int = k, done: list[int] = done) -> None:
                    fs.pipe(f"/p{k}/t{t}/f{i}", data)
                    done[t] += 1

                with _SyncCounter(meta_pid, args.perf) as syncs:
                    rate, us = _rate(k, args.seconds, create, procs)
                    n_syncs = syncs.count()
                after = _meta_commits(cluster)
                creates = sum(done)
                out[f"pipe_{k}t"] = round(rate)
                out[f"pipe_{k}t_cpu_us"] = {n: round(v) for n, v in us.items()}
                if before is not None and after is not None:
                    out[f"pipe_{k}t_txns_per_create"] = round((after - before) / creates, 3)
                if n_syncs is not None:
                    out[f"pipe_{k}t_fsyncs_per_create"] = round(n_syncs / creates, 3)
        finally:
            fs.close()
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    base = out.get(f"stat_{args.stat_threads[0]}t")
    for k in args.stat_threads[1:]:
        if base:
            out[f"stat_{k}t_ratio"] = round(out[f"stat_{k}t"] / base, 2)
    base = out.get(f"cat_{args.cat_threads[0]}t")
    for k in args.cat_threads[1:]:
        if base:
            out[f"cat_{k}t_ratio"] = round(out[f"cat_{k}t"] / base, 2)
    base = out.get(f"pipe_{args.pipe_threads[0]}t")
    for k in args.pipe_threads[1:]:
        if base:
            out[f"pipe_{k}t_ratio"] = round(out[f"pipe_{k}t"] / base, 2)
    return out


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--synchronous", default="FULL", choices=["OFF", "NORMAL", "FULL"])
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--stat-threads", type=_ints, default=[1, 2, 4, 8])
    p.add_argument("--cat-threads", type=_ints, default=[1, 4])
    p.add_argument("--pipe-threads", type=_ints, default=[1, 4, 16])
    p.add_argument("--size-bytes", type=int, default=4096)
    p.add_argument("--storage-nodes", type=int, default=2)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--no-perf", dest="perf", action="store_false", help="do not count fsyncs")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    out = run(args)
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
