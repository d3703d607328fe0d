"""``loomfs dashboard [--host H] [--port P]``: serve the read-only web dashboard."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal

from loomfs.cli.admin import mgmtd_addresses


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dashboard", help="serve a read-only web dashboard of the cluster")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="listen port (0 = a free one; default 8080)")
    p.add_argument("--interval-s", type=float, default=1.0, help="poll period (default 1 s)")
    p.set_defaults(func=cmd_dashboard)


def cmd_dashboard(args: argparse.Namespace) -> int:
    from loomfs.dashboard.server import Dashboard

    async def go() -> None:
        d = Dashboard(mgmtd_addresses(args), interval_s=args.interval_s)
        port = await d.start(args.host, args.port)
        print(f"LoomFS dashboard on http://{args.host}:{port}/", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await d.close()

    asyncio.run(go())
    return 0
