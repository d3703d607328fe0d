"""mgmtd process: ``python -m loomfs.mgmtd.server --config mgmtd.toml``.

One mgmtd with SQLite (``store_url = "sqlite:///..."``), or 2-3 on one PostgreSQL store with a
primary elected by lease (``store_url = "postgresql://..."``, ``mgmtd = "every,address"``;
docs/mgmtd-ha.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
from pathlib import Path
from typing import Any

from loomfs.common.clock import SYSTEM_CLOCK
from loomfs.common.routing import parse_addresses
from loomfs.common.service_main import run_service
from loomfs.config import MgmtdConfig, resolve_under
from loomfs.errors import LoomError
from loomfs.mgmtd.lease import Election
from loomfs.mgmtd.pgstore import PgHaStore, is_postgres_url
from loomfs.mgmtd.revoked import RevokedTokens
from loomfs.mgmtd.service import MgmtdService
from loomfs.mgmtd.state import ClusterState
from loomfs.mgmtd.store import MgmtdStore
from loomfs.net.rpc import RpcClient, RpcServer
from loomfs.net.tcp import default_transport
from loomfs.net.transport import Address
from loomfs.wire.message import Empty
from loomfs.wire.storage import STORAGE_PING

logger = logging.getLogger(__name__)


def check_config(config: MgmtdConfig) -> bool:
    """True for several mgmtd on a PostgreSQL store; False for the single SQLite mgmtd.
    Two brains on two SQLite files are refused here, at start."""
    peers = parse_addresses(config.mgmtd) if config.mgmtd else []
    if is_postgres_url(config.store_url):
        if config.primary_lease_s <= 0 or config.primary_lease_s >= config.lease_s:
            raise ValueError(f"mgmtd: primary_lease_s ({config.primary_lease_s}) must be above 0 and below "
                             f"lease_s ({config.lease_s}), so nodes keep their leases through a failover")
        return True
    if len(peers) > 1:
        raise ValueError(f"mgmtd: {len(peers)} mgmtd addresses configured ({config.mgmtd}) but the store is "
                         f"{config.store_url!r}: several mgmtd need one shared postgresql:// store_url "
                         "(SQLite is the single-mgmtd mode: configure one address)")
    return False


async def serve(config: MgmtdConfig, *, ready: asyncio.Event | None = None) -> None:
    ha = check_config(config)
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

    server = RpcServer("mgmtd", default_transport(max_payload_bytes=config.rpc.max_payload_bytes))
    store: MgmtdStore | None = None
    ha_store: PgHaStore | None = None
    election: Election | None = None
    if ha:
        ha_store = PgHaStore(config.store_url, timeout_s=config.primary_lease_s / 2,
                             connect_timeout_s=max(2.0, config.primary_lease_s))
        # the address is known once the server listens (port 0 in tests)
        election = Election(ha_store, holder="", address="", lease_s=config.primary_lease_s, clock=SYSTEM_CLOCK)
    else:
        store = MgmtdStore(resolve_under(config.data_dir, config.store_url))
    service = MgmtdService(state, store, heartbeat_interval_s=config.heartbeat_interval_s, probe=probe,
                           election=election, ha_store=ha_store)
    if store is not None:
        store.load(state, service.clock.monotonic())
        service.persist()
    server.add_service(service)
    # loomfs admin token revoke: the list is kept in the cluster state (the store), see mgmtd.revoked
    revoked = RevokedTokens(service, Path(config.data_dir, "revoked.json"))
    server.add_service(revoked)
    if store is not None:
        await revoked.adopt()
    address = await server.start(Address(config.host, config.port))
    if election is not None:
        election.address = f"{config.host}:{address.port}"
        election.holder = f"{election.address}/{os.getpid()}/{secrets.token_hex(4)}"
    metrics: Any = None
    if config.metrics_port >= 0:
        from loomfs.metrics import MgmtdCollector, start_service_metrics

        metrics = await start_service_metrics("mgmtd", server, None, port=config.metrics_port,
                                              host=config.host, collectors=[MgmtdCollector(state)])
        logger.info("mgmtd metrics on %s:%d/metrics", config.host, metrics.port)
    logger.info("mgmtd up on %s: %r %s", address, state, election or "(single, SQLite)")
    if ready is not None:
        ready.set()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    period_s = config.heartbeat_interval_s / 2
    if election is not None:
        period_s = min(period_s, config.primary_lease_s / 4)  # renewals well inside the lease
    try:
        while not stop.is_set():
            if election is not None:
                await election.step()
                if election.is_primary and service.loaded_term != election.term:
                    await service.take_over()
                    await revoked.adopt()  # the store's revoked tokens, for this process's verifier too
                await service.tick_ha()
            else:
                service.tick()
            try:  # asyncio.timeout: 3.11's wait_for can lose a cancel (storage/foreground.py)
                async with asyncio.timeout(period_s):
                    await stop.wait()
            except TimeoutError:
                pass
    finally:
        if metrics is not None:
            await metrics.close()
        await server.close()
        await probe_rpc.close()
        if store is not None:
            service.persist()
            store.close()
        if election is not None and ha_store is not None:
            try:
                await service.tick_ha()  # a last conditional save
                await election.release()  # a standby takes over at its next step, not after a lease
            except OSError as exc:
                logger.warning("mgmtd: lease not released: %s", exc)
            await ha_store.close()
        logger.info("mgmtd stopped")


def main(argv: list[str] | None = None) -> None:
    run_service("mgmtd", "LoomFS cluster manager", MgmtdConfig, serve, argv)


if __name__ == "__main__":
    main()
