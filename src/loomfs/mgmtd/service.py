"""mgmtd RPC adapter: decode -> ClusterState -> persist -> encode.

Single mgmtd (``election=None``): the store is ``MgmtdStore`` (SQLite), saved synchronously.
Several mgmtd (``election`` and ``ha_store`` given, docs/mgmtd-ha.md): only the primary
answers; every other request gets ``NOT_PRIMARY`` with the primary's address when known
(``not_primary_message``). Each request runs its state change and its save under one lock,
so nobody is answered with a routing version the store does not hold yet; a save the store
refuses (the lease is gone) or cannot take ends this process's term at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from loomfs.common.clock import SYSTEM_CLOCK, Clock
from loomfs.errors import InvalidArgument, StatusError
from loomfs.mgmtd.diskident import accept_chain_loss
from loomfs.mgmtd.ec import replace_lost_ec_targets
from loomfs.mgmtd.lease import Election, HaStore
from loomfs.mgmtd.state import ClusterState
from loomfs.mgmtd.store import MgmtdStore
from loomfs.net.rpc import CallContext, handles
from loomfs.wire import mgmtd as w
from loomfs.wire.message import Empty
from loomfs.wire.status import Status
from loomfs.wire.types import ChainTable

logger = logging.getLogger(__name__)

PRIMARY_HINT = "primary="  # NOT_PRIMARY messages: "not primary; primary=HOST:PORT"


def not_primary_message(primary: str) -> str:
    return f"not primary; {PRIMARY_HINT}{primary}" if primary else "not primary; primary unknown"


class MgmtdService:
    def __init__(
        self,
        state: ClusterState,
        store: MgmtdStore | None,
        *,
        heartbeat_interval_s: float,
        clock: Clock = SYSTEM_CLOCK,
        probe: Callable[[str, int], Awaitable[bool]] | None = None,
        election: Election | None = None,
        ha_store: HaStore | None = None,
    ):
        if (election is None) != (ha_store is None):
            raise ValueError("election and ha_store come together")
        self.election = election
        self.ha_store = ha_store
        self.loaded_term = 0  # the election term whose state this process holds (HA)
        self._lock = asyncio.Lock()
        self.probe = probe  # can mgmtd itself reach host:port? (judges unreachability reports)
        self.state = state
        self.store = store
        self.heartbeat_interval_s = heartbeat_interval_s
        self.clock = clock
        self._saved_version = state.version

    def persist(self, *, force: bool = False) -> None:
        if self.store is not None and (force or self.state.version != self._saved_version):
            self.store.save(self.state)
            self._saved_version = self.state.version

    # ---- HA: who answers, and conditional saves ------------------------------------------
    @property
    def serving(self) -> bool:
        e = self.election
        return e is None or (e.is_primary and self.loaded_term == e.term)

    def _guard(self) -> None:
        if not self.serving:
            assert self.election is not None
            raise StatusError(Status.NOT_PRIMARY, not_primary_message(self.election.hint()))

    def _stand_down(self, why: str) -> None:
        assert self.election is not None
        logger.warning("mgmtd %s stands down: %s", self.election.address, why)
        self.election.lost()
        self.loaded_term = 0
        self.state.clear()  # what was not saved must not be served: the next term loads the store
        self._saved_version = self.state.version

    async def _commit(self, *, force: bool = False) -> None:
        """Save the state if its version moved (``force``: a change that does not touch routing,
        such as a revoked token). HA: a conditional save; refused, this process stands down."""
        if self.election is None:
            self.persist(force=force)
            return
        assert self.ha_store is not None
        if not force and self.state.version == self._saved_version:
            return
        try:
            ok = await self.ha_store.save(self.state, self.election.holder)
        except OSError as exc:
            self._stand_down(f"save failed: {exc}")
            raise StatusError(Status.NOT_PRIMARY, not_primary_message("")) from exc
        if not ok:
            self._stand_down("the store refused the save: the lease is gone")
            raise StatusError(Status.NOT_PRIMARY, not_primary_message(""))
        self._saved_version = self.state.version

    async def take_over(self) -> None:
        """The election was just won (a new term): load the state from the store (its version
        comes back bumped) and save it at once, so the bumped version is the durable one."""
        e, store = self.election, self.ha_store
        assert e is not None and store is not None
        async with self._lock:
            term = e.term
            self.state.clear()
            try:
                await store.load(self.state, self.clock.monotonic())
            except OSError as exc:
                self._stand_down(f"load failed: {exc}")
                return
            self._saved_version = -1
            try:
                await self._commit()
            except StatusError:
                return
            self.loaded_term = term
            logger.info("mgmtd %s took over: %r", e.address, self.state)

    async def tick_ha(self) -> None:
        async with self._lock:
            if not self.serving:
                return
            self.tick()
            try:
                await self._commit()
            except StatusError:
                pass

    @handles(w.REGISTER_NODE)
    async def register_node(self, req: w.RegisterNodeReq, ctx: CallContext) -> w.RegisterNodeRsp:
        async with self._lock:
            self._guard()
            node_id = self.state.register(
                node_id=req.node_id, kind=req.kind, host=req.host, port=req.port,
                targets=req.targets, now_s=self.clock.monotonic(), metrics_port=req.metrics_port,
                domain=req.domain, formats=req.target_formats,
            )
            await self._commit()
            return self._registered(node_id)

    def _registered(self, node_id: int) -> w.RegisterNodeRsp:
        return w.RegisterNodeRsp(
            node_id=node_id, lease_s=self.state.lease_s,
            heartbeat_interval_s=self.heartbeat_interval_s, routing_version=self.state.version,
            revoked_targets=self.state.revoked_targets(node_id),
            verify_targets=self.state.verify_targets(node_id),
        )

    @handles(w.HEARTBEAT)
    async def heartbeat(self, req: w.HeartbeatReq, ctx: CallContext) -> w.HeartbeatRsp:
        async with self._lock:
            self._guard()
            revoked = self.state.heartbeat(req.node_id, req.targets, self.clock.monotonic(),
                                           revoked_acked=req.revoked_targets, routing_version=req.routing_version,
                                           formats=req.target_formats)
            await self._commit()
            return w.HeartbeatRsp(routing_version=self.state.version, lease_s=self.state.lease_s,
                                  revoked_targets=revoked, verify_targets=self.state.verify_targets(req.node_id))

    @handles(w.GET_ROUTING)
    async def get_routing(self, req: w.GetRoutingReq, ctx: CallContext) -> w.GetRoutingRsp:
        async with self._lock:  # never a version the store does not hold yet
            self._guard()
            if req.known_version == self.state.version:
                return w.GetRoutingRsp(changed=False)
            return w.GetRoutingRsp(changed=True, routing=self.state.routing())

    @handles(w.CREATE_CHAIN_TABLE)
    async def create_chain_table(self, req: w.CreateChainTableReq, ctx: CallContext) -> w.CreateChainTableRsp:
        async with self._lock:
            self._guard()
            t = self.state.create_chain_table(replicas=req.replicas, table_id=req.table_id,
                                              targets_per_node=req.targets_per_node, ec=req.ec)
            await self._commit()
        return w.CreateChainTableRsp(
            table=ChainTable(table_id=t.table_id, version=t.version, replicas=t.replicas,
                             chain_ids=list(t.chain_ids), ec=t.ec)
        )

    @handles(w.SET_TABLE_EC)
    async def set_table_ec(self, req: w.SetTableEcReq, ctx: CallContext) -> w.SetTableEcRsp:
        if not req.confirm:
            raise InvalidArgument("set_table_ec needs confirm=True: marked EC, a single-replica chain whose target "
                                  "is lost gets an empty spare (its data is rebuilt only by the EC layer)")
        async with self._lock:
            self._guard()
            changed = self.state.set_table_ec(req.table_id, req.ec)
            await self._commit(force=changed)
        return w.SetTableEcRsp(table_id=req.table_id, ec=req.ec, changed=changed)

    @handles(w.ACCEPT_CHAIN_LOSS)
    async def accept_chain_loss(self, req: w.AcceptChainLossReq, ctx: CallContext) -> w.AcceptChainLossRsp:
        if not req.confirm:
            raise InvalidArgument("accept_chain_loss needs confirm=True: the chain's data is given up for good")
        async with self._lock:
            self._guard()
            target, given_up = accept_chain_loss(self.state, req.chain_id, self.clock.monotonic(),
                                                 give_up_dead=req.give_up_dead)
            await self._commit(force=True)
            chain = self.state.chains[req.chain_id]
            return w.AcceptChainLossRsp(target_id=target, given_up=given_up, chain_version=chain.version,
                                        routing_version=self.state.version,
                                        accepted_losses=self.state.accepted_losses)

    @handles(w.SYNC_REPORT)
    async def sync_report(self, req: w.SyncReportReq, ctx: CallContext) -> w.SyncReportRsp:
        async with self._lock:
            self._guard()
            ok = self.state.sync_report(
                target_id=req.target_id, chain_id=req.chain_id, chain_version=req.chain_version,
                chunks_left=req.chunks_left, bytes_left=req.bytes_left, done=req.done,
                now_s=self.clock.monotonic(),
            )
            # an accepted "done" is saved even when routing did not move (another member's
            # revocation holds the chain): the node never reports it again, so a restart that
            # lost it left the target syncing forever (simulator seed 227006)
            await self._commit(force=ok and req.done)
            return w.SyncReportRsp(accepted=ok, routing_version=self.state.version)

    @handles(w.DRAIN_NODE)
    async def drain_node(self, req: w.DrainReq, ctx: CallContext) -> w.DrainRsp:
        async with self._lock:
            self._guard()
            left = self.state.drain(req.node_id, undrain=req.undrain, now_s=self.clock.monotonic())
            await self._commit()
        return w.DrainRsp(targets_to_move=left)

    @handles(w.REPORT_UNREACHABLE)
    async def report_unreachable(self, req: w.ReportUnreachableReq, ctx: CallContext) -> w.ReportUnreachableRsp:
        logger.info("node %d: target %d cannot reach target %d (chain %d v%d): %s", req.node_id, req.target_id,
                    req.suspect_target_id, req.chain_id, req.chain_version, req.reason)
        async with self._lock:
            self._guard()
            # recorded before the probe, so a report upstream of this one waits for its verdict
            current = self.state.note_report(
                reporter_node=req.node_id, reporter_target=req.target_id, suspect_target=req.suspect_target_id,
                chain_id=req.chain_id, chain_version=req.chain_version, now_s=self.clock.monotonic(),
            )  # stale: no probe needed
            suspect = self.state.targets.get(req.suspect_target_id)
            node = self.state.nodes.get(suspect.node_id) if suspect is not None else None
        reachable = False
        if current and node is not None and self.probe is not None:  # not under the lock: it waits
            reachable = await self.probe(node.host, node.port)
        async with self._lock:
            self._guard()
            # 0 while the report is pending: tick() decides it once its settle window is over
            fenced = self.state.report_unreachable(
                reporter_node=req.node_id, reporter_target=req.target_id, suspect_target=req.suspect_target_id,
                chain_id=req.chain_id, chain_version=req.chain_version, suspect_reachable=reachable,
                now_s=self.clock.monotonic(),
            )
            await self._commit()
            return w.ReportUnreachableRsp(fenced_target_id=fenced, routing_version=self.state.version)

    @handles(w.LIST_NODES)
    async def list_nodes(self, req: Empty, ctx: CallContext) -> w.ListNodesRsp:
        async with self._lock:
            self._guard()
            return w.ListNodesRsp(nodes=self.state.routing().nodes)

    @handles(w.MGMTD_PING)
    async def ping(self, req: Empty, ctx: CallContext) -> Empty:
        self._guard()
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
