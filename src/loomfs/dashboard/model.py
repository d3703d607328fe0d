"""The cluster as ``loomfs top`` and the dashboard show it: pure functions from a routing
snapshot plus metrics scrapes to a JSON-ready view (no I/O here)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from loomfs.metrics.capacity import cluster_capacity, target_blank_note, target_state_name
from loomfs.metrics.scrape import Scrape, method_rates, rates
from loomfs.wire.types import NodeKind, NodeState, RoutingInfo, TargetState


def metrics_port_of(node: Any) -> int:
    """The node's advertised /metrics port (0: none). ``NodeInfo.metrics_port`` once wired."""
    return int(getattr(node, "metrics_port", 0) or 0)


def _name(enum: Any, v: int) -> str:
    try:
        return str(enum(v).name.lower())
    except ValueError:
        return str(v)


def _num(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 6)


def health_of(routing: RoutingInfo) -> str:
    """ok: every node alive, every chained target serving; degraded: some replicas out but
    every chain has a serving target; down: a chain without a serving target (or no routing)."""
    states = {t.target_id: t.state for t in routing.targets}
    for c in routing.chains:
        if not any(states.get(t) == TargetState.SERVING for t in c.targets):
            return "down"
    if any(n.state != NodeState.ALIVE for n in routing.nodes):
        return "degraded"
    if any(t.chain_id and t.state != TargetState.SERVING for t in routing.targets):
        return "degraded"
    return "ok"


def build_view(routing: RoutingInfo, scrapes: dict[int, Scrape], prev: dict[int, Scrape],
               *, now_s: float) -> dict[str, Any]:
    """One snapshot: health, nodes (with per-node rates where scraped), targets, chains,
    totals. ``scrapes``/``prev``: node_id -> this/previous scrape."""
    nodes = []
    total_in = total_out = total_iops = meta_ops = 0.0
    meta_by_method: dict[str, float] = {}
    p99s: list[float] = []
    for n in sorted(routing.nodes, key=lambda n: (n.kind, n.node_id)):
        row: dict[str, Any] = {
            "node_id": n.node_id, "kind": _name(NodeKind, n.kind), "address": f"{n.host}:{n.port}",
            "state": _name(NodeState, n.state), "metrics_port": metrics_port_of(n), "scraped": False,
        }
        cur = scrapes.get(n.node_id)
        if cur is not None:
            r = rates(prev.get(n.node_id), cur)
            row.update(scraped=True, ops_per_s=_num(r.ops_per_s), iops=_num(r.iops),
                       in_Bps=_num(r.bytes_in_per_s), out_Bps=_num(r.bytes_out_per_s),
                       errors_per_s=_num(r.errors_per_s), p99_ms=_num(r.p99_s * 1e3),
                       p50_ms=_num(r.p50_s * 1e3))
            if n.kind == NodeKind.STORAGE:
                total_in += r.bytes_in_per_s
                total_out += r.bytes_out_per_s
                total_iops += r.iops
            if n.kind == NodeKind.META:
                meta_ops += r.ops_per_s
                for m, v in method_rates(prev.get(n.node_id), cur).items():
                    meta_by_method[m] = meta_by_method.get(m, 0.0) + v
            if not math.isnan(r.p99_s):
                p99s.append(r.p99_s)
        nodes.append(row)
    targets = []
    for t in sorted(routing.targets, key=lambda t: t.target_id):
        targets.append({
            "target_id": t.target_id, "node_id": t.node_id, "state": target_state_name(t),
            "chain_id": t.chain_id, "used_bytes": t.used_bytes, "capacity_bytes": t.capacity_bytes,
            "chunks": t.chunk_count, "sync_chunks_left": getattr(t, "sync_chunks_left", 0),
            "sync_bytes_left": getattr(t, "sync_bytes_left", 0), "path": t.path,
            # back on a replaced disk, not resynced yet (mgmtd.diskident); note: what it means
            "blank": bool(getattr(t, "blank", False)), "format_id": getattr(t, "format_id", ""),
            "note": target_blank_note(t),
        })
    states = {t.target_id: _name(TargetState, t.state) for t in routing.targets}
    blank = {t.target_id for t in routing.targets if getattr(t, "blank", False)}
    ec_tables = {t.table_id for t in routing.tables if getattr(t, "ec", False)}
    cap = cluster_capacity(routing)
    chains = [{"chain_id": c.chain_id, "table_id": c.table_id, "version": c.version, "ec": c.table_id in ec_tables,
               "targets": [{"target_id": t, "state": states.get(t, "?"), "blank": t in blank} for t in c.targets]}
              for c in sorted(routing.chains, key=lambda c: c.chain_id)]
    tables = [{"table_id": t.table_id, "version": t.version, "replicas": t.replicas, "ec": bool(getattr(t, "ec", False)),
               "chains": len(t.chain_ids)} for t in sorted(routing.tables, key=lambda t: t.table_id)]
    storage = [n for n in routing.nodes if n.kind == NodeKind.STORAGE]
    return {
        "at_s": now_s,
        "routing_version": routing.version,
        "health": health_of(routing),
        "nodes": nodes,
        "targets": targets,
        "chains": chains,
        "tables": tables,
        "totals": {
            "nodes": len(routing.nodes),
            "storage_nodes_alive": sum(1 for n in storage if n.state == NodeState.ALIVE),
            "storage_nodes": len(storage),
            "targets_serving": sum(1 for t in routing.targets if t.chain_id and t.state == TargetState.SERVING),
            "targets": sum(1 for t in routing.targets if t.chain_id),
            "targets_spare": sum(1 for t in routing.targets if not t.chain_id),
            "targets_blank": len(blank),
            "used_bytes": cap.used_bytes,
            "capacity_bytes": cap.capacity_bytes,
            "disks": cap.disks,
            "recovery_bytes_left": sum(getattr(t, "sync_bytes_left", 0) for t in routing.targets),
            "recovering_targets": sum(1 for t in routing.targets if t.state == TargetState.SYNCING),
            "storage_in_Bps": _num(total_in), "storage_out_Bps": _num(total_out),
            "storage_iops": _num(total_iops), "meta_ops_per_s": _num(meta_ops),
            "meta_ops_by_method": {m: _num(v) for m, v in meta_by_method.items()},
            "p99_ms_max": _num(max(p99s) * 1e3) if p99s else None,
            "metrics_nodes": len(scrapes),
        },
    }


@dataclass
class History:
    """Bounded time series of the totals, for throughput graphs."""

    points_max: int = 300
    points: deque[dict[str, Any]] = field(default_factory=deque)

    def add(self, view: dict[str, Any]) -> None:
        t = view["totals"]
        self.points.append({"at_s": view["at_s"], "in_Bps": t["storage_in_Bps"] or 0.0,
                            "out_Bps": t["storage_out_Bps"] or 0.0, "iops": t["storage_iops"] or 0.0,
                            "meta_ops_per_s": t["meta_ops_per_s"] or 0.0,
                            "alive": t["storage_nodes_alive"],
                            "recovery_bytes_left": t["recovery_bytes_left"]})
        while len(self.points) > self.points_max:
            self.points.popleft()

    def __repr__(self) -> str:
        return f"History({len(self.points)}/{self.points_max})"
