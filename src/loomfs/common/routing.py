"""Routing: the versioned cluster map from mgmtd, cached and refreshed.

Every service and client holds a ``RoutingClient``. ``Routing`` is an immutable snapshot
with lookups by id; ``RoutingClient.refresh()`` fetches a newer one (mgmtd answers
"unchanged" cheaply when the version matches), and ``run()`` refreshes periodically.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence

from loomfs.errors import LoomError, NotFound, StatusError, TimedOut
from loomfs.net.rpc import RpcClient
from loomfs.net.transport import Address
from loomfs.wire.mgmtd import GET_ROUTING, GetRoutingReq, GetRoutingRsp
from loomfs.wire.status import Status
from loomfs.wire.types import (
    ChainInfo,
    ChainTable,
    NodeInfo,
    NodeState,
    RoutingInfo,
    TargetInfo,
    TargetState,
)

logger = logging.getLogger(__name__)


class Routing:
    """One immutable routing snapshot with indexes."""

    def __init__(self, info: RoutingInfo):
        self.info = info
        self.version = info.version
        self.nodes: dict[int, NodeInfo] = {n.node_id: n for n in info.nodes}
        self.targets: dict[int, TargetInfo] = {t.target_id: t for t in info.targets}
        self.chains: dict[int, ChainInfo] = {c.chain_id: c for c in info.chains}
        self.tables: dict[int, ChainTable] = {t.table_id: t for t in info.tables}

    def chain(self, chain_id: int) -> ChainInfo:
        c = self.chains.get(chain_id)
        if c is None:
            raise StatusError(Status.UNKNOWN_TARGET, f"chain {chain_id} not in routing v{self.version}")
        return c

    def serving_targets(self, chain_id: int) -> list[int]:
        """The chain's serving targets in order (head first)."""
        chain = self.chain(chain_id)
        return [
            t
            for t in chain.targets
            if (ti := self.targets.get(t)) is not None and ti.state == TargetState.SERVING
        ]

    def node_of(self, target_id: int) -> NodeInfo:
        t = self.targets.get(target_id)
        if t is None:
            raise StatusError(Status.UNKNOWN_TARGET, f"target {target_id} not in routing v{self.version}")
        n = self.nodes.get(t.node_id)
        if n is None:
            raise StatusError(Status.UNKNOWN_TARGET, f"node {t.node_id} not in routing v{self.version}")
        return n

    def address_of(self, target_id: int) -> Address:
        n = self.node_of(target_id)
        return Address(n.host, n.port)

    def table(self, table_id: int = 0, replicas: int = 0) -> ChainTable:
        """A chain table by id, or the lowest-numbered one with ``replicas`` replicas."""
        if table_id and table_id in self.tables and not replicas:
            return self.tables[table_id]
        for tid in sorted(self.tables):
            t = self.tables[tid]
            if (not table_id or tid == table_id) and (not replicas or t.replicas == replicas):
                return t
        what = f"with {replicas} replicas" if replicas else f"{table_id}"
        raise NotFound(f"no chain table {what}")

    def alive_nodes(self, kind: int) -> list[NodeInfo]:
        return [n for n in self.info.nodes if n.kind == kind and n.state == NodeState.ALIVE]

    def __repr__(self) -> str:
        return f"Routing(v{self.version} nodes={len(self.nodes)} targets={len(self.targets)} chains={len(self.chains)})"


def parse_addresses(text: str | Sequence[str]) -> list[Address]:
    parts = text.split(",") if isinstance(text, str) else list(text)
    return [Address.parse(p.strip()) for p in parts if p.strip()]


class RoutingClient:
    def __init__(self, rpc: RpcClient, mgmtd: Sequence[Address], *, refresh_s: float = 2.0):
        if not mgmtd:
            raise ValueError("at least one mgmtd address is needed")
        self.rpc = rpc
        self.mgmtd = list(mgmtd)
        self.refresh_s = refresh_s
        self._current: Routing | None = None
        self._lock = asyncio.Lock()
        self._changed = asyncio.Event()
        self.refreshes = 0

    @property
    def current(self) -> Routing:
        if self._current is None:
            raise LoomError("routing not fetched yet")
        return self._current

    @property
    def has_routing(self) -> bool:
        return self._current is not None

    async def get(self) -> Routing:
        if self._current is None:
            await self.refresh()
        assert self._current is not None
        return self._current

    async def refresh(self, min_version: int = 0) -> Routing:
        """Fetch routing newer than what we hold (or at least ``min_version``)."""
        async with self._lock:
            cur = self._current
            if cur is not None and min_version and cur.version >= min_version + 1:
                return cur  # someone refreshed while we waited
            known = cur.version if cur is not None else 0
            last_exc: BaseException | None = None
            for addr in random.sample(self.mgmtd, len(self.mgmtd)):
                try:
                    rsp = await self.rpc.call(
                        addr, GET_ROUTING, GetRoutingReq(known_version=known), timeout_s=5.0
                    )
                except (LoomError, OSError) as exc:
                    last_exc = exc
                    continue
                body: GetRoutingRsp = rsp.body
                self.refreshes += 1
                if body.changed and body.routing is not None:
                    if cur is None or body.routing.version >= cur.version:
                        self._current = Routing(body.routing)
                        if cur is None or body.routing.version != cur.version:
                            logger.debug("routing now v%d", body.routing.version)
                            self._changed.set()
                            self._changed = asyncio.Event()
                assert self._current is not None or last_exc is None
                if self._current is not None:
                    return self._current
            if self._current is not None and last_exc is not None:
                logger.warning("routing refresh failed, keeping v%d: %s", self._current.version, last_exc)
                return self._current
            raise TimedOut(f"no mgmtd reachable at {','.join(map(str, self.mgmtd))}: {last_exc}")

    async def wait_changed(self, timeout_s: float) -> None:
        ev = self._changed
        try:
            await asyncio.wait_for(ev.wait(), timeout_s)
        except TimeoutError:
            pass

    async def run(self) -> None:
        """Refresh forever (a background task)."""
        while True:
            try:
                await self.refresh()
            except (LoomError, OSError) as exc:
                logger.debug("routing refresh: %s", exc)
            await asyncio.sleep(self.refresh_s)

    def __repr__(self) -> str:
        v = self._current.version if self._current else None
        return f"RoutingClient(v{v} mgmtd={','.join(map(str, self.mgmtd))})"
