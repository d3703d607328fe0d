"""``loomfs local up|status|down|restart``: a whole cluster on this machine."""

from __future__ import annotations

import argparse
import errno
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from loomfs.cli.common import cluster_dir
from loomfs.testing.cluster import LocalCluster


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("local", help="run a cluster on this machine (127.0.0.1)")
    lsub = p.add_subparsers(dest="local_command", metavar="ACTION", required=True)

    up = lsub.add_parser("up", help="start mgmtd, meta and storage processes in the background")
    up.add_argument("--dir", dest="local_dir", default=None, help="cluster directory (default ./loomfs-local)")
    up.add_argument("--storage-nodes", type=int, default=3)
    up.add_argument("--targets-per-node", type=int, default=2)
    up.add_argument("--replicas", type=int, default=3, help="replication factor of the default chain table")
    up.add_argument("--meta-nodes", "--meta-servers", dest="meta_nodes", type=int, default=1,
                    help="meta servers, all serving one namespace (default 1; at most 8)")
    up.add_argument("--meta-store", default=None, metavar="URL",
                    help="metastore every meta server uses, e.g. postgresql://user@host:5432/db "
                         "(default: one SQLite file in the cluster directory)")
    up.add_argument("--mgmtd-servers", type=int, default=1,
                    help="mgmtd processes, one primary elected by lease (more than 1 needs --mgmtd-store)")
    up.add_argument("--mgmtd-store", default=None, metavar="URL",
                    help="the postgresql://... store the mgmtd processes share (docs/mgmtd-ha.md; "
                         "default: one SQLite file, one mgmtd)")
    up.add_argument("--base-port", type=int, default=8000,
                    help="mgmtd port; meta uses the next ones, storage base+10.. (default 8000; 0: free ports "
                         "found at start)")
    up.add_argument("--gc-delay-s", type=float, default=30.0)
    up.add_argument("--no-auth", action="store_true",
                    help="no cluster secret: every peer is trusted (default: a secret and an admin token "
                         "in the cluster directory, docs/security.md)")
    up.set_defaults(func=cmd_up)

    st = lsub.add_parser("status", help="show each service with its pid, address and state")
    st.add_argument("--dir", dest="local_dir", default=None)
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.set_defaults(func=cmd_status)

    down = lsub.add_parser("down", help="stop exactly the processes `local up` started")
    down.add_argument("--dir", dest="local_dir", default=None)
    down.set_defaults(func=cmd_down)

    an = lsub.add_parser("add-node", help="start one more storage node; its targets become spares")
    an.add_argument("--dir", dest="local_dir", default=None)
    an.set_defaults(func=cmd_add_node)

    lg = lsub.add_parser("logs", help="show service logs (all services merged by time, or one)")
    lg.add_argument("--dir", dest="local_dir", default=None)
    lg.add_argument("service", nargs="?", default=None, help="e.g. meta1; default all")
    lg.add_argument("-n", "--lines", type=int, default=40, help="last N lines (default 40)")
    lg.add_argument("--grep", default=None, help="only lines containing this (e.g. a trace id)")
    lg.set_defaults(func=cmd_logs)

    rs = lsub.add_parser("restart", help="restart one service (or all)")
    rs.add_argument("--dir", dest="local_dir", default=None)
    rs.add_argument("service", nargs="?", default=None, help="e.g. storage2; default all")
    rs.set_defaults(func=cmd_restart)


