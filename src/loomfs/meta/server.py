"""meta process: ``python -m loomfs.meta.server --config meta.toml``."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import signal
from typing import TYPE_CHECKING, Any

from loomfs.common import malloc_tune
from loomfs.common.clock import SYSTEM_CLOCK
from loomfs.common.retry import Backoff
from loomfs.common.routing import MgmtdSet, RoutingClient, parse_addresses
from loomfs.common.service_main import run_service
from loomfs.config import MetaConfig, resolve_under
from loomfs.errors import LoomError
from loomfs.meta.batch_service import BatchService
from loomfs.meta.gc import ChunkRemover, GcWorker, remover_client_id
from loomfs.meta.ops.namespace import Namespace
from loomfs.meta.readgrants import ReadGrantService
from loomfs.meta.service import MetaService, conflict_retrying, retry_conflicts
from loomfs.meta.store.base import MetaStore, StoreUnavailable
from loomfs.meta.trim import TRIM_CALL_TIMEOUT_S, StripeCutter, Trimmer
from loomfs.meta.xattr_service import XattrService
from loomfs.net.rpc import RpcClient, RpcServer
from loomfs.net.tcp import default_transport
from loomfs.net.transport import Address
from loomfs.wire.mgmtd import (
    HEARTBEAT,
    REGISTER_NODE,
    HeartbeatReq,
    RegisterNodeReq,
    RegisterNodeRsp,
)
from loomfs.wire.types import Layout, NodeKind

if TYPE_CHECKING:
    from loomfs.client.storage_client import StorageClient

logger = logging.getLogger(__name__)


REGISTER_BACKOFF = Backoff(0.1, 2.0)  # registration retried until mgmtd answers
STORE_WAIT_BACKOFF = Backoff(0.2, 2.0)  # the metastore not up yet at start

async def _register(mgmtd: MgmtdSet, config: MetaConfig, port: int, metrics_port: int = 0) -> RegisterNodeRsp:
    """Register with the primary mgmtd (``MgmtdSet`` follows it: docs/mgmtd-ha.md)."""
    req = RegisterNodeReq(node_id=config.node_id, kind=NodeKind.META, host=config.host, port=port,
                          metrics_port=metrics_port)
    attempt = 0
    while True:
        try:
            body: RegisterNodeRsp = (await mgmtd.call(REGISTER_NODE, req, timeout_s=5.0)).body
            logger.info("meta registered with mgmtd %s as node %d", mgmtd.primary, body.node_id)
            return body
        except (LoomError, OSError) as exc:
            logger.debug("register with %s: %s", mgmtd, exc)
        await asyncio.sleep(REGISTER_BACKOFF.delay_s(attempt))
        attempt += 1


async def _heartbeat(mgmtd: MgmtdSet, node_id: int, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await mgmtd.call(HEARTBEAT, HeartbeatReq(node_id=node_id), timeout_s=max(1.0, interval_s * 2))
        except (LoomError, OSError) as exc:  # the next beat tries again, the primary first
            logger.warning("heartbeat to %s failed: %s", mgmtd, exc)


def _make_remover(rpc: RpcClient, routing: RoutingClient, node_id: int) -> ChunkRemover | None:
    try:
        from loomfs.client.storage_client import StorageClient
    except ImportError as exc:
        logger.warning("GC disabled: no chunk remover (%s)", exc)
        return None
    return StorageClient(rpc, routing, client_id=remover_client_id(node_id))


def _make_cutter(rpc: RpcClient, routing: RoutingClient, node_id: int) -> StorageClient | None:
    """The storage client that cuts truncated files: its own request ids, and a deadline on
    every call that a trim's claim outlasts (``loomfs.meta.trim``)."""
    try:
        from loomfs.client.storage_client import StorageClient
    except ImportError as exc:
        logger.warning("trims left queued: no storage client (%s)", exc)
        return None
    return StorageClient(rpc, routing, client_id=remover_client_id(node_id), call_timeout_s=TRIM_CALL_TIMEOUT_S)


def _stripe_cutter(storage: StorageClient | None) -> StripeCutter | None:
    """What re-encodes the last stripe of a truncated EC file (``Trimmer.stripe_cutter``)."""
    if storage is None:
        return None
    from loomfs.client.ec_file import cut_last_stripe

    return functools.partial(cut_last_stripe, storage)


def _make_rebuilder(store: MetaStore, rpc: RpcClient, routing: RoutingClient, node_id: int) -> Any:
    """The EC rebuild worker (``loomfs.meta.ec_rebuild``): refills spares swapped into EC chains."""
    try:
        from loomfs.client.storage_client import StorageClient
        from loomfs.meta.ec_rebuild import RebuildWorker
    except ImportError as exc:
        logger.warning("EC rebuild disabled (%s)", exc)
        return None
    return RebuildWorker(store, StorageClient(rpc, routing, client_id=remover_client_id(node_id)), routing)


def eager_handlers(store: MetaStore) -> bool:
    """Whether meta's RpcServer runs handlers eagerly (``net.rpc_serve``): on SQLite, whose
    handlers answer most requests without suspending and never need a current task before
    they do; not on PostgreSQL (asyncpg uses ``asyncio.timeout``). ``LOOMFS_RPC_EAGER=0`` turns
    it off (A/B measurements)."""
    from loomfs.meta.store.sqlite import SqliteStore

    return isinstance(store, SqliteStore) and os.environ.get("LOOMFS_RPC_EAGER", "1") != "0"


FATAL_EXIT_CODE = 70  # EX_SOFTWARE: the store failed itself; a supervisor restarts meta


