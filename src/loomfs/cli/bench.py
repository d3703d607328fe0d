"""``loomfs bench``: throughput, latency and metadata rates next to this machine's raw limits."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from loomfs.cli.common import START_HINT, connect, parse_size, target

BENCH_HINT = START_HINT + ", or pass --start (a throwaway local cluster)"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark a cluster against raw TCP / disk / memcpy limits")
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run, ~1 minute)")
    p.add_argument("--size", type=parse_size, default=None, help="big-file size (default 1G)")
    p.add_argument("--procs", type=int, default=None, help="client processes for the N-process big-file run (default 4, --quick 2); mdtest runs 1 and 4")
    p.add_argument("--files", type=int, default=None, help="mdtest files per process (default 2000)")
    p.add_argument("--lookup-sizes", default=None,
                   help="directory sizes for the lookup-cost curve, comma list (default 1000,100000,1000000)")
    p.add_argument("--files-small", type=int, default=None,
                   help="files in the small-file benchmark, 4 KiB each in 100 directories (default 20000, --quick 400)")
    p.add_argument("--only", default=None,
                   help="run only these workload groups, comma list of bigfile, mdtest, small, lookup, "
                        "smallfiles, dataloader, checkpoint, metaservers, ec, kvcache, hosts, auth (default all but "
                        "metaservers, ec, kvcache, hosts and auth; hosts: read throughput with 1-3 storage "
                        "hosts in network namespaces, needs root; auth: RPC and connect cost of "
                        "authentication and TLS; dataloader "
                        "and checkpoint only where torch imports); "
                        "limits not needed by them are skipped")
    p.add_argument("--consumer-rate", type=float, default=None,
                   help="dataloader group: the samples/s one GPU consumes, printed next to the loader "
                        "rates (default 2000, about a ResNet-50 training step rate)")
    p.add_argument("--dl-workers", default=None,
                   help="dataloader group: DataLoader worker counts, comma list (default 4, --quick 0,2)")
    p.add_argument("--ckpt-size", type=parse_size, default=None,
                   help="checkpoint group: state_dict size, fp32 tensors (default 2G, --quick 32M)")
    p.add_argument("--rounds", type=int, default=1,
                   help="rounds, interleaved (limits, LoomFS, compare; again): medians, ranges and "
                        "per-round paired ratios")
    p.add_argument("--json", dest="json_path", default=None, help="write results as JSON here")
    p.add_argument("--plot", dest="plot_path", default=None, help="draw the results into this PNG")
    p.add_argument("--compare", dest="compare_dir", default=None,
                   help="also run the file-level workloads in this directory (a local disk, another DFS "
                        "mounted here), in the same rounds; its writes are fsynced before close")
    p.add_argument("--compare-drop", dest="compare_drop", action="append", default=None, metavar="DIR",
                   help="with --compare: also drop the files under DIR from this host's page cache before a "
                        "cold read (repeatable), e.g. the chunk directories of MooseFS chunk servers running "
                        "here, as LoomFS's storage page cache is dropped")
    p.add_argument("--start", action="store_true",
                   help="start a throwaway local cluster (3 storage nodes) instead of using --dir")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--mount", action="store_true",
                   help="through a FUSE mount vs the native client vs a local directory (loomfs.bench.mount)")
    p.add_argument("--mount-options", default="", help="with --mount: its -o options")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    cluster = None
    if args.start:
        from loomfs.testing.cluster import LocalCluster

        tmp = tempfile.mkdtemp(prefix="loomfs-bench-")
        cluster = LocalCluster(tmp)
        print(f"starting a local cluster in {tmp} ...")
        cluster.start()
        args.cluster_dir = tmp
    try:
        return _bench(args)
    finally:
        if cluster is not None:
            import shutil

            cluster.stop()
            shutil.rmtree(cluster.root, ignore_errors=True)


def plan_from_args(args: argparse.Namespace) -> Any:
    from loomfs.bench.suite import Plan

    plan = Plan.quick() if args.quick else Plan()
    if args.size is not None:
        plan.big_bytes = args.size
    if args.procs is not None:
        plan.procs = args.procs
    if args.files is not None:
        plan.md_files = args.files
    if args.lookup_sizes:
        plan.lookup_sizes = [int(x) for x in args.lookup_sizes.split(",") if x.strip()]
    if args.files_small is not None:
        plan.sf_files = max(1, args.files_small)
    if args.consumer_rate is not None:
        plan.dl_consumer_rate = args.consumer_rate
    if args.dl_workers:
        plan.dl_workers = tuple(max(0, int(x)) for x in args.dl_workers.split(",") if x.strip())
    if args.ckpt_size is not None:
        plan.ckpt_bytes = args.ckpt_size
    if args.only:
        plan.groups = parse_groups(args.only)
    for group in ("dataloader", "checkpoint"):  # the groups that need torch
        if group not in plan.groups:
            continue
        from loomfs.bench.dataloader import check_torch

        why = check_torch()
        if why is not None and args.only:
            raise SystemExit(f"loomfs bench --only {group}: {why}")
        if why is not None:
            print(f"skipping the {group} group: {why}")
            plan.groups = [g for g in plan.groups if g != group]
    if "hosts" in plan.groups:
        from loomfs.bench.hosts import check_netns

        why = check_netns()
        if why is not None:
            raise SystemExit(f"loomfs bench --only hosts: {why}")
    plan.rounds = max(1, args.rounds)
    return plan


def parse_groups(text: str) -> list[str]:
    from loomfs.bench.suite import GROUPS

    groups = [g.strip() for g in text.split(",") if g.strip()]
    bad = [g for g in groups if g not in GROUPS]
    if bad or not groups:
        raise SystemExit(f"loomfs bench --only: unknown group(s) {', '.join(bad) or '(none)'}; "
                         f"choose from {', '.join(GROUPS)}")
    return [g for g in GROUPS if g in groups]


def _replicas(args: argparse.Namespace, fs: Any) -> int:
    from loomfs.cli.admin import fetch_routing

    fs.makedirs("/.bench", exist_ok=True)
    layout = fs.get_layout("/.bench")
    r = fetch_routing(args)
    named = layout.table_id if layout is not None else 0
    for t in r.tables:
        if t.table_id == named if named else not t.ec:  # none named: meta picks a replicated table
            return int(t.replicas)
    return 3


def _bench(args: argparse.Namespace) -> int:
    from loomfs.bench.report import plot, table_lines
    from loomfs.bench.suite import run_bench
    from loomfs.bench.targets import BenchTarget, LocalTarget, LoomTarget

    where = target(args, BENCH_HINT)  # no cluster: a one-line hint, before any measuring
    plan = plan_from_args(args)
    disk_dir = args.cluster_dir if args.cluster_dir and Path(args.cluster_dir).is_dir() else tempfile.gettempdir()
    if args.mount:
        from loomfs.bench.mount import cmd_bench_mount

        return cmd_bench_mount(args, where, disk_dir)
    with connect(args, BENCH_HINT) as fs:
        replicas = _replicas(args, fs)
        targets: list[BenchTarget] = [LoomTarget(where, fs)]
        if args.compare_dir:
            targets.append(LocalTarget(args.compare_dir, drop_dirs=args.compare_drop or ()))
        doc = run_bench(targets, plan, replicas, disk_dir, quick=args.quick, show_progress=not args.no_progress)
    from loomfs.bench.hosts import curve_lines, plot_curve

    print("\n".join(table_lines(doc) + curve_lines(doc)))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(doc, indent=2))
        print(f"results written to {args.json_path}")
    if args.plot_path:
        plot(doc, args.plot_path)
        print(f"plot written to {args.plot_path}")
        curve = str(Path(args.plot_path).with_suffix("")) + "-hosts.png"
        if plot_curve(doc, curve):  # the storage-hosts curve (--only hosts), a figure of its own
            print(f"storage-hosts curve written to {curve}")
    return 0
