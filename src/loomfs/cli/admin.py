"""``loomfs admin nodes|targets|chains|tables|rebuilds|create-chain-table``: the cluster as mgmtd
sees it (``targets`` marks *blank* ones, back on a replaced disk; ``tables`` says which are EC
groups'; ``rebuilds``: the EC rebuild workers' progress, read from the meta servers' ``/metrics``);
``table set-ec`` and ``chain accept-loss``: ``admin_chain``."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from loomfs.cli import admin_chain, admin_tenant, admin_token
from loomfs.cli.common import human_bytes, target
from loomfs.common.routing import MgmtdSet, parse_addresses
from loomfs.metrics.capacity import target_blank_note, target_state_name
from loomfs.net.rpc import RpcClient
from loomfs.net.tcp import TcpTransport
from loomfs.wire import mgmtd as wm
from loomfs.wire.types import NodeKind, NodeState, RoutingInfo, ScrubStats, TargetState


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("admin", help="cluster administration: nodes, targets, chains")
    asub = p.add_subparsers(dest="admin_command", metavar="ACTION", required=True)
    for name, fn, text in (
        ("nodes", cmd_nodes, "list nodes and their state"),
        ("targets", cmd_targets, "list storage targets: state (blank: back on a replaced disk), chain, usage"),
        ("chains", cmd_chains, "list chains: version and targets head..tail"),
        ("tables", cmd_tables, "list chain tables: replicas, EC group's or replicated, chains"),
        ("rebuilds", cmd_rebuilds, "EC rebuilds onto new targets: files/bytes done and left per chain"),
    ):
        s = asub.add_parser(name, help=text)
        s.add_argument("--json", action="store_true")
        s.set_defaults(func=fn)
    d = asub.add_parser("drain", help="move a storage node's replicas to spares (then it can be removed)")
    d.add_argument("node", type=int, help="storage node id")
    d.add_argument("--undo", action="store_true", help="stop draining")
    d.add_argument("--wait", action="store_true", help="wait until the node holds no replica")
    d.add_argument("--timeout-s", type=float, default=600.0)
    d.set_defaults(func=cmd_drain)
    f = asub.add_parser("fsck", help="check namespace <-> chunks (orphans, missing replicas, lengths)")
    f.add_argument("--repair", action="store_true", help="remove orphan chunks (after --grace-s)")
    f.add_argument("--grace-s", type=float, default=10.0)
    f.set_defaults(func=_fsck)
    c = asub.add_parser("create-chain-table", help="build a chain table from the free targets")
    c.add_argument("--replicas", type=int, default=3)
    c.add_argument("--table", type=int, default=0, help="table id (default: next free)")
    c.add_argument("--targets-per-node", type=int, default=0,
                   help="use at most N free targets of each node (the rest stay spares; default: all)")
    c.add_argument("--ec", action="store_true",
                   help="an EC group's table (needs --replicas 1): a chain whose target is lost gets an empty "
                        "spare that the EC layer rebuilds; without it a lost target is kept (replicated table)")
    c.set_defaults(func=cmd_create_table)
    admin_chain.register(asub)
    admin_token.register(asub)
    admin_tenant.register(asub)


def mgmtd_addresses(args: argparse.Namespace) -> str:
    t = target(args)
    p = Path(t)
    if p.is_dir():
        return str(json.loads((p / "cluster.json").read_text())["mgmtd"])
    return t


async def _call(args: argparse.Namespace, m: Any, req: Any) -> Any:
    # the target first: a cluster directory names the token this command proves, which the
    # transport takes when it is made
    addresses = parse_addresses(mgmtd_addresses(args))
    rpc = RpcClient(TcpTransport(), connect_timeout_s=2.0)
    try:
        # the primary first, a NOT_PRIMARY answer's hint followed, a dead mgmtd passed over at once
        return (await MgmtdSet(rpc, addresses).call(m, req, timeout_s=10.0)).body
    finally:
        await rpc.close()


def fetch_routing(args: argparse.Namespace) -> RoutingInfo:
    body = asyncio.run(_call(args, wm.GET_ROUTING, wm.GetRoutingReq()))
    assert body.routing is not None
    return body.routing


def _emit(args: argparse.Namespace, title: str, cols: list[str], rows: list[list[Any]],
          json_extra: list[dict[str, Any]] | None = None) -> None:
    """A table, or with ``--json`` a list of objects (``json_extra``: more keys per row)."""
    if args.json:
        out = [dict(zip(cols, r, strict=True)) for r in rows]
        for o, extra in zip(out, json_extra or [{}] * len(out), strict=True):
            o.update(extra)
        print(json.dumps(out, indent=2))
        return
    t = Table(title=title)
    for c in cols:
        t.add_column(c)
    for r in rows:
        t.add_row(*[str(x) for x in r])
    Console().print(t)


def cmd_nodes(args: argparse.Namespace) -> int:
    r = fetch_routing(args)
    rows = [[n.node_id, NodeKind(n.kind).name.lower(), f"{n.host}:{n.port}", NodeState(n.state).name.lower(),
             n.domain] for n in r.nodes]
    _emit(args, f"nodes (routing v{r.version})", ["node", "kind", "address", "state", "domain"], rows)
    return 0


def _ago(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def scrub_summary(s: ScrubStats | None, now_unix_s: float) -> str:
    """One cell: the scrubber's schedule and what it found ("every 1.0h, next in 12m, 0 bad")."""
    if s is None:
        return ""
    if not s.interval_s:
        return f"off, {s.bad} bad" if s.bad else "off"
    parts = [f"every {_ago(s.interval_s)}"]
    if s.next_pass_unix_s:
        parts.append(f"next in {_ago(max(0.0, s.next_pass_unix_s - now_unix_s))}")
    else:
        parts.append("running")
    if s.last_pass_end_unix_s:
        parts.append(f"last {_ago(now_unix_s - s.last_pass_end_unix_s)} ago")
    rebuilt = f", {s.rebuilt} rebuilt from blocks" if s.rebuilt else ""
    parts.append(f"{s.bad} bad" + (f" ({s.repaired} repaired{rebuilt})" if s.bad else ""))
    return ", ".join(parts)


