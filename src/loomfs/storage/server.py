"""The storage process: engines per target, RPC server, mgmtd registration and heartbeats.

``python -m loomfs.storage.server --config storage.toml``
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
from pathlib import Path
from typing import Any

from loomfs.common.clock import SYSTEM_CLOCK, Clock
from loomfs.common.retry import Backoff
from loomfs.common.routing import RoutingClient, parse_addresses
from loomfs.common.service_main import run_service
from loomfs.config import StorageConfig
from loomfs.errors import LoomError
from loomfs.net.rpc import RetryPolicy, RpcClient, RpcServer
from loomfs.net.tcp import default_transport
from loomfs.net.transport import Address, Transport
from loomfs.storage import diskident, planted
from loomfs.storage.chain import Position
from loomfs.storage.engine.file import FileEngine
from loomfs.storage.grantcheck import GrantCheck, ReadGrantCheck
from loomfs.storage.resync import Resyncer
from loomfs.storage.scrub import Scrubber
from loomfs.storage.service import StorageService
from loomfs.storage.target import StorageTarget, target_id_for
from loomfs.storage.tenantcheck import TenantCheck
from loomfs.wire.message import Empty, Message, Method
from loomfs.wire.meta import TENANT_LIST
from loomfs.wire.mgmtd import (
    HEARTBEAT,
    REGISTER_NODE,
    REPORT_UNREACHABLE,
    SYNC_REPORT,
    HeartbeatReq,
    RegisterNodeReq,
    RegisterNodeRsp,
    ReportUnreachableReq,
    SyncReportReq,
)
from loomfs.wire.status import Status
from loomfs.wire.types import NodeKind, TargetState

logger = logging.getLogger(__name__)

REGISTER_BACKOFF = Backoff(0.1, 1.0)  # registration retried until mgmtd answers


def target_dirs(config: StorageConfig) -> list[Path]:
    names = config.targets or ["target0"]
    return [p if (p := Path(t)).is_absolute() else Path(config.data_dir, t) for t in names]


def open_targets(config: StorageConfig) -> list[StorageTarget]:
    targets = []
    seen: dict[Path, int] = {}
    for i, path in enumerate(target_dirs(config)):
        path.mkdir(parents=True, exist_ok=True)
        tid = target_id_for(config.node_id, i)
        other = seen.setdefault(path.resolve(), tid)
        if other != tid:  # two targets, one directory: one copy counted twice
            raise diskident.TargetDirError(f"targets {other} and {tid} share directory {path.resolve()}")
        format_id, fresh = diskident.load_or_create(path, tid)  # before the engine fills the directory
        engine = FileEngine(path, fsync_on_commit=config.fsync_on_commit)
        targets.append(StorageTarget(tid, engine, str(path.resolve()),
                                     format_id=format_id, formatted_now=fresh))
    return targets


class StorageNode:
    """Everything one storage process runs; ``start()`` then ``run_until(stop_event)``."""

    def __init__(
        self,
        config: StorageConfig,
        *,
        transport: Transport | None = None,
        targets: list[StorageTarget] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
    ):
        """``transport``, ``targets``, ``clock`` and ``rng`` are seams for the simulator (the
        defaults: TCP, file engines under ``config.data_dir``, the system clock)."""
        self.config = config
        self.clock = clock
        self.metrics: Any = None  # loomfs.metrics.ServiceMetrics once started
        rpc_cfg = config.rpc
        transport = transport or default_transport(max_payload_bytes=rpc_cfg.max_payload_bytes)
        self.rpc = RpcClient(
            transport,
            connect_timeout_s=rpc_cfg.connect_timeout_s,
            call_timeout_s=rpc_cfg.call_timeout_s,
            retry=RetryPolicy(attempts_max=rpc_cfg.retry_attempts_max),
            rng=rng,
        )
        self.mgmtd = parse_addresses(config.mgmtd)
        self.routing = RoutingClient(self.rpc, self.mgmtd)
        self.targets = targets if targets is not None else open_targets(config)
        self.service = StorageService(
            self.targets, self.routing, self.rpc, max_chunk_size_bytes=config.max_chunk_size_bytes,
            forward_timeout_s=rpc_cfg.call_timeout_s, target_capacity_bytes=config.target_capacity_bytes,
            suspect_after_s=config.suspect_after_s, report_unreachable=self._report_unreachable,
            clock=clock,
        )
        self.service.writable_until_s = 0.0  # not writable before mgmtd granted a lease
        self.service.readable_until_s = 0.0
        self.service.ready = False  # nothing served before registration (a restart resyncs first)
        self.resyncer = Resyncer(self.service, self._report_sync, bytes_per_s=config.resync_bytes_per_s)
        self.scrubber = Scrubber(self.service, bytes_per_s=config.scrub_bytes_per_s,
                                 interval_s=config.scrub_interval_s,
                                 first_pass_after_s=config.scrub_first_pass_after_s)
        self.service.on_corrupt = self.scrubber.check_soon
        self.service.on_target_failed = self._target_failed
        self._loop: asyncio.AbstractEventLoop | None = None
        self._failure_beats: set[asyncio.Task[None]] = set()
        self.service.scrub_stats = self.scrubber.target_stats
        self.server = RpcServer(f"storage{config.node_id}", transport)
        auth = transport.auth
        self.service.grant_check = GrantCheck(auth.grant_key() if auth is not None else None,
                                              required=config.write_grants_required)
        self.service.tenant_check = TenantCheck(self._tenant_number)
        # read grants: present ones always checked; missing ones refused once required
        self.service.read_grants = ReadGrantCheck(auth.read_grant_key() if auth is not None else None,
                                                  required=bool(getattr(config, "read_grants_required", False)))
        self.server.add_service(self.service)
        self.heartbeat_interval_s = 1.0
        self.lease_s = 5.0
        self._settling: asyncio.Future[None] | None = None
        self._ready_at_version = 0  # the routing version registration produced
        # targets with committed chunks when this process started (a restart: pending versions lost)
        self._had_data = {t.target_id for t in self.targets if t.engine.usage().chunk_count > 0}
        self._settle_again = False

    async def start(self) -> Address:
        self._loop = asyncio.get_running_loop()
        address = await self.server.start(Address(self.config.host, self.config.port))
        if self.config.metrics_port >= 0:
            from loomfs.metrics import StorageCollector, instrument_engines, start_service_metrics

            self.metrics = await start_service_metrics(
                f"storage{self.config.node_id}", self.server, self.rpc, port=self.config.metrics_port,
                host=self.config.host, collectors=[StorageCollector(self.service, self.config.node_id)],
            )
            instrument_engines(self.targets, self.metrics.registry)
        return address

    def _lease_granted(self, sent_s: float, lease_s: float, routing_version: int) -> None:
        """mgmtd answered a registration or heartbeat sent at ``sent_s``. The lease counts only
        once this node serves by the routing of that answer (fetched before this is called):
        with a fresh lease and old routing, a replica mgmtd has taken out of its chain (after a
        pause, a cut) would still serve reads as the tail while the new tail commits."""
        self.lease_s = lease_s or self.lease_s
        if not (self.routing.has_routing and self.routing.current.version >= routing_version) \
                and not planted.on("reads_ignore_lease"):
            logger.warning("routing v%d not fetched yet: lease not extended", routing_version)
            return
        self.service.lease_granted(sent_s, self.lease_s)

    async def _tenant_number(self, name: str) -> int | None:
        """Tenant ``name``'s number, asked of a meta server (as a service: TENANT_LIST needs
        ADMIN); None when meta knows no such tenant. Every tenant listed is remembered."""
        routing = await self.routing.get()
        if not routing.alive_nodes(NodeKind.META):  # ours may predate the meta servers' registration
            routing = await self.routing.refresh()
        last: BaseException | None = None
        for node in routing.alive_nodes(NodeKind.META):
            try:
                rsp = (await self.rpc.call(Address(node.host, node.port), TENANT_LIST, Empty(), timeout_s=5.0)).body
            except (LoomError, OSError) as exc:
                last = exc
                continue
            for t in rsp.tenants:
                self.service.tenant_check.numbers.setdefault(t.name, t.number)
            return next((t.number for t in rsp.tenants if t.name == name), None)
        raise last if last is not None else ConnectionError("no meta server in routing")

    async def _call_mgmtd(self, m: Method, req: Message) -> Any:
        """One call to the primary mgmtd (``MgmtdSet``: followed on NOT_PRIMARY or a dead
        connection); the reply's routing version is fetched."""
        rsp = (await self.routing.mgmtd_set.call(m, req, timeout_s=5.0)).body
        await self._refresh_routing(rsp.routing_version)
        return rsp

    async def _report_sync(self, req: SyncReportReq) -> bool:
        return bool((await self._call_mgmtd(SYNC_REPORT, req)).accepted)

    async def _report_unreachable(self, pos: Position, successor: int, why: str) -> None:
        req = ReportUnreachableReq(node_id=self.config.node_id, target_id=pos.target_id,
                                   suspect_target_id=successor, chain_id=pos.chain_id,
                                   chain_version=pos.chain_version, reason=why)
        rsp = await self._call_mgmtd(REPORT_UNREACHABLE, req)
        if rsp.fenced_target_id:
            logger.warning("mgmtd fenced target %d (chain %d)", rsp.fenced_target_id, pos.chain_id)

    async def register(self) -> RegisterNodeRsp:
        req = RegisterNodeReq(
            node_id=self.config.node_id, kind=NodeKind.STORAGE, host=self.config.host,
            port=self.server.address.port, targets=self.service.target_infos(self.config.node_id),
            metrics_port=self.metrics.port if self.metrics is not None else 0, domain=self.config.domain,
            target_formats=diskident.target_formats(self.targets),
        )
        attempt = 0
        mgmtd = self.routing.mgmtd_set
        while True:
            sent_s = self.clock.monotonic()
            try:
                rsp: RegisterNodeRsp = (await mgmtd.call(REGISTER_NODE, req, timeout_s=5.0)).body
            except (LoomError, OSError) as exc:
                if attempt % 20 == 0:
                    logger.warning("register with mgmtd %s failed (will retry): %s", mgmtd, exc)
                await asyncio.sleep(REGISTER_BACKOFF.delay_s(attempt))
                attempt += 1
                continue
            logger.info("registered node %d with mgmtd %s (%d targets)", self.config.node_id, mgmtd.primary,
                        len(self.targets))
            self.heartbeat_interval_s = rsp.heartbeat_interval_s or self.heartbeat_interval_s
            self.service.revoked = set(rsp.revoked_targets)
            self._verify_for_mgmtd(rsp.verify_targets)
            await self._refresh_routing(rsp.routing_version)
            self._lease_granted(sent_s, rsp.lease_s, rsp.routing_version)
            # serve only with the routing this registration produced (mgmtd has moved a
            # restarted target to the tail of its chain, to be resynced)
            self._ready_at_version = rsp.routing_version
            self._gap_if_serving_after_restart()
            self._mark_ready()
            self._repair_suspects()
            return rsp

    def _verify_for_mgmtd(self, target_ids: list[int]) -> None:
        """mgmtd saw these targets fail (a failed fsync) and this process has not verified them
        (their FSYNC_FAILED marker never reached the failing disk): verify them now, as the
        marker would have made the engine do at start-up. Each is reported OFFLINE meanwhile and
        ``verified`` after; mgmtd keeps it out of its chain until then (reviewer's R5)."""
        for tid in target_ids:
            target = self.service.targets.get(tid)
            if target is None or target.failed or target.engine.verified:
                continue  # failed in this process, already verifying, or verified: nothing new
            logger.warning("target %d: mgmtd saw it fail and it was not verified since: verifying it", tid)
            target.engine.start_verification()
            if not target.failed:  # verified at once (an engine without a disk cache)
                logger.info("target %d verified: %d chunks to repair", tid, len(target.engine.suspect_chunks))

    def _repair_suspects(self) -> None:
        """Chunks a target's verification after a failed fsync found not matching their rows
        (engine.diskfail): the scrubber repairs each from a replica holding that version."""
        for t in self.targets:
            if t.failed:
                continue  # still verifying (or failed): its suspects wait
            suspects: list[Any] = getattr(t.engine, "suspect_chunks", [])
            for key in suspects:
                self.scrubber.check_soon(t, key)
            if suspects:
                logger.warning("target %d: %d chunks failed verification: repairing them from the chain",
                               t.target_id, len(suspects))
            suspects.clear()

    def _gap_if_serving_after_restart(self) -> None:
        """A target that held data when this process started lost its pending versions with
        the last process. mgmtd sends it to resync when another member serves; when it is left
        serving (no one to resync from), a successor may hold committed a version it lost, so
        its first update of each chunk as head leaves one version number unused."""
        if not self.routing.has_routing:
            return
        r = self.routing.current
        for tid in self._had_data:
            ti = r.targets.get(tid)
            # (last serving: it becomes serving again without a resync once its node is back)
            if ti is not None and ti.chain_id and ti.state in (TargetState.SERVING, TargetState.LASTSRV) \
                    and tid not in self.service._gapped:
                logger.warning("target %d kept serving after a restart: first updates leave a version unused", tid)
                self.service._gapped[tid] = set()

    async def _refresh_routing(self, version: int) -> None:
        if self.routing.has_routing and self.routing.current.version >= version:
            return
        try:
            r = await self.routing.refresh()
            logger.info("routing v%d: %d chains", r.version, len(r.chains))
        except (LoomError, OSError) as exc:
            logger.warning("routing refresh failed: %s", exc)
            return
        self.resyncer.update(r)
        self._mark_ready()
        self._settle_soon()

    def _mark_ready(self) -> None:
        if self._ready_at_version and self.routing.has_routing and \
                self.routing.current.version >= self._ready_at_version:
            self.service.ready = True

    async def _heartbeat_once(self) -> None:
        req = HeartbeatReq(node_id=self.config.node_id, targets=self.service.target_infos(self.config.node_id),
                           revoked_targets=sorted(self.service.revoked),
                           routing_version=self.routing.current.version if self.routing.has_routing else 0,
                           target_formats=diskident.target_formats(self.targets))
        mgmtd = self.routing.mgmtd_set
        sent_s = self.clock.monotonic()
        try:
            rsp = (await mgmtd.call(HEARTBEAT, req, timeout_s=max(1.0, self.heartbeat_interval_s),
                                    retry=False)).body
        except (LoomError, OSError) as exc:
            if isinstance(exc, LoomError) and exc.status is Status.ENOENT:  # mgmtd lost us (fresh store)
                logger.warning("mgmtd %s does not know node %d: registering again", mgmtd.primary,
                               self.config.node_id)
                await self.register()
                return
            logger.debug("heartbeat to %s failed: %s", mgmtd, exc)
            if self.clock.monotonic() > self.service.writable_until_s:
                logger.warning("no mgmtd reachable for %.1fs: refusing writes", self.lease_s / 2)
            return
        if set(rsp.revoked_targets) != self.service.revoked:
            logger.info("mgmtd revoked targets %s", rsp.revoked_targets)
        self.service.revoked = set(rsp.revoked_targets)  # before the lease is extended
        self._verify_for_mgmtd(rsp.verify_targets)  # (a registration reply that did not ask)
        await self._refresh_routing(rsp.routing_version)
        self._lease_granted(sent_s, rsp.lease_s, rsp.routing_version)
        if self.routing.has_routing:
            self.resyncer.update(self.routing.current)  # restarts failed resyncs
        if self.service.has_leftovers:
            self._settle_soon()  # retries what the last chain change could not settle
        self._repair_suspects()  # a verification after a failed fsync may have ended since

    def _target_failed(self, target_id: int, why: str) -> None:
        """A failed fsync took a target out of service (any thread): heartbeat now, so mgmtd
        takes it out of its chain at once (the heartbeat says OFFLINE for it)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is loop:
            self._heartbeat_now()
        else:
            loop.call_soon_threadsafe(self._heartbeat_now)

    def _heartbeat_now(self) -> None:
        if not self._ready_at_version:
            return  # not registered yet: the registration reports the target
        task = asyncio.ensure_future(self._heartbeat_once())
        self._failure_beats.add(task)
        task.add_done_callback(self._failure_beats.discard)

    def _settle_soon(self) -> None:
        """A chain changed: push leftover pending versions down (one task at a time)."""
        if self._settling is not None and not self._settling.done():
            self._settle_again = True
            return
        self._settle_again = False

        async def settle() -> None:
            while True:
                await self.service.settle_leftovers()
                if not self._settle_again:
                    return
                self._settle_again = False

        self._settling = asyncio.ensure_future(settle())

    async def heartbeat_loop(self) -> None:
        """Heartbeat until cancelled. Nothing else ends it: a node whose heartbeats stop drops
        out of its chains for good, so an unexpected error is logged and the loop goes on."""
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            try:
                await self._heartbeat_once()
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                logger.error("heartbeat: a call it waited on was cancelled; going on")
            except Exception:
                logger.exception("heartbeat failed unexpectedly; going on")

    async def close(self) -> None:
        for beat in list(self._failure_beats):
            beat.cancel()
        if self._settling is not None:
            self._settling.cancel()
            await asyncio.gather(self._settling, return_exceptions=True)
        if self.metrics is not None:
            await self.metrics.close()
        await self.resyncer.close()
        await self.scrubber.close()
        await self.server.close()
        await self.rpc.close()
        for t in self.targets:
            t.engine.close()

    def __repr__(self) -> str:
        return f"StorageNode({self.config.node_id} {self.service!r})"


async def serve(config: StorageConfig, stop: asyncio.Event | None = None) -> None:
    """Run a storage node until ``stop`` is set (or SIGTERM/SIGINT)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    node = StorageNode(config)
    address = await node.start()
    logger.info("storage node %d serving %d targets on %s", config.node_id, len(node.targets), address)
    tasks: list[asyncio.Task[object]] = []
    try:
        registered = asyncio.ensure_future(node.register())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({registered, stopped}, return_when=asyncio.FIRST_COMPLETED)
        tasks = [registered, stopped]
        if registered.done():
            tasks.append(asyncio.ensure_future(node.heartbeat_loop()))
            tasks.append(asyncio.ensure_future(node.scrubber.run()))
            await stopped
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await node.close()
        logger.info("storage node %d stopped", config.node_id)


def main(argv: list[str] | None = None) -> None:
    run_service("storage", "LoomFS storage service", StorageConfig, serve, argv)


if __name__ == "__main__":
    main()
