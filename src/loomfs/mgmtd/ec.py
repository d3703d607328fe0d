"""EC groups in mgmtd (no I/O): single-replica chains whose only target is lost get a spare.

Erasure-coded files keep their stripes' fragments on the ``chains`` of their layout, k+m
chains of a single-replica table on distinct nodes (``CreateChainTableReq(replicas=1,
targets_per_node=1, ec=True)``). Only a table created as an EC group's (``TableRecord.ec``) is
handled here: a replicated table with replicas=1 never gets an empty spare (its target may come
back with the data after a reboot; docs/fault-tolerance.md). Chain replication cannot rebuild such a chain (there is no other
replica to resync from), so the transition rules leave it LASTSRV when its target dies. Here,
once the target's node has been dead for ``replace_after_s`` (or at once when its target came
back with another disk: ``mgmtd.diskident``), the chain is handed an empty spare target,
SERVING at once (chain version + 1); the EC layer regenerates the lost fragments onto it from the other k+m-1 chains (``loomfs layout scrub --repair``, or any degraded read of a
stripe, which rewrites what it finds absent). The spare is taken from an alive storage node
that holds no chain of the same table if there is one (keeps the group's fragments on
distinct nodes), else from the least loaded node.
"""

from __future__ import annotations

import logging

from loomfs.mgmtd.state import ClusterState
from loomfs.wire.types import NodeKind, NodeState, TargetState

logger = logging.getLogger(__name__)


def replace_lost_ec_targets(state: ClusterState, now_s: float) -> list[tuple[int, int, int]]:
    """Swap spares into single-replica chains whose target's node is gone; returns
    (chain, old target, new target) per swap. The caller bumps the routing version."""
    if state.replace_after_s <= 0:
        return []
    swaps: list[tuple[int, int, int]] = []
    for chain in sorted(state.chains.values(), key=lambda c: c.chain_id):
        table = state.tables.get(chain.table_id)
        # only an EC group's table (TableRecord.ec): a replicated table with one replica (scratch
        # data, a one-node cluster) keeps its target, whose node may only be rebooting
        if table is None or not table.ec or table.replicas != 1 or len(chain.targets) != 1:
            continue
        old = state.targets[chain.targets[0]]
        node = state.nodes.get(old.node_id)
        if node is None:
            continue
        # a target back with another disk (mgmtd.diskident) lost the chain's fragments for good,
        # as a dead one did: swapped at once, so the chain's target id changes and meta's rebuild
        # worker (which watches for that) regenerates them; it becomes an ordinary spare
        if not old.blank:
            if node.state == NodeState.ALIVE or not node.last_heartbeat_s:
                continue
            if now_s - node.last_heartbeat_s < state.lease_s + state.replace_after_s:
                continue
        table_nodes = {state.targets[c.targets[0]].node_id for c in state.chains.values()
                       if c.table_id == chain.table_id and c.targets}
        load: dict[int, int] = {}
        for t in state.targets.values():
            if t.chain_id:
                load[t.node_id] = load.get(t.node_id, 0) + 1
        spares = [t for t in state.targets.values()
                  if t.chain_id == 0 and t.target_id != old.target_id
                  and (n := state.nodes.get(t.node_id)) is not None
                  and n.state == NodeState.ALIVE and n.kind == NodeKind.STORAGE and not n.draining]
        if not spares:  # (a blank target's chain serves nothing meanwhile: logged when it came back)
            continue
        spare = min(spares, key=lambda t: (t.node_id in table_nodes, load.get(t.node_id, 0), t.target_id))
        old.chain_id = 0
        was_blank, old.blank = old.blank, False
        old.state = TargetState.SERVING if was_blank and node.state == NodeState.ALIVE else TargetState.OFFLINE
        spare.chain_id = chain.chain_id
        old.sync_done_version = spare.sync_done_version = 0  # versions of another chain
        spare.state = TargetState.SERVING
        chain.targets = [spare.target_id]
        chain.version += 1
        swaps.append((chain.chain_id, old.target_id, spare.target_id))
        logger.info("chain %d v%d (single replica, EC): target %d %s node %d replaced by empty spare %d "
                    "on node %d; the EC layer rebuilds its fragments", chain.chain_id, chain.version,
                    old.target_id, "(disk replaced, empty) on" if was_blank else "on dead", old.node_id,
                    spare.target_id, spare.node_id)
    return swaps
