"""Unreachability reports and fencing (no I/O): ``FencingMixin``.

A chain member that cannot reach its successor although both heartbeat reports it. Reports
are judged by position, because one hung member makes every member upstream of it time out
too: in ``[H, M, T]`` with T hung, H reports M *and* M reports T, in either order. A report
is recorded per chain (``suspicions``: chain id -> reporter target -> ``Suspicion``), from
the moment it arrives (``note_report``, before mgmtd probes the suspect) until it is decided
or its chain version is gone. ``transitions.pick_suspicion`` picks the one to act on: only
the most downstream report of a chain; at once when mgmtd could not reach the suspect or the
suspect is the last member of the write path; otherwise after ``unreachable_settle_s``
(default half a lease), so a suspect that is only waiting for its own successor has time to
report it and move the blame downstream. ``report_unreachable`` decides what it can at once
and ``ClusterState.tick`` decides the rest (``_settle``), so a healthy middle is never fenced
for a hung tail. Acting fences one target per chain (``_fence``: the suspect, or a reporter
that keeps accusing reachable nodes; the hold doubles while fences repeat); the chain version
bumps and the remaining (upstream) reports are dropped as stale: their reporters report again
under the new version if their fault is still there. The decision depends only on the
reports, the probe results and ``now_s``.

A mixin of ``ClusterState`` (``mgmtd.state``), which sets the attributes declared here;
``_alive`` and ``reconcile`` are ``reconcile.ReconcileMixin``'s.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from loomfs.mgmtd.records import ChainRecord, NodeRecord, TargetRecord
from loomfs.mgmtd.transitions import Suspicion, pick_suspicion
from loomfs.wire.types import TargetState

logger = logging.getLogger(__name__)


class FencingMixin:
    lease_s: float
    unreachable_hold_s: float
    unreachable_settle_s: float
    suspicions: dict[int, dict[int, Suspicion]]
    nodes: dict[int, NodeRecord]
    targets: dict[int, TargetRecord]
    chains: dict[int, ChainRecord]

    if TYPE_CHECKING:
        def _alive(self, node_id: int) -> bool: ...
        def reconcile(self, now_s: float, *, bump: bool = True) -> bool: ...

    def note_report(self, *, reporter_node: int, reporter_target: int, suspect_target: int, chain_id: int,
                    chain_version: int, now_s: float) -> bool:
        """An unreachability report arrived; mgmtd is about to probe the suspect. Recorded
        already, so the settle window starts now and blame upstream of it waits for the probe.
        False: the report is stale or bogus (nothing to probe)."""
        if not self._report_valid(reporter_node, reporter_target, suspect_target, chain_id, chain_version):
            return False
        reports = self.suspicions.setdefault(chain_id, {})
        prev = reports.get(reporter_target)
        if prev is None or (prev.chain_version, prev.suspect_target) != (chain_version, suspect_target):
            reports[reporter_target] = Suspicion(reporter_node, reporter_target, suspect_target, chain_version, now_s)
        return True

    def report_unreachable(self, *, reporter_node: int, reporter_target: int, suspect_target: int,
                           chain_id: int, chain_version: int, suspect_reachable: bool, now_s: float) -> int:
        """A chain member could not reach its successor ``suspect_target`` although both
        still heartbeat (a network cut between them, a hung process, a bad NIC, or a death
        the lease has not noticed yet). ``suspect_reachable``: mgmtd itself just reached the
        suspect. Returns the target taken out of the chain now; 0 when nothing was done yet:
        the report is stale (ignored) or pending (``tick`` decides it, see the module doc).

        Taking a member out is always safe for consistency (the chain gets shorter; the
        target resyncs when it returns), so mgmtd acts without asking anyone else; *which*
        member goes is position-aware (``transitions.pick_suspicion``): a report about a
        suspect that mgmtd can reach and that has a successor waits ``unreachable_settle_s``
        for the suspect's own report, which moves the blame downstream. The blamed suspect
        leaves, unless mgmtd can reach it and the reporter has also accused another node that
        mgmtd could reach, within the window: then the reporter's own network is the likelier
        fault and the reporter leaves instead (only while the suspect serves, so the chain
        keeps a serving member). A fenced target stays out for ``unreachable_hold_s``
        (doubling while reports repeat); when it returns it rejoins at the tail and resyncs
        from the last serving member, so the chain routes around a cut that is still there."""
        if not self.note_report(reporter_node=reporter_node, reporter_target=reporter_target,
                                suspect_target=suspect_target, chain_id=chain_id, chain_version=chain_version,
                                now_s=now_s):
            return 0
        reports = self.suspicions[chain_id]
        noted = reports[reporter_target]
        if noted.suspect_reachable is None:
            reports[reporter_target] = Suspicion(reporter_node, reporter_target, suspect_target, chain_version,
                                                 noted.received_s, suspect_reachable)
        fenced = self._settle(chain_id, now_s)
        if fenced:
            self.reconcile(now_s)
        else:
            logger.info("chain %d v%d: target %d cannot reach target %d: pending (%d report(s) on the chain)",
                        chain_id, chain_version, reporter_target, suspect_target, len(reports))
        return fenced

    def _report_valid(self, reporter_node: int, reporter_target: int, suspect_target: int, chain_id: int,
                      chain_version: int) -> bool:
        """Current chain version, the reporter a serving member on ``reporter_node``, the
        suspect on the write path and alive (else the lease already handles it)."""
        chain = self.chains.get(chain_id)
        rep, sus = self.targets.get(reporter_target), self.targets.get(suspect_target)
        return chain is not None and chain.version == chain_version and rep is not None and sus is not None \
            and rep.node_id == reporter_node and rep.chain_id == chain_id and sus.chain_id == chain_id \
            and rep.state == TargetState.SERVING and sus.state in (TargetState.SERVING, TargetState.SYNCING) \
            and self._alive(sus.node_id)

    def _settle(self, chain_id: int, now_s: float) -> int:
        """Drop the chain's stale reports (and probes that never finished within a lease),
        then act on the report ``pick_suspicion`` picks, if any. Returns the fenced target
        (0: none); the caller reconciles."""
        reports = self.suspicions.get(chain_id, {})
        for r in list(reports.values()):
            lost_probe = r.suspect_reachable is None and now_s - r.received_s > self.lease_s
            if lost_probe or not self._report_valid(r.reporter_node, r.reporter_target, r.suspect_target,
                                                    chain_id, r.chain_version):
                del reports[r.reporter_target]
        chain = self.chains.get(chain_id)
        pick = None
        if reports and chain is not None:
            write_path = [t for t in chain.targets
                          if self.targets[t].state in (TargetState.SERVING, TargetState.SYNCING)]
            pick = pick_suspicion(write_path, reports.values(), now_s=now_s, settle_s=self.unreachable_settle_s)
        revoking = chain is not None and any(
            self.targets[t].revoke_deadline_s and not self.targets[t].revoke_version for t in chain.targets)
        if pick is not None and revoking and pick.suspect_reachable is not False:
            # a fence of this chain waits for its revocation, so the chain version has not moved
            # and upstream echoes of that fault still look current: wait for the bump
            return 0
        if pick is not None:
            del reports[pick.reporter_target]
            upstream = sorted(r.reporter_target for r in reports.values())
            if upstream:
                logger.info("chain %d v%d: reports by targets %s are upstream of target %d's report: not blaming "
                            "their successors", chain_id, pick.chain_version, upstream, pick.reporter_target)
            reports.clear()  # echoes of the same fault: their reporters report again if it persists
        if not reports:
            self.suspicions.pop(chain_id, None)
        return self._fence(pick, now_s) if pick is not None else 0

    def _fence(self, r: Suspicion, now_s: float) -> int:
        """Act on report ``r``: fence its suspect, or its reporter if the reporter keeps
        accusing nodes mgmtd can reach. Returns the fenced target."""
        rep, sus = self.targets[r.reporter_target], self.targets[r.suspect_target]
        node = self.nodes[r.reporter_node]
        window_s = 4 * self.unreachable_hold_s
        node.accusations = {n: t for n, t in node.accusations.items() if now_s - t <= window_s}
        others = [n for n in node.accusations if n != sus.node_id]
        blamed = sus
        if r.suspect_reachable:
            node.accusations[sus.node_id] = now_s
            if others and sus.state == TargetState.SERVING:
                blamed = rep
        if blamed.last_fence_s and now_s - blamed.last_fence_s > window_s:
            blamed.fence_count = 0
        blamed.fence_count += 1
        hold_s = self.unreachable_hold_s * 2 ** min(blamed.fence_count - 1, 6)
        blamed.fenced_until_s = now_s + hold_s
        blamed.last_fence_s = now_s
        logger.warning(
            "chain %d v%d: target %d (node %d) cannot reach target %d (node %d, %s from mgmtd, reported %.2fs ago)%s: "
            "fencing target %d for %.1fs", rep.chain_id, r.chain_version, r.reporter_target, r.reporter_node,
            r.suspect_target, sus.node_id, "reachable" if r.suspect_reachable else "unreachable",
            now_s - r.received_s, f"; the reporter also accused nodes {others}" if blamed is rep else "",
            blamed.target_id, hold_s)
        return blamed.target_id