def cmd_up(args: argparse.Namespace) -> int:
    root = cluster_dir(args)
    if (root / "cluster.json").exists():
        c = LocalCluster.from_dir(root)
        rows = c.status()
        if all(s["state"] == "running" for s in rows):
            print(f"LoomFS local cluster already running in {root}")
            _print_status(c, as_json=False)
            return 0
        down = [s["name"] for s in rows if s["state"] != "running"]
        if len(down) < len(rows):  # partly running: start what is missing, keep the rest
            order = {"mgmtd": 0, "storage": 1, "meta": 2}
            for name in sorted(down, key=lambda n: (order.get(c.services[n].kind, 3), n)):
                print(f"starting {name} (it was not running)")
                c.start_service(name)
                c.wait_listening(name)
            print(f"LoomFS local cluster up in {root} ({len(down)} service(s) restarted)")
            _print_status(c, as_json=False)
            return 0
    else:
        if not 1 <= args.meta_nodes <= 8:
            raise SystemExit("--meta-servers must be 1..8")
        if args.meta_store is not None and "://" not in args.meta_store:
            raise SystemExit(f"--meta-store needs a URL (postgresql://... or sqlite:///...), got {args.meta_store!r}")
        if not 1 <= args.mgmtd_servers <= 3:
            raise SystemExit("--mgmtd-servers must be 1..3")
        if args.mgmtd_servers > 1 and not (args.mgmtd_store or "").startswith(("postgresql://", "postgres://")):
            raise SystemExit("--mgmtd-servers above 1 needs --mgmtd-store postgresql://... (SQLite is one mgmtd)")
        if args.replicas > args.storage_nodes:
            raise SystemExit(f"--replicas {args.replicas} needs at least that many --storage-nodes")
        c = LocalCluster(
            root, storage_nodes=args.storage_nodes, targets_per_node=args.targets_per_node,
            replicas=args.replicas, meta_nodes=args.meta_nodes, base_port=_base_port(args.base_port),
            gc_delay_s=args.gc_delay_s, meta_store=args.meta_store,
            mgmtd_servers=args.mgmtd_servers, mgmtd_store=args.mgmtd_store, auth=not args.no_auth,
        )
    c.start()
    print(f"LoomFS local cluster up in {root}")
    _print_status(c, as_json=False)
    print(f"\nexport LOOMFS_CLUSTER={root}    # then: loomfs ls /, python -c 'import loomfs; fs = loomfs.connect()'")
    if c.auth:
        print(f"credentials: {c.secret_path} (cluster secret), {c.token_path} (admin token, used by "
              "clients of LOOMFS_CLUSTER; more: loomfs admin token create)")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    c = LocalCluster.from_dir(cluster_dir(args))
    _print_status(c, as_json=args.json)
    down = [s["name"] for s in c.status() if s["state"] != "running"]
    if down and not args.json:
        print(f"not running: {', '.join(down)} (their logs: loomfs local logs NAME); "
              f"`loomfs local up --dir {c.root}` starts what is missing", file=sys.stderr)
    return 0 if not down else 3


def cmd_down(args: argparse.Namespace) -> int:
    c = LocalCluster.from_dir(cluster_dir(args))
    c.stop()
    print(f"stopped {len(c.services)} services of {c.root}")
    return 0


def cmd_add_node(args: argparse.Namespace) -> int:
    c = LocalCluster.from_dir(cluster_dir(args))
    s = c.add_storage_node()
    print(f"started {s.name} (node {s.node_id}) on {s.address}; its targets are spares")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    c = LocalCluster.from_dir(cluster_dir(args))
    names = [args.service] if args.service else list(c.services)
    unknown = [n for n in names if n not in c.services]
    if unknown:
        raise SystemExit(f"no service {unknown[0]!r}; have {', '.join(c.services)}")
    lines: list[str] = []
    for name in names:
        path = Path(c.services[name].log_path)
        if path.exists():
            lines += [ln for ln in path.read_text(errors="replace").splitlines()
                      if args.grep is None or args.grep in ln]
    lines.sort(key=lambda ln: ln[:23])  # every line starts with its timestamp: merge by time
    for ln in lines[-args.lines:] if args.lines > 0 else lines:
        print(ln)
    return 0


def cmd_restart(args: argparse.Namespace) -> int:
    c = LocalCluster.from_dir(cluster_dir(args))
    if args.service:
        if args.service not in c.services:
            raise SystemExit(f"no service {args.service!r}; have {', '.join(c.services)}")
        c.restart_service(args.service)
    else:
        c.stop()
        c.start()
    _print_status(c, as_json=False)
    return 0


def _print_status(c: LocalCluster, *, as_json: bool) -> None:
    rows = c.status()
    if as_json:
        print(json.dumps({"dir": str(c.root), "mgmtd": c.mgmtd_address, "services": rows}, indent=2))
        return
    t = Table(title=f"LoomFS cluster {c.root}")
    for col in ("service", "kind", "pid", "address", "state", "/metrics port"):
        t.add_column(col)
    for r in rows:
        color = "green" if r["state"] == "running" else "red"
        t.add_row(r["name"], r["kind"], str(r["pid"] or "-"), r["address"], f"[{color}]{r['state']}[/]",
                  (r.get("metrics") or "-").rsplit(":", 1)[-1].removesuffix("/metrics"))
    Console().print(t)


def _base_port(port: int) -> int | None:
    """``--base-port``: 0 picks free ports at start (None); otherwise a port with room above it."""
    if port == 0:
        return None
    if not 1024 <= port <= 65000:
        raise OSError(errno.EINVAL, f"--base-port {port}: choose 1024..65000 (or 0 for free ports)")
    return port
