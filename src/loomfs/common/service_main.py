"""The one ``main()`` every service process shares: flags -> config -> logging -> serve()."""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from loomfs.common import logs
from loomfs.config import load
from loomfs.net import auth, revocations

C = TypeVar("C")
logger = logging.getLogger(__name__)


def run_service(
    name: str,
    description: str,
    config_cls: type[C],
    serve: Callable[[C], Coroutine[Any, Any, None]],
    argv: list[str] | None = None,
) -> None:
    """``python -m loomfs.<name>.server --config FILE``; env ``LOOMFS_<NAME>_<FIELD>`` overrides."""
    p = argparse.ArgumentParser(prog=f"loomfs-{name}", description=description)
    p.add_argument("--config", help="TOML config file")
    args = p.parse_args(argv)
    config = load(config_cls, args.config, env_prefix=name.upper())
    logs.setup(name)
    rpc = getattr(config, "rpc", None)
    auth_cfg = None
    if rpc is not None:  # credentials and TLS for every transport of this process
        auth_cfg = auth.from_rpc_config(rpc, name=name)
        auth.set_process_auth(auth_cfg)
    mgmtd = str(getattr(config, "mgmtd", "")) if name != "mgmtd" else ""
    if auth_cfg is not None and auth_cfg.secret is not None and mgmtd:
        asyncio.run(_serve_polling_revocations(serve(config), mgmtd))
        return
    asyncio.run(serve(config))


async def _serve_polling_revocations(serving: Coroutine[Any, Any, None], mgmtd: str) -> None:
    """Serve, and meanwhile keep this process's revoked tokens in step with mgmtd's list."""
    poller = asyncio.get_running_loop().create_task(poll_revocations(mgmtd))
    try:
        await serving
    finally:
        poller.cancel()


async def poll_revocations(mgmtd: str, period_s: float = revocations.POLL_S) -> None:
    """``LIST_REVOKED`` from the mgmtd primary every ``period_s``, into ``revocations.PROCESS``."""
    from loomfs.common.routing import MgmtdSet, parse_addresses
    from loomfs.net.rpc import RpcClient
    from loomfs.net.tcp import default_transport
    from loomfs.wire import auth as wa
    from loomfs.wire.message import Empty

    rpc = RpcClient(default_transport(), connect_timeout_s=1.0)
    mgmtds = MgmtdSet(rpc, parse_addresses(mgmtd))
    failures = 0
    try:
        while True:
            try:
                rsp = (await mgmtds.call(wa.LIST_REVOKED, Empty(), timeout_s=5.0)).body
                revocations.PROCESS.replace(dict(zip(rsp.token_ids, rsp.until_s, strict=False)))
                failures = 0
            except OSError as exc:  # mgmtd away: keep the list we have
                failures += 1
                if failures in (1, 10, 100):
                    logger.warning("revoked tokens: mgmtd unreachable (%d tries): %s", failures, exc)
            await asyncio.sleep(period_s)
    finally:
        await rpc.close()