def scrub_json(s: ScrubStats | None) -> dict[str, Any] | None:
    return None if s is None else s.to_wire()


def cmd_targets(args: argparse.Namespace) -> int:
    r = fetch_routing(args)
    def sync_left(t: Any) -> Any:
        if t.state != TargetState.SYNCING:
            return "" if not args.json else None
        if args.json:
            return {"chunks": t.sync_chunks_left, "bytes": t.sync_bytes_left}
        return f"{t.sync_chunks_left} chunks / {human_bytes(t.sync_bytes_left)}"

    def state(t: Any) -> str:
        note = "" if args.json else target_blank_note(t)  # JSON: the "blank" key
        return target_state_name(t) + (" (draining)" if t.draining else "") + (f" ({note})" if note else "")

    rows = [[t.target_id, t.node_id, state(t),
             t.chain_id or "spare", t.chunk_count, human_bytes(t.used_bytes) if not args.json else t.used_bytes,
             human_bytes(t.capacity_bytes) if not args.json else t.capacity_bytes, sync_left(t),
             scrub_summary(t.scrub, time.time()) if not args.json else scrub_json(t.scrub), t.path]
            for t in r.targets]
    _emit(args, f"targets (routing v{r.version})",
          ["target", "node", "state", "chain", "chunks", "used", "capacity", "sync left", "scrub", "path"], rows,
          [{"blank": t.blank, "format_id": t.format_id} for t in r.targets])
    return 0


def cmd_chains(args: argparse.Namespace) -> int:
    r = fetch_routing(args)
    states = {t.target_id: TargetState(t.state).name.lower() + (", blank" if t.blank else "") for t in r.targets}
    rows = [[c.chain_id, c.table_id, c.version,
             " -> ".join(f"{t}({states.get(t, '?')})" for t in c.targets)] for c in r.chains]
    _emit(args, f"chains (routing v{r.version})", ["chain", "table", "version", "targets head..tail"], rows)
    return 0


