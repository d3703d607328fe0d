"""Cluster state machine (no I/O): nodes, targets, chains, chain tables, routing version.

Events come in as method calls with the current time; the state changes and reports
whether routing changed. The service persists the state and answers RPCs; a background
loop calls ``tick`` so silent nodes are marked dead.

Target states in this first version: SERVING while its node is alive; when a node's lease
lapses its targets go OFFLINE, except the last serving targets of a chain, which go LASTSRV
(they hold the newest data). A returning LASTSRV target serves again; a returning OFFLINE
target waits (WAITING) until resync brings it up to date (the resync protocol is the fault
tolerance issue's work), unless its chain has no serving or lastsrv member left at all.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from loomfs.errors import InvalidArgument, StatusError
from loomfs.wire.status import Status
from loomfs.wire.types import (
    ChainInfo,
    ChainTable,
    NodeInfo,
    NodeKind,
    NodeState,
    RoutingInfo,
    TargetInfo,
    TargetState,
)

logger = logging.getLogger(__name__)

AUTO_NODE_ID_BASE = 1_000_000


@dataclass(slots=True)
class NodeRecord:
    node_id: int
    kind: int
    host: str
    port: int
    state: int = NodeState.ALIVE
    last_heartbeat_s: float = 0.0  # clock.monotonic() of the last heartbeat (not persisted)


@dataclass(slots=True)
class TargetRecord:
    target_id: int
    node_id: int
    path: str
    state: int = TargetState.SERVING
    chain_id: int = 0
    used_bytes: int = 0
    capacity_bytes: int = 0
    chunk_count: int = 0


@dataclass(slots=True)
class ChainRecord:
    chain_id: int
    table_id: int
    targets: list[int]
    version: int = 1


@dataclass(slots=True)
class TableRecord:
    table_id: int
    replicas: int
    chain_ids: list[int] = field(default_factory=list)
    version: int = 1


class ClusterState:
    def __init__(self, *, lease_s: float):
        self.lease_s = lease_s
        self.version = 1
        self.nodes: dict[int, NodeRecord] = {}
        self.targets: dict[int, TargetRecord] = {}
        self.chains: dict[int, ChainRecord] = {}
        self.tables: dict[int, TableRecord] = {}
        self._routing_cache: RoutingInfo | None = None

    # ---- events ----------------------------------------------------------------------------
    def register(
        self, *, node_id: int, kind: int, host: str, port: int, targets: list[TargetInfo], now_s: float
    ) -> int:
        if kind not in (NodeKind.META, NodeKind.STORAGE, NodeKind.MGMTD):
            raise InvalidArgument(f"unknown node kind {kind}")
        if not host or not (0 < port < 65536):
            raise InvalidArgument(f"bad node address {host}:{port}")
        if node_id == 0:
            node_id = self._find_or_assign(kind, host, port)
        rec = self.nodes.get(node_id)
        changed = False
        if rec is None:
            rec = NodeRecord(node_id, kind, host, port)
            self.nodes[node_id] = rec
            changed = True
            logger.info("node %d (%s) registered at %s:%d", node_id, NodeKind(kind).name, host, port)
        elif rec.kind != kind:
            raise StatusError(Status.EEXIST, f"node id {node_id} belongs to a {NodeKind(rec.kind).name} node")
        if (rec.host, rec.port) != (host, port):
            rec.host, rec.port = host, port
            changed = True
        rec.last_heartbeat_s = now_s
        if rec.state != NodeState.ALIVE:
            changed |= self._node_returns(rec)
        for t in targets:
            if t.target_id <= 0:
                raise InvalidArgument(f"bad target id {t.target_id}")
            tr = self.targets.get(t.target_id)
            if tr is None:
                self.targets[t.target_id] = TargetRecord(
                    t.target_id, node_id, t.path, TargetState.SERVING, 0,
                    t.used_bytes, t.capacity_bytes, t.chunk_count,
                )
                changed = True
            else:
                if tr.node_id != node_id:
                    raise StatusError(Status.EEXIST, f"target {t.target_id} belongs to node {tr.node_id}")
                tr.used_bytes, tr.capacity_bytes, tr.chunk_count = t.used_bytes, t.capacity_bytes, t.chunk_count
        if changed:
            self._bump()
        return node_id

    def heartbeat(self, node_id: int, targets: list[TargetInfo], now_s: float) -> None:
        rec = self.nodes.get(node_id)
        if rec is None:
            raise StatusError(Status.ENOENT, f"node {node_id} is not registered")
        rec.last_heartbeat_s = now_s
        if rec.state != NodeState.ALIVE and self._node_returns(rec):
            self._bump()
        for t in targets:
            tr = self.targets.get(t.target_id)
            if tr is not None and tr.node_id == node_id:
                usage = (t.used_bytes, t.capacity_bytes, t.chunk_count)
                if usage != (tr.used_bytes, tr.capacity_bytes, tr.chunk_count):
                    tr.used_bytes, tr.capacity_bytes, tr.chunk_count = usage
                    self._routing_cache = None  # usage is not a routing change: no version bump

    def tick(self, now_s: float) -> bool:
        """Mark nodes silent for longer than the lease dead. True if routing changed."""
        dead = [
            n for n in self.nodes.values()
            if n.state == NodeState.ALIVE and now_s - n.last_heartbeat_s > self.lease_s
        ]
        if not dead:
            return False
        for n in dead:
            n.state = NodeState.DEAD
            logger.info("node %d missed heartbeats for %.1fs: dead", n.node_id, now_s - n.last_heartbeat_s)
        lost = {t.target_id for t in self.targets.values() if self.nodes[t.node_id].state == NodeState.DEAD
                and t.state in (TargetState.SERVING, TargetState.SYNCING)}
        for chain in self.chains.values():
            serving = [t for t in chain.targets if self.targets[t].state == TargetState.SERVING]
            going = [t for t in serving if t in lost]
            if not going:
                continue
            last = len(going) == len(serving)  # the chain loses its final serving members
            for t in going:
                self.targets[t].state = TargetState.LASTSRV if last else TargetState.OFFLINE
                logger.info("target %d of chain %d -> %s", t, chain.chain_id,
                            TargetState(self.targets[t].state).name)
            chain.version += 1
        for t in lost:  # spares (no chain)
            if self.targets[t].chain_id == 0:
                self.targets[t].state = TargetState.OFFLINE
        self._bump()
        return True

    def _node_returns(self, rec: NodeRecord) -> bool:
        rec.state = NodeState.ALIVE
        logger.info("node %d is back", rec.node_id)
        for t in self.targets.values():
            if t.node_id != rec.node_id:
                continue
            chain = self.chains.get(t.chain_id)
            if chain is None:
                t.state = TargetState.SERVING
                continue
            states = [self.targets[x].state for x in chain.targets if x != t.target_id]
            if t.state == TargetState.LASTSRV or not any(
                s in (TargetState.SERVING, TargetState.LASTSRV) for s in states
            ):
                t.state = TargetState.SERVING
            elif t.state == TargetState.OFFLINE:
                t.state = TargetState.WAITING
            chain.version += 1
            logger.info("target %d of chain %d -> %s", t.target_id, chain.chain_id, TargetState(t.state).name)
        return True

    def _find_or_assign(self, kind: int, host: str, port: int) -> int:
        for n in self.nodes.values():
            if (n.kind, n.host, n.port) == (kind, host, port):
                return n.node_id
        return max([AUTO_NODE_ID_BASE - 1, *self.nodes]) + 1

    # ---- chain tables -------------------------------------------------------------------
    def create_chain_table(self, *, replicas: int, table_id: int = 0) -> TableRecord:
        """Build chains of ``replicas`` targets on distinct alive nodes from unassigned targets."""
        if replicas < 1:
            raise InvalidArgument("replicas must be >= 1")
        if table_id == 0:
            table_id = max([0, *self.tables]) + 1
        if table_id in self.tables:
            raise StatusError(Status.EEXIST, f"chain table {table_id} exists")
        free: dict[int, list[int]] = {}
        for t in sorted(self.targets.values(), key=lambda t: t.target_id):
            node = self.nodes.get(t.node_id)
            if t.chain_id == 0 and node is not None and node.state == NodeState.ALIVE \
                    and node.kind == NodeKind.STORAGE:
                free.setdefault(t.node_id, []).append(t.target_id)
        groups = plan_chains(free, replicas)
        if not groups:
            raise StatusError(
                Status.NO_CHAIN_TABLE,
                f"need {replicas} storage nodes with free targets, have {len(free)}",
            )
        table = TableRecord(table_id, replicas)
        next_chain = max([0, *self.chains]) + 1
        for group in groups:
            chain = ChainRecord(next_chain, table_id, group)
            self.chains[next_chain] = chain
            table.chain_ids.append(next_chain)
            for tid in group:
                self.targets[tid].chain_id = next_chain
            next_chain += 1
        self.tables[table_id] = table
        logger.info("chain table %d: %d chains x %d replicas", table_id, len(groups), replicas)
        self._bump()
        return table

    # ---- views -----------------------------------------------------------------------------
    def routing(self) -> RoutingInfo:
        if self._routing_cache is None or self._routing_cache.version != self.version:
            self._routing_cache = RoutingInfo(
                version=self.version,
                nodes=[NodeInfo(node_id=n.node_id, kind=n.kind, host=n.host, port=n.port, state=n.state)
                       for n in sorted(self.nodes.values(), key=lambda n: n.node_id)],
                targets=[TargetInfo(target_id=t.target_id, node_id=t.node_id, path=t.path, state=t.state,
                                    chain_id=t.chain_id, used_bytes=t.used_bytes,
                                    capacity_bytes=t.capacity_bytes, chunk_count=t.chunk_count)
                         for t in sorted(self.targets.values(), key=lambda t: t.target_id)],
                chains=[ChainInfo(chain_id=c.chain_id, version=c.version, targets=list(c.targets),
                                  table_id=c.table_id)
                        for c in sorted(self.chains.values(), key=lambda c: c.chain_id)],
                tables=[ChainTable(table_id=t.table_id, version=t.version, replicas=t.replicas,
                                   chain_ids=list(t.chain_ids))
                        for t in sorted(self.tables.values(), key=lambda t: t.table_id)],
            )
        return self._routing_cache

    def _bump(self) -> None:
        self.version += 1

    def __repr__(self) -> str:
        return (f"ClusterState(v{self.version} nodes={len(self.nodes)} targets={len(self.targets)} "
                f"chains={len(self.chains)} tables={len(self.tables)})")


def plan_chains(free: dict[int, list[int]], replicas: int) -> list[list[int]]:
    """Group free targets (by node) into chains of ``replicas`` targets on distinct nodes.

    Greedy: each chain takes one target from each of the ``replicas`` nodes with the most
    targets left (ties broken by a rotating order), which balances chains over nodes and
    spreads each node's targets over many peers (so recovery reads fan out).
    """
    left = {n: list(ts) for n, ts in free.items() if ts}
    chains: list[list[int]] = []
    rotation = 0
    while len(left) >= replicas:
        order = sorted(left, key=lambda n: (-len(left[n]), (n - rotation) % (max(left) + 1)))
        nodes = order[:replicas]
        group = [left[n].pop(0) for n in nodes]
        k = len(chains) % replicas  # rotate so chain heads (the busiest role) spread over nodes
        chains.append(group[k:] + group[:k])
        for n in nodes:
            if not left[n]:
                del left[n]
        rotation += 1
    return chains
