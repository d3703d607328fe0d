"""mgmtd RPC adapter: decode -> ClusterState -> persist -> encode."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from loomfs.common.clock import SYSTEM_CLOCK, Clock
from loomfs.mgmtd.ec import replace_lost_ec_targets
from loomfs.mgmtd.state import ClusterState
from loomfs.mgmtd.store import MgmtdStore
from loomfs.net.rpc import CallContext, handles
from loomfs.wire import mgmtd as w
from loomfs.wire.message import Empty
from loomfs.wire.types import ChainTable

logger = logging.getLogger(__name__)


class MgmtdService:
    def __init__(
        self,
        state: ClusterState,
        store: MgmtdStore | None,
        *,
        heartbeat_interval_s: float,
        clock: Clock = SYSTEM_CLOCK,
        probe: Callable[[str, int], Awaitable[bool]] | None = None,
    ):
        self.probe = probe  # can mgmtd itself reach host:port? (judges unreachability reports)
        self.state = state
        self.store = store
        self.heartbeat_interval_s = heartbeat_interval_s
        self.clock = clock
        self._saved_version = state.version

    def persist(self) -> None:
        if self.store is not None and self.state.version != self._saved_version:
            self.store.save(self.state)
            self._saved_version = self.state.version

    @handles(w.REGISTER_NODE)
    async def register_node(self, req: w.RegisterNodeReq, ctx: CallContext) -> w.RegisterNodeRsp:
        node_id = self.state.register(
            node_id=req.node_id, kind=req.kind, host=req.host, port=req.port,
            targets=req.targets, now_s=self.clock.monotonic(), metrics_port=req.metrics_port,
        )
        self.persist()
        return w.RegisterNodeRsp(
            node_id=node_id, lease_s=self.state.lease_s,
            heartbeat_interval_s=self.heartbeat_interval_s, routing_version=self.state.version,
            revoked_targets=self.state.revoked_targets(node_id),
        )

    @handles(w.HEARTBEAT)
    async def heartbeat(self, req: w.HeartbeatReq, ctx: CallContext) -> w.HeartbeatRsp:
        revoked = self.state.heartbeat(req.node_id, req.targets, self.clock.monotonic(),
                                       revoked_acked=req.revoked_targets, routing_version=req.routing_version)
        self.persist()
        return w.HeartbeatRsp(routing_version=self.state.version, lease_s=self.state.lease_s,
                              revoked_targets=revoked)

    @handles(w.GET_ROUTING)
    async def get_routing(self, req: w.GetRoutingReq, ctx: CallContext) -> w.GetRoutingRsp:
        if req.known_version == self.state.version:
            return w.GetRoutingRsp(changed=False)
        return w.GetRoutingRsp(changed=True, routing=self.state.routing())

    @handles(w.CREATE_CHAIN_TABLE)
    async def create_chain_table(self, req: w.CreateChainTableReq, ctx: CallContext) -> w.CreateChainTableRsp:
        t = self.state.create_chain_table(replicas=req.replicas, table_id=req.table_id,
                                          targets_per_node=req.targets_per_node)
        self.persist()
        return w.CreateChainTableRsp(
            table=ChainTable(table_id=t.table_id, version=t.version, replicas=t.replicas,
                             chain_ids=list(t.chain_ids))
        )

    @handles(w.SYNC_REPORT)
    async def sync_report(self, req: w.SyncReportReq, ctx: CallContext) -> w.SyncReportRsp:
        ok = self.state.sync_report(
            target_id=req.target_id, chain_id=req.chain_id, chain_version=req.chain_version,
            chunks_left=req.chunks_left, bytes_left=req.bytes_left, done=req.done, now_s=self.clock.monotonic(),
        )
        self.persist()
        return w.SyncReportRsp(accepted=ok, routing_version=self.state.version)

    @handles(w.DRAIN_NODE)
    async def drain_node(self, req: w.DrainReq, ctx: CallContext) -> w.DrainRsp:
        left = self.state.drain(req.node_id, undrain=req.undrain, now_s=self.clock.monotonic())
        self.persist()
        return w.DrainRsp(targets_to_move=left)

    @handles(w.REPORT_UNREACHABLE)
    async def report_unreachable(self, req: w.ReportUnreachableReq, ctx: CallContext) -> w.ReportUnreachableRsp:
        logger.info("node %d: target %d cannot reach target %d (chain %d v%d): %s", req.node_id, req.target_id,
                    req.suspect_target_id, req.chain_id, req.chain_version, req.reason)
        # recorded before the probe, so a report upstream of this one waits for its verdict
        current = self.state.note_report(
            reporter_node=req.node_id, reporter_target=req.target_id, suspect_target=req.suspect_target_id,
            chain_id=req.chain_id, chain_version=req.chain_version, now_s=self.clock.monotonic(),
        )  # stale: no probe needed
        reachable = False
        suspect = self.state.targets.get(req.suspect_target_id)
        node = self.state.nodes.get(suspect.node_id) if suspect is not None else None
        if current and node is not None and self.probe is not None:
            reachable = await self.probe(node.host, node.port)
        # 0 while the report is pending: tick() decides it once its settle window is over
        fenced = self.state.report_unreachable(
            reporter_node=req.node_id, reporter_target=req.target_id, suspect_target=req.suspect_target_id,
            chain_id=req.chain_id, chain_version=req.chain_version, suspect_reachable=reachable,
            now_s=self.clock.monotonic(),
        )
        self.persist()
        return w.ReportUnreachableRsp(fenced_target_id=fenced, routing_version=self.state.version)

    @handles(w.LIST_NODES)
    async def list_nodes(self, req: Empty, ctx: CallContext) -> w.ListNodesRsp:
        return w.ListNodesRsp(nodes=self.state.routing().nodes)

    @handles(w.MGMTD_PING)
    async def ping(self, req: Empty, ctx: CallContext) -> Empty:
        return Empty()

    def tick(self) -> None:
        changed = self.state.tick(self.clock.monotonic())
        if replace_lost_ec_targets(self.state, self.clock.monotonic()):  # EC chains: spares (loomfs.mgmtd.ec)
            self.state._bump()
            changed = True
        if changed:
            self.persist()

    def __repr__(self) -> str:
        return f"MgmtdService({self.state!r})"
