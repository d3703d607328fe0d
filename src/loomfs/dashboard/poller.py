"""Fetches routing from mgmtd and scrapes every node's /metrics, keeping the previous
scrape for rates. One ``ClusterPoller`` per ``loomfs top`` / dashboard process."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from loomfs.common.routing import parse_addresses
from loomfs.dashboard.model import History, build_view, metrics_port_of
from loomfs.errors import LoomError
from loomfs.metrics.scrape import Scrape, scrape
from loomfs.net.rpc import RpcClient
from loomfs.net.tcp import TcpTransport
from loomfs.net.transport import Address
from loomfs.wire import mgmtd as wm
from loomfs.wire.types import RoutingInfo

logger = logging.getLogger(__name__)


class ClusterPoller:
    def __init__(self, mgmtd: str | Sequence[Address], *, scrape_timeout_s: float = 1.0,
                 history_points: int = 300):
        self.mgmtd = parse_addresses(mgmtd) if isinstance(mgmtd, str) else list(mgmtd)
        self.rpc = RpcClient(TcpTransport(), connect_timeout_s=1.0)
        self.scrape_timeout_s = scrape_timeout_s
        self._prev: dict[int, Scrape] = {}
        self.history = History(history_points)
        self.view: dict[str, Any] | None = None
        self.error = ""
        self.polls = 0

    async def routing(self) -> RoutingInfo:
        last: BaseException | None = None
        for addr in self.mgmtd:
            try:
                rsp = await self.rpc.call(addr, wm.GET_ROUTING, wm.GetRoutingReq(), timeout_s=2.0, retry=False)
                if rsp.body.routing is not None:
                    return rsp.body.routing
            except (LoomError, OSError) as exc:
                last = exc
        raise LoomError(f"no mgmtd answered at {','.join(map(str, self.mgmtd))}: {last}")

    async def _scrape_all(self, routing: RoutingInfo) -> dict[int, Scrape]:
        now = time.monotonic()
        todo = [(n.node_id, n.host, metrics_port_of(n)) for n in routing.nodes if metrics_port_of(n)]

        async def one(host: str, port: int) -> Scrape | None:
            try:
                return await scrape(host, port, at_s=now, timeout_s=self.scrape_timeout_s)
            except (OSError, TimeoutError, ValueError):
                return None

        got = await asyncio.gather(*(one(h, p) for _, h, p in todo))
        return {nid: s for (nid, _, _), s in zip(todo, got, strict=True) if s is not None}

    async def poll(self) -> dict[str, Any]:
        """One round: routing + scrapes -> a view (kept as ``.view``, appended to history)."""
        self.polls += 1
        try:
            routing = await self.routing()
        except (LoomError, OSError) as exc:
            self.error = str(exc)
            view = {"at_s": time.time(), "health": "unreachable", "error": self.error, "nodes": [],
                    "targets": [], "chains": [], "totals": {}, "routing_version": 0}
            self.view = view
            return view
        self.error = ""
        scrapes = await self._scrape_all(routing)
        view = build_view(routing, scrapes, self._prev, now_s=time.time())
        self._prev = scrapes
        self.history.add(view)
        self.view = view
        return view

    async def close(self) -> None:
        await self.rpc.close()

    def __repr__(self) -> str:
        return f"ClusterPoller(mgmtd={','.join(map(str, self.mgmtd))} polls={self.polls})"
