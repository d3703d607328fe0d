"""``loomfs bench``: throughput and metadata rates next to this machine's raw limits."""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from loomfs.bench import limits
from loomfs.bench.workloads import (
    Result,
    creates_and_stats,
    pipelined_stats,
    random_reads,
    seq_read,
    seq_write,
)
from loomfs.cli.common import connect, human_bytes, parse_size


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark a cluster against raw TCP / disk / memcpy limits")
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    p.add_argument("--size", type=parse_size, default=1 << 30, help="big-file size (default 1G)")
    p.add_argument("--files", type=int, default=5000, help="files for the create/stat phase")
    p.add_argument("--rounds", type=int, default=1, help="repeat and report medians")
    p.add_argument("--json", dest="json_path", default=None, help="write results as JSON here")
    p.add_argument("--start", action="store_true",
                   help="start a throwaway local cluster (3 storage nodes) instead of using --dir")
    p.set_defaults(func=cmd_bench)


def _one_round(args: argparse.Namespace, fs: Any, lim: dict[str, float], rnd: int) -> list[Result]:
    tcp = lim["loopback_tcp_Bps"]
    size = args.size
    files = args.files
    if args.quick:
        size, files = min(size, 64 << 20), min(files, 300)
    base = f"/.bench/r{rnd}"
    if fs.exists(base):
        fs.rmtree(base)
    fs.makedirs(base, exist_ok=True)
    out: list[Result] = []
    w, _ = seq_write(fs, f"{base}/big", size)
    replicas = fs.get_layout(f"{base}/big")
    reps = _replicas(args, fs, replicas)
    out.append(Result("seq_write", w, "B/s", f"raw TCP / {reps} replicas", tcp / reps,
                      {"disk_bound_Bps": lim["disk_write_Bps"] / reps}))  # all replicas share one disk
    r = seq_read(fs, f"{base}/big")
    out.append(Result("seq_read", r, "B/s", "raw TCP", tcp, {"disk_bound_Bps": lim["disk_read_Bps"]}))
    rr = random_reads(fs, f"{base}/big", size, 4096, 300 if args.quick else 3000)
    out.append(Result("rand_read_4k", rr["iops"], "IOPS", extra=rr))
    c, s = creates_and_stats(fs, f"{base}/md", files)
    out.append(Result("create", c, "ops/s", "JuiceFS+Redis mdtest", 1410))
    out.append(Result("stat", s, "ops/s", "JuiceFS+Redis mdtest", 5023))
    ps = pipelined_stats(fs, f"{base}/md", files)
    out.append(Result("stat_pipelined_64", ps, "ops/s", "JuiceFS+Redis mdtest", 5023))
    fs.rmtree(base)
    return out


def _replicas(args: argparse.Namespace, fs: Any, layout: Any) -> int:
    from loomfs.cli.admin import fetch_routing

    r = fetch_routing(args)
    for t in r.tables:
        if t.table_id == layout.table_id:
            return int(t.replicas)
    return 3


def cmd_bench(args: argparse.Namespace) -> int:
    if args.start:
        from loomfs.testing.cluster import LocalCluster

        tmp = tempfile.mkdtemp(prefix="loomfs-bench-")
        cluster = LocalCluster(tmp)
        cluster.start()
        args.cluster_dir = tmp
    else:
        cluster = None
    try:
        return _bench(args)
    finally:
        if cluster is not None:
            cluster.stop()


def _bench(args: argparse.Namespace) -> int:
    tcp_total = (256 << 20) if args.quick else (2 << 30)
    print("measuring raw limits ...")
    tcp = limits.loopback_tcp_bytes_per_s(tcp_total)
    mem = limits.memcpy_bytes_per_s()
    disk_dir = args.cluster_dir if args.cluster_dir and Path(args.cluster_dir).is_dir() else tempfile.gettempdir()
    dw, dr = limits.disk_write_read_bytes_per_s(disk_dir, (128 << 20) if args.quick else (512 << 20))
    lim = {"loopback_tcp_Bps": tcp, "memcpy_Bps": mem, "disk_write_Bps": dw, "disk_read_Bps": dr}
    print(f"  raw loopback TCP (one stream, 2 processes): {human_bytes(tcp)}/s")
    print(f"  local disk, 4 MiB O_DIRECT files: write {human_bytes(dw)}/s, read {human_bytes(dr)}/s")
    print(f"  memcpy: {human_bytes(mem)}/s")
    rounds: list[list[Result]] = []
    with connect(args) as fs:
        for i in range(args.rounds):
            print(f"round {i + 1}/{args.rounds} ...")
            rounds.append(_one_round(args, fs, lim, i))
    merged: list[Result] = []
    for j, first in enumerate(rounds[0]):
        vals = [r[j].value for r in rounds]
        merged.append(Result(first.name, statistics.median(vals), first.unit, first.limit_name,
                             first.limit_value, {"values": vals, **first.extra}))
    print(f"\n{'workload':<20} {'median':>14} {'limit':>30} {'ratio':>7} {'vs disk':>8}")
    for r in merged:
        v = f"{human_bytes(r.value)}/s" if r.unit == "B/s" else f"{r.value:,.0f} {r.unit}"
        lim_text = ""
        if r.limit_value:
            lv = f"{human_bytes(r.limit_value)}/s" if r.unit == "B/s" else f"{r.limit_value:,.0f}"
            lim_text = f"{r.limit_name} {lv}"
        ratio = f"{r.ratio:.2f}" if r.ratio is not None else "-"
        disk = r.extra.get("disk_bound_Bps")
        vs_disk = f"{r.value / disk:.2f}" if disk else ""
        print(f"{r.name:<20} {v:>14} {lim_text:>30} {ratio:>7} {vs_disk:>8}")
        if r.name == "rand_read_4k":
            print(f"{'':<20} p50 {r.extra['p50_ms']:.2f} ms, p99 {r.extra['p99_ms']:.2f} ms")
    if args.json_path:
        doc = {
            "limits": lim,
            "results": [{"name": r.name, "value": r.value, "unit": r.unit, "limit_name": r.limit_name,
                         "limit_value": r.limit_value, "ratio": r.ratio, "extra": r.extra} for r in merged],
        }
        Path(args.json_path).write_text(json.dumps(doc, indent=2))
        print(f"results written to {args.json_path}")
    return 0