def cmd_tables(args: argparse.Namespace) -> int:
    r = fetch_routing(args)
    rows = [[t.table_id, "EC group" if t.ec else "replicated", t.replicas, t.version, len(t.chain_ids),
             list(t.chain_ids) if args.json else _ids(list(t.chain_ids))] for t in r.tables]
    _emit(args, f"chain tables (routing v{r.version})", ["table", "kind", "replicas", "version", "chains", "chain ids"],
          rows, [{"ec": t.ec} for t in r.tables])
    return 0


def _ids(ids: list[int]) -> str:
    """``1-4, 7``: runs of consecutive ids folded."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def cmd_create_table(args: argparse.Namespace) -> int:
    body = asyncio.run(_call(args, wm.CREATE_CHAIN_TABLE,
                             wm.CreateChainTableReq(replicas=args.replicas, table_id=args.table,
                                                    targets_per_node=args.targets_per_node, ec=args.ec)))
    t = body.table
    print(f"chain table {t.table_id}: {len(t.chain_ids)} chains x {t.replicas} replicas"
          + (" (EC group)" if t.ec else ""))
    return 0


def cmd_drain(args: argparse.Namespace) -> int:
    body = asyncio.run(_call(args, wm.DRAIN_NODE, wm.DrainReq(node_id=args.node, undrain=args.undo)))
    if args.undo:
        print(f"node {args.node}: draining stopped")
        return 0
    print(f"node {args.node}: draining, {body.targets_to_move} targets still in chains")
    if not args.wait:
        return 0
    end = time.monotonic() + args.timeout_s
    while time.monotonic() < end:
        r = fetch_routing(args)
        left = [t.target_id for t in r.targets if t.node_id == args.node and t.chain_id]
        if not left:
            print(f"node {args.node} holds no replica: it can be removed")
            return 0
        time.sleep(1.0)
    print(f"node {args.node}: still in chains after {args.timeout_s:.0f}s")
    return 3


def _fsck(args: argparse.Namespace) -> int:
    from loomfs.cli.fsck import cmd_fsck

    return cmd_fsck(args)


REBUILD_FIELDS = ("files_done", "files_left", "bytes_done", "bytes_left", "files_failed", "files_retry")


async def _rebuild_rows(r: RoutingInfo) -> dict[int, dict[str, Any]]:
    from loomfs.metrics.scrape import scrape

    rows: dict[int, dict[str, Any]] = {}
    for n in r.nodes:
        if n.kind != NodeKind.META or n.state != NodeState.ALIVE or not n.metrics_port:
            continue
        try:
            sc = await scrape(n.host, n.metrics_port)
        except (OSError, TimeoutError, ValueError):
            continue  # that meta server does not answer: the others read the same store
        got: dict[int, dict[str, Any]] = {}
        for name in REBUILD_FIELDS:
            for labels, value in sc.values(f"loomfs_ec_rebuild_{name}"):
                row = got.setdefault(int(labels["chain"]), {"chain": int(labels["chain"]),
                                                             "target": int(labels["target"]),
                                                             "phase": labels["phase"], "meta": n.node_id})
                row[name] = int(value)
        for chain, row in got.items():  # every meta reads the store; the worker on it is the freshest
            old = rows.get(chain)
            if old is None or (row.get("files_done", 0), row.get("bytes_done", 0)) > (
                    old.get("files_done", 0), old.get("bytes_done", 0)):
                rows[chain] = row
    return rows


def cmd_rebuilds(args: argparse.Namespace) -> int:
    r = fetch_routing(args)
    rows = asyncio.run(_rebuild_rows(r))
    if args.json:
        print(json.dumps([rows[c] for c in sorted(rows)], indent=2))
        return 0
    out = []
    for c in sorted(rows):
        x = {k: rows[c].get(k, 0) for k in REBUILD_FIELDS} | rows[c]
        out.append([c, x["target"], x["phase"], f"{x['files_done']} / {x['files_done'] + x['files_left']}",
                    f"{human_bytes(x['bytes_done'])} / {human_bytes(x['bytes_done'] + x['bytes_left'])}",
                    f"{x['files_left']} files, {human_bytes(x['bytes_left'])}", x["files_retry"], x["files_failed"]])
    _emit(args, f"EC rebuilds (routing v{r.version})",
          ["chain", "target", "phase", "files done", "bytes done", "left", "retrying", "given up"], out)
    return 0
