"""Chain tables (no I/O): ``ChainTablesMixin.create_chain_table`` and ``set_table_ec``.

A new table's chains are built from unassigned targets of alive storage nodes, placed by
``placement.plan_chains`` (distinct nodes, and distinct failure domains when the labels allow).
A table is replicated or an EC group's (``TableRecord.ec``: only those get empty spares for lost
targets, ``mgmtd.ec``). A mixin of ``ClusterState`` (``mgmtd.state``), which sets the attributes
declared here; ``_bump`` is ``routing.RoutingMixin``'s.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from loomfs.errors import InvalidArgument, StatusError
from loomfs.mgmtd.placement import plan_chains
from loomfs.mgmtd.records import ChainRecord, NodeRecord, TableRecord, TargetRecord
from loomfs.wire.status import Status
from loomfs.wire.types import NodeKind, NodeState

logger = logging.getLogger(__name__)


class ChainTablesMixin:
    nodes: dict[int, NodeRecord]
    targets: dict[int, TargetRecord]
    chains: dict[int, ChainRecord]
    tables: dict[int, TableRecord]

    if TYPE_CHECKING:
        def _bump(self) -> None: ...

    def create_chain_table(self, *, replicas: int, table_id: int = 0, targets_per_node: int = 0,
                           ec: bool | None = None) -> TableRecord:
        """Build chains of ``replicas`` targets on distinct alive nodes from unassigned targets.
        ``ec``: an EC group's table (needs replicas=1). None (Python callers only; the RPC always
        says): the recipe EC tables were made with before the flag, replicas=1 with
        targets_per_node > 0, is EC; anything else is not."""
        if replicas < 1:
            raise InvalidArgument("replicas must be >= 1")
        if ec is None:
            ec = replicas == 1 and targets_per_node > 0
        if ec and replicas != 1:
            raise InvalidArgument("an EC group's table has single-replica chains (replicas=1)")
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
        if targets_per_node > 0:  # e.g. an EC table: one single-replica chain per node
            free = {n: ts[:targets_per_node] for n, ts in free.items()}
        groups = plan_chains(free, replicas, {n: self.nodes[n].domain for n in free})
        if not groups:
            raise StatusError(
                Status.NO_CHAIN_TABLE,
                f"need {replicas} storage nodes with free targets, have {len(free)}",
            )
        table = TableRecord(table_id, replicas, ec=ec)
        next_chain = max([0, *self.chains]) + 1
        for group in groups:
            chain = ChainRecord(next_chain, table_id, group)
            self.chains[next_chain] = chain
            table.chain_ids.append(next_chain)
            for tid in group:
                self.targets[tid].chain_id = next_chain
                self.targets[tid].sync_done_version = 0
            next_chain += 1
        self.tables[table_id] = table
        logger.info("chain table %d: %d chains x %d replicas%s", table_id, len(groups), replicas,
                    " (EC group: lost targets are replaced by empty spares)" if ec else "")
        self._bump()
        return table

    def set_table_ec(self, table_id: int, ec: bool) -> bool:
        """Mark a table as an EC group's (or not). True if it changed; the caller saves the state.
        No chain moves here (the next tick acts on it, ``mgmtd.ec``), but routing carries the flag
        (``ChainTable.ec``: meta's EC rebuild and layout choice go by it): the version is bumped."""
        table = self.tables.get(table_id)
        if table is None:
            raise StatusError(Status.ENOENT, f"no chain table {table_id}")
        if ec and table.replicas != 1:
            raise InvalidArgument(f"chain table {table_id} has {table.replicas} replicas: an EC group's table has 1")
        if table.ec == ec:
            return False
        table.ec = ec
        self._bump()
        logger.warning("chain table %d marked %s", table_id,
                       "an EC group's table: a chain whose target is lost gets an empty spare" if ec
                       else "replicated: its chains wait for a member that holds their data")
        return True