def _exit_for_restart(exc: BaseException) -> None:
    """The metastore failed itself (an I/O error under a checkpoint: what the disk holds is no
    longer known): exit at once so a supervisor restarts meta and SQLite's recovery reads the
    disk, rather than answer EIO to every write from now on."""
    logger.critical("meta: the metastore failed (%s); exiting with %d for a restart", exc, FATAL_EXIT_CODE)
    logging.shutdown()
    os._exit(FATAL_EXIT_CODE)


STORE_WAIT_S = 60.0  # at start-up, how long a meta server waits for its database


async def _init_namespace(ns: Namespace) -> None:
    """Create the root if needed. Meta servers starting together on one fresh database race
    to create it (conflicts re-run); a database that is not up yet is waited for."""
    deadline = asyncio.get_running_loop().time() + STORE_WAIT_S
    attempt = 0
    while True:
        try:
            await retry_conflicts(ns.init)
            return
        except StoreUnavailable as exc:
            if asyncio.get_running_loop().time() > deadline:
                raise
            delay_s = STORE_WAIT_BACKOFF.delay_s(attempt)
            attempt += 1
            logger.warning("meta: metastore not reachable yet (%s); retrying in %.1fs", exc, delay_s)
            await asyncio.sleep(delay_s)


async def serve(config: MetaConfig, *, ready: asyncio.Event | None = None) -> None:
    malloc_tune.tune()  # freed memory kept for reuse: no fresh pages per big reply (common/malloc_tune)
    store = MetaStore.open(
        resolve_under(config.data_dir, config.store_url), synchronous=config.sqlite_synchronous
    )
    if hasattr(store, "on_fatal"):  # SQLite: a failed checkpoint fsync fails the store for good
        store.on_fatal = _exit_for_restart
    rpc = RpcClient(
        default_transport(max_payload_bytes=config.rpc.max_payload_bytes),
        connect_timeout_s=config.rpc.connect_timeout_s,
        call_timeout_s=config.rpc.call_timeout_s,
    )
    mgmtd = parse_addresses(config.mgmtd)
    routing = RoutingClient(rpc, mgmtd)
    default_layout = Layout(
        chunk_size=config.default_chunk_size_bytes, stripe=config.default_stripe, table_id=1,
        inline_max_bytes=config.default_inline_max_bytes,
    )
    cutter = _make_cutter(rpc, routing, config.node_id)
    trimmer = Trimmer(store, cutter, clock=SYSTEM_CLOCK, stripe_cutter=_stripe_cutter(cutter)) if cutter is not None else None
    ns = Namespace(
        store, routing=routing, clock=SYSTEM_CLOCK,
        rng=random.Random(config.node_id or None), default_layout=default_layout, trimmer=trimmer,
        chunk_writer=cutter,
    )
    await _init_namespace(ns)
    live = conflict_retrying(ns)  # operations re-run on a lost conflict (engines that have them)
    server = RpcServer("meta", default_transport(max_payload_bytes=config.rpc.max_payload_bytes),
                       eager=eager_handlers(store))
    squash = config.root_squash  # uid 0 from a token without ADMIN acts as nobody
    server.add_service(MetaService(live, root_squash=squash))
    server.add_service(BatchService(live, root_squash=squash))
    server.add_service(XattrService(live, root_squash=squash))
    server.add_service(ReadGrantService(live, root_squash=squash))  # READ_GRANTS (read grants)
    tasks: list[asyncio.Task[object]] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    metrics: Any = None
    try:
        addr = await server.start(Address(config.host, config.port))
        if config.metrics_port >= 0:
            from loomfs.metrics import MetaCollector, instrument_meta_store, start_service_metrics

            metrics = await start_service_metrics("meta", server, rpc, port=config.metrics_port,
                                                  host=config.host, collectors=[MetaCollector(store, ns)])
            instrument_meta_store(store, metrics.registry)
        tasks.append(loop.create_task(routing.run(), name="meta-routing"))
        reg_task = loop.create_task(
            _register(routing.mgmtd_set, config, addr.port, metrics.port if metrics is not None else 0)
        )
        stop_task = loop.create_task(stop.wait())
        tasks += [reg_task, stop_task]
        await asyncio.wait([reg_task, stop_task], return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            return
        reg = reg_task.result()
        tasks.append(loop.create_task(
            _heartbeat(routing.mgmtd_set, reg.node_id, reg.heartbeat_interval_s or 1.0), name="meta-heartbeat"
        ))
        remover = _make_remover(rpc, routing, reg.node_id)
        if remover is not None:
            gc = GcWorker(
                store, remover, delay_s=config.gc_delay_s, interval_s=config.gc_interval_s,
                session_lease_s=ns.session_lease_s, clock=SYSTEM_CLOCK, trimmer=trimmer,
            )
            tasks.append(loop.create_task(gc.run(), name="meta-gc"))
        rebuild = _make_rebuilder(store, rpc, routing, reg.node_id)
        if rebuild is not None:
            if metrics is not None:
                from loomfs.meta.ec_rebuild import RebuildCollector

                metrics.registry.register(RebuildCollector(rebuild))
            tasks.append(loop.create_task(rebuild.run(), name="meta-ec-rebuild"))
        logger.info("meta up on %s: %r", addr, ns)
        if ready is not None:
            ready.set()
        await stop.wait()
    finally:
        logger.info("meta stopping")
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if metrics is not None:
            await metrics.close()
        await server.close()
        await rpc.close()
        await store.close()
        logger.info("meta stopped")


def main(argv: list[str] | None = None) -> None:
    if os.environ.get("LOOMFS_UVLOOP") == "1":  # opt-in, as for the client (client/sync_bridge.py)
        try:
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        except ImportError:
            logger.warning("LOOMFS_UVLOOP=1 but uvloop is not installed (pip install loomfs[uvloop])")
    run_service("meta", "LoomFS metadata service", MetaConfig, serve, argv)


if __name__ == "__main__":
    main()
