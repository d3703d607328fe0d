"""mgmtd process: ``python -m loomfs.mgmtd.server --config mgmtd.toml``."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

from loomfs.common.service_main import run_service
from loomfs.config import MgmtdConfig, resolve_under
from loomfs.errors import LoomError
from loomfs.mgmtd.service import MgmtdService
from loomfs.mgmtd.state import ClusterState
from loomfs.mgmtd.store import MgmtdStore
from loomfs.net.rpc import RpcClient, RpcServer
from loomfs.net.tcp import default_transport
from loomfs.net.transport import Address
from loomfs.wire.message import Empty
from loomfs.wire.storage import STORAGE_PING

logger = logging.getLogger(__name__)


async def serve(config: MgmtdConfig, *, ready: asyncio.Event | None = None) -> None:
    store = MgmtdStore(resolve_under(config.data_dir, config.store_url))
    state = ClusterState(lease_s=config.lease_s, replace_after_s=config.replace_after_s,
                         unreachable_hold_s=config.unreachable_hold_s)
    probe_rpc = RpcClient(default_transport(), connect_timeout_s=min(1.0, config.lease_s / 2))

    async def probe(host: str, port: int) -> bool:
        try:
            await probe_rpc.call(Address(host, port), STORAGE_PING, Empty(), timeout_s=min(1.0, config.lease_s / 2),
                                 retry=False)
        except (LoomError, OSError):
            return False
        return True

    service = MgmtdService(state, store, heartbeat_interval_s=config.heartbeat_interval_s, probe=probe)
    store.load(state, service.clock.monotonic())
    service.persist()
    server = RpcServer("mgmtd", default_transport(max_payload_bytes=config.rpc.max_payload_bytes))
    server.add_service(service)
    await server.start(Address(config.host, config.port))
    metrics: Any = None
    if config.metrics_port >= 0:
        from loomfs.metrics import MgmtdCollector, start_service_metrics

        metrics = await start_service_metrics("mgmtd", server, None, port=config.metrics_port,
                                              host=config.host, collectors=[MgmtdCollector(state)])
        logger.info("mgmtd metrics on %s:%d/metrics", config.host, metrics.port)
    logger.info("mgmtd up: %r", state)
    if ready is not None:
        ready.set()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    try:
        while not stop.is_set():
            service.tick()
            try:
                await asyncio.wait_for(stop.wait(), config.heartbeat_interval_s / 2)
            except TimeoutError:
                pass
    finally:
        if metrics is not None:
            await metrics.close()
        await server.close()
        await probe_rpc.close()
        service.persist()
        store.close()
        logger.info("mgmtd stopped")


def main(argv: list[str] | None = None) -> None:
    run_service("mgmtd", "LoomFS cluster manager", MgmtdConfig, serve, argv)


if __name__ == "__main__":
    main()
