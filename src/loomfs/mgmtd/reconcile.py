"""Chain reconfiguration (no I/O): ``ReconcileMixin.reconcile`` applies the transition rules.

Target states follow 3FS (serving, syncing, waiting, lastsrv, offline); the per-chain rules
are the pure function ``transitions.plan_chain`` (table in docs/fault-tolerance.md). Every
event of ``ClusterState`` (registration, heartbeat of a returning node, lease expiry, sync
report, drain, fence) ends in ``reconcile``, which builds each chain's members from the records
(alive, fenced, failed, blank, draining...), applies the plan to every chain and bumps the chain
version and the routing version when anything changed.

A plan that takes a SERVING target of a live node out of service waits for its revocation
(``_revocation_holds``): the node is told to stop serving it (``revoked_targets``, listed in
heartbeat replies) and the plan applies once it said it did or its lease ran out. A mixin of
``ClusterState`` (``mgmtd.state``), which sets the attributes declared here; ``_bump`` is
``routing.RoutingMixin``'s.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from loomfs.mgmtd.records import ChainRecord, NodeRecord, TableRecord, TargetRecord
from loomfs.mgmtd.transitions import ChainPlan, Member, plan_chain
from loomfs.wire.types import NodeKind, NodeState, TargetState

logger = logging.getLogger(__name__)


class ReconcileMixin:
    lease_s: float
    replace_after_s: float
    version: int
    nodes: dict[int, NodeRecord]
    targets: dict[int, TargetRecord]
    chains: dict[int, ChainRecord]
    tables: dict[int, TableRecord]
    _now_s: float

    if TYPE_CHECKING:
        def _bump(self) -> None: ...

    def _alive(self, node_id: int) -> bool:
        n = self.nodes.get(node_id)
        return n is not None and n.state == NodeState.ALIVE

    def _usable(self, t: TargetRecord) -> bool:
        """Alive, not fenced off after an unreachability report, not failed (disk)."""
        return self._alive(t.node_id) and t.fenced_until_s <= self._now_s and not t.failed

    def _member(self, t: TargetRecord, chain: ChainRecord) -> Member:
        node = self.nodes.get(t.node_id)
        return Member(
            target_id=t.target_id, node_id=t.node_id, state=TargetState(t.state), alive=self._usable(t),
            restarted=t.restarted,
            sync_done=t.state == TargetState.SYNCING and t.sync_done_version == chain.version,
            offline_since_s=t.offline_since_s if t.state == TargetState.OFFLINE and t.offline_since_s else None,
            draining=node is not None and node.draining,
            fenced=self._alive(t.node_id) and t.fenced_until_s > self._now_s,
            failed=t.failed,
            domain=node.domain if node is not None else "",
            blank=t.blank,
        )

    def reconcile(self, now_s: float, *, bump: bool = True) -> bool:
        """Apply the transition rules to every chain. True if routing changed (then the
        routing version was bumped, unless ``bump=False``)."""
        changed = False
        self._now_s = now_s
        for t in self.targets.values():
            if t.fenced_until_s and t.fenced_until_s <= now_s:
                # ended: 0 in the store, or a restarted mgmtd (whose reload cannot compare the old
                # process's monotonic deadline) fences it again for a whole hold (sim seed 304678)
                t.fenced_until_s = 0.0
        for t in self.targets.values():  # spares follow their node
            if t.chain_id == 0:
                want = TargetState.SERVING if self._usable(t) else TargetState.OFFLINE
                if t.state != want:
                    t.state = want
                    changed = True
        load: dict[int, int] = {}
        for t in self.targets.values():
            if t.chain_id:
                load[t.node_id] = load.get(t.node_id, 0) + 1
        for chain in sorted(self.chains.values(), key=lambda c: c.chain_id):
            members = [self._member(self.targets[x], chain) for x in chain.targets]
            spares = [self._member(t, chain) for t in sorted(self.targets.values(), key=lambda t: t.target_id)
                      if t.chain_id == 0 and self.nodes.get(t.node_id) is not None
                      and self.nodes[t.node_id].kind == NodeKind.STORAGE]
            table = self.tables.get(chain.table_id)
            plan = plan_chain(members, spares=spares, replicas=table.replicas if table else 0, now_s=now_s,
                              replace_after_s=self.replace_after_s, node_load=load)
            if self._revocation_holds(chain, plan, now_s):
                continue
            for x in chain.targets:
                self.targets[x].restarted = False
            for tid in plan.removed:
                tr = self.targets[tid]
                tr.chain_id = 0
                tr.blank = False  # a spare holds no chain's data; joining one always resyncs
                # a version of this chain: it must not count as a resync done in the next chain
                # the target joins, whose versions are numbered on their own (sim seed 303012)
                tr.sync_done_version = 0
                tr.state = TargetState.SERVING if self._usable(tr) else TargetState.OFFLINE
                load[tr.node_id] = load.get(tr.node_id, 1) - 1
            for tid in plan.added:
                self.targets[tid].chain_id = chain.chain_id
                self.targets[tid].sync_done_version = 0
                load[self.targets[tid].node_id] = load.get(self.targets[tid].node_id, 0) + 1
            states_changed = False
            for m in plan.members:
                tr = self.targets[m.target_id]
                if tr.state != m.state:
                    states_changed = True
                    tr.state = m.state
                    tr.offline_since_s = now_s if m.state == TargetState.OFFLINE else 0.0
                if tr.blank and not m.blank:  # (only by a finished resync)
                    tr.blank = False
                    logger.info("target %d: resynced into chain %d after its disk was replaced", tr.target_id,
                                chain.chain_id)
                if tr.state != TargetState.SYNCING:
                    tr.sync_chunks_left = tr.sync_bytes_left = 0
            if states_changed or plan.targets() != chain.targets:
                chain.targets = plan.targets()
                chain.version += 1
                changed = True
                for why in plan.reasons:
                    logger.info("chain %d v%d: %s", chain.chain_id, chain.version, why)
        if changed and bump:
            self._bump()
        return changed

    def revoked_targets(self, node_id: int) -> list[int]:
        """Targets of ``node_id`` it must not serve now: leaving their chain (revoked), or of a
        restarted process whose chain change is not published yet (another member's revocation
        holds it): serving them from the old routing would reuse version numbers the process
        lost with its pending updates."""
        return sorted(t.target_id for t in self.targets.values()
                      if t.node_id == node_id and (t.revoke_deadline_s or (t.restarted and t.chain_id)))

    def _revocation_holds(self, chain: ChainRecord, plan: ChainPlan, now_s: float) -> bool:
        """Whether ``plan`` must wait: it takes a SERVING target of a live node out of service,
        and that node may still serve reads under the lease it holds (with routing that says
        the target is the tail, while the new tail commits newer versions). The node is told
        to stop (heartbeat replies list the target) and the plan applies once it said it did,
        or once the lease granted before the revocation has run out."""
        after = {m.target_id: m.state for m in plan.members}
        held = False
        for x in chain.targets:
            t = self.targets[x]
            # (a failed target's node has stopped serving it already: nothing to revoke)
            leaving = t.state == TargetState.SERVING and after.get(x) != TargetState.SERVING \
                and not t.restarted and not t.failed and self._alive(t.node_id)
            if not leaving:
                if t.revoke_deadline_s and not t.revoke_version:
                    t.revoke_deadline_s, t.revoke_acked = 0.0, False  # not leaving after all
                continue
            if not t.revoke_deadline_s:
                t.revoke_deadline_s = self.nodes[t.node_id].last_heartbeat_s + self.lease_s
                t.revoke_acked = False
                logger.info("chain %d v%d: target %d leaves while its node %d is alive: revoking it first "
                            "(at most %.2fs)", chain.chain_id, chain.version, x, t.node_id,
                            max(0.0, t.revoke_deadline_s - now_s))
            if not (t.revoke_acked or now_s >= t.revoke_deadline_s):
                held = True
        if not held:
            for x in chain.targets:
                t = self.targets[x]
                if t.revoke_deadline_s and not t.revoke_version:
                    t.revoke_version = self.version + 1  # the bump that publishes this change
        return held
