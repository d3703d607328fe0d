"""The one ``main()`` every service process shares: flags -> config -> logging -> serve()."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from loomfs.common import logs
from loomfs.config import load
from loomfs.net import auth

C = TypeVar("C")


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
    if rpc is not None:  # credentials and TLS for every transport of this process
        auth.set_process_auth(auth.from_rpc_config(rpc, name=name))
    asyncio.run(serve(config))
