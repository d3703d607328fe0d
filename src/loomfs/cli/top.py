"""``loomfs top``: a live terminal view of the cluster (rich): nodes, targets, chains,
throughput and IOPS per node, metadata ops/s, p99 latency, recovery progress."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from loomfs.cli.admin import mgmtd_addresses
from loomfs.cli.common import human_bytes

_COLORS = {"ok": "green", "alive": "green", "serving": "green", "spare": "cyan", "degraded": "yellow", "syncing": "yellow",
           "waiting": "yellow", "lastsrv": "red", "offline": "red", "dead": "red", "down": "red",
           "unreachable": "red"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("top", help="live view of the cluster: nodes, targets, throughput, latency")
    p.add_argument("--interval-s", type=float, default=1.0, help="refresh period (default 1 s)")
    p.add_argument("--once", action="store_true", help="print one snapshot (two polls) and exit")
    p.set_defaults(func=cmd_top)


def _c(text: Any) -> Text:
    s = str(text)
    return Text(s, style=_COLORS.get(s, ""))


def _rate(v: Any) -> str:
    return "-" if v is None else f"{human_bytes(v)}/s"


def _n(v: Any, fmt: str = "{:,.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def render(view: dict[str, Any]) -> Group:
    """The whole screen for one view (``dashboard.model.build_view``)."""
    t = view.get("totals", {})
    head = Text.assemble(
        ("LoomFS  ", "bold"), ("health ", ""), _c(view.get("health", "?")),
        f"   routing v{view.get('routing_version', 0)}",
        f"   storage {t.get('storage_nodes_alive', 0)}/{t.get('storage_nodes', 0)} alive",
        f"   targets {t.get('targets_serving', 0)}/{t.get('targets', 0)} serving, {t.get('targets_spare', 0)} spare"
        + (f", {t['targets_blank']} blank" if t.get("targets_blank") else ""),
        f"   used {human_bytes(t.get('used_bytes', 0))} of {human_bytes(t.get('capacity_bytes', 0))} "
        f"({t.get('disks', 0)} disk{'' if t.get('disks', 0) == 1 else 's'})",
    )
    parts: list[Any] = [head]
    if view.get("error"):
        parts.append(Text(view["error"], style="red"))
    io = Text(f"storage in {_rate(t.get('storage_in_Bps'))}  out {_rate(t.get('storage_out_Bps'))}  "
              f"IOPS {_n(t.get('storage_iops'))}  meta {_n(t.get('meta_ops_per_s'))} ops/s  "
              f"p99 {_n(t.get('p99_ms_max'), '{:.2f}')} ms  "
              f"recovery left {human_bytes(t.get('recovery_bytes_left', 0))} "
              f"({t.get('recovering_targets', 0)} syncing)")
    parts.append(io)
    if t.get("meta_ops_by_method"):
        parts.append(Text("meta ops/s: " + "  ".join(f"{m} {v:,.0f}" for m, v in t["meta_ops_by_method"].items())))
    if view.get("nodes") and not t.get("metrics_nodes"):
        parts.append(Text("no node serves /metrics yet: rates unavailable (routing only)", style="dim"))
    nodes = Table(title="nodes", expand=True)
    for col in ("node", "kind", "address", "state", "in", "out", "IOPS", "ops/s", "p50 ms", "p99 ms", "err/s"):
        nodes.add_column(col)
    for n in view.get("nodes", []):
        nodes.add_row(str(n["node_id"]), n["kind"], n["address"], _c(n["state"]), _rate(n.get("in_Bps")),
                      _rate(n.get("out_Bps")), _n(n.get("iops")), _n(n.get("ops_per_s")),
                      _n(n.get("p50_ms"), "{:.2f}"), _n(n.get("p99_ms"), "{:.2f}"), _n(n.get("errors_per_s"), "{:.1f}"))
    targets = Table(title="targets", expand=True)
    for col in ("target", "node", "state", "chain", "chunks", "used", "capacity", "sync left"):
        targets.add_column(col)
    for x in view.get("targets", []):
        left = human_bytes(x["sync_bytes_left"]) if x["sync_bytes_left"] else ""
        state = Text.assemble(_c(x["state"]), (" blank", "bold red") if x.get("blank") else "")
        targets.add_row(str(x["target_id"]), str(x["node_id"]), state, str(x["chain_id"] or "spare"),
                        str(x["chunks"]), human_bytes(x["used_bytes"]), human_bytes(x["capacity_bytes"]), left)
    chains = Table(title="chains", expand=True)
    for col in ("chain", "table", "version", "targets head..tail"):
        chains.add_column(col)
    for c in view.get("chains", []):
        line = Text(" -> ").join(Text.assemble(f"{m['target_id']}(", _c(m["state"]), ")") for m in c["targets"])
        chains.add_row(str(c["chain_id"]), str(c["table_id"]) + (" (ec)" if c.get("ec") else ""), str(c["version"]), line)
    return Group(*parts, nodes, targets, chains)


def cmd_top(args: argparse.Namespace) -> int:
    from loomfs.dashboard.poller import ClusterPoller

    async def go() -> None:
        poller = ClusterPoller(mgmtd_addresses(args))
        try:
            if args.once:
                await poller.poll()
                await asyncio.sleep(min(args.interval_s, 1.0))
                Console().print(render(await poller.poll()))
                return
            with Live(render(await poller.poll()), refresh_per_second=4, screen=False) as live:
                while True:
                    await asyncio.sleep(args.interval_s)
                    live.update(render(await poller.poll()))
        finally:
            await poller.close()

    try:
        asyncio.run(go())
    except KeyboardInterrupt:
        pass
    return 0
