"""Routing: the versioned cluster map from mgmtd, cached and refreshed.

Every service and client holds a ``RoutingClient``. ``Routing`` is an immutable snapshot
with lookups by id; ``RoutingClient.refresh()`` fetches a newer one (mgmtd answers
"unchanged" cheaply when the version matches), and ``run()`` refreshes periodically.

``MgmtdSet`` is how every service and client calls mgmtd: a list of mgmtd addresses of which
one is primary (docs/mgmtd-ha.md). It calls the primary it last heard from first; on
``NOT_PRIMARY`` it tries the primary the answer names, on a dead connection the next address,
and between rounds it waits by the common ``Backoff``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from typing import Any

from loomfs.common.retry import Backoff
from loomfs.errors import LoomError, NotFound, PermissionDenied, StatusError, TimedOut
from loomfs.net.rpc import Response, RpcClient
from loomfs.net.transport import Address
from loomfs.wire.message import Message, Method
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

    def table(self, table_id: int = 0, replicas: int = 0, *, ec: bool | None = None) -> ChainTable:
        """A chain table by id, or the lowest-numbered one with ``replicas`` replicas; ``ec``
        (when not None): only an EC group's table (``ChainTable.ec``), or only a replicated one.
        An EC table is known by its flag, never by its replica count (a replicated table may
        have one replica)."""
        if table_id and table_id in self.tables and not replicas and ec is None:
            return self.tables[table_id]
        for tid in sorted(self.tables):
            t = self.tables[tid]
            if (not table_id or tid == table_id) and (not replicas or t.replicas == replicas) \
                    and (ec is None or t.ec == ec):
                return t
        kind = "" if ec is None else ("of an EC group (ec)" if ec else "replicated (not ec)")
        what = " ".join(filter(None, (f"{table_id}" if table_id else "",
                                      f"with {replicas} replicas" if replicas else "", kind)))
        raise NotFound(f"no chain table {what}".rstrip())

    def alive_nodes(self, kind: int) -> list[NodeInfo]:
        return [n for n in self.info.nodes if n.kind == kind and n.state == NodeState.ALIVE]

    def __repr__(self) -> str:
        return f"Routing(v{self.version} nodes={len(self.nodes)} targets={len(self.targets)} chains={len(self.chains)})"


def parse_addresses(text: str | Sequence[str]) -> list[Address]:
    parts = text.split(",") if isinstance(text, str) else list(text)
    return [Address.parse(p.strip()) for p in parts if p.strip()]


_HINT = re.compile(r"primary=(\S+)")
# answers that say "not here, try another mgmtd"; any other status is the primary's own answer
_MOVE_ON = frozenset({Status.NOT_PRIMARY, Status.SHUTTING_DOWN})


def primary_hint(exc: BaseException) -> Address | None:
    """The primary's address named by a NOT_PRIMARY answer (None: not named)."""
    m = _HINT.search(str(exc))
    if m is None:
        return None
    try:
        return Address.parse(m.group(1))
    except ValueError:
        return None


MGMTD_BACKOFF = Backoff(0.05, 1.0)  # between rounds over every mgmtd address


def _move_on(exc: BaseException) -> bool:
    if isinstance(exc, LoomError) and exc.status is not None:
        return exc.status in _MOVE_ON
    return isinstance(exc, OSError)  # no answer: connection refused or broken, timed out


class MgmtdSet:
    """The mgmtd addresses, and which one answered as primary last."""

    def __init__(self, rpc: RpcClient, addresses: Sequence[Address], *, backoff: Backoff = MGMTD_BACKOFF):
        if not addresses:
            raise ValueError("at least one mgmtd address is needed")
        self.rpc = rpc
        self.addresses = list(addresses)
        self.backoff = backoff
        self.primary: Address | None = None
        self.redirects = 0  # NOT_PRIMARY answers followed
        self.failovers = 0  # calls answered by another mgmtd than the one tried first

    def _order(self) -> list[Address]:
        p = self.primary
        return [p, *(a for a in self.addresses if a != p)] if p is not None else list(self.addresses)

    async def call(self, m: Method, req: Message, *, timeout_s: float, retry: bool | None = None,
                   deadline_s: float = 0.0) -> Response[Any]:
        """Call ``m`` on the primary. One round (each address once, and the primary an answer
        names) by default; with ``deadline_s``, rounds with backoff for that long. ``retry``
        as ``RpcClient.call`` for one address; with several, each attempt is single (a dead
        mgmtd is passed over at once, not waited for)."""
        if len(self.addresses) > 1:
            retry = False
        end_s = asyncio.get_running_loop().time() + deadline_s
        attempt = 0
        while True:
            try:
                return await self._round(m, req, timeout_s, retry)
            except (LoomError, OSError) as exc:
                if not _move_on(exc):
                    raise
                left_s = end_s - asyncio.get_running_loop().time()
                if left_s <= 0:
                    raise
            await asyncio.sleep(min(self.backoff.delay_s(attempt), left_s))
            attempt += 1

    async def _round(self, m: Method, req: Message, timeout_s: float, retry: bool | None) -> Response[Any]:
        queue = self._order()
        first = queue[0]
        tried: set[Address] = set()
        last: BaseException | None = None
        while queue:
            addr = queue.pop(0)
            if addr in tried:
                continue
            tried.add(addr)
            try:
                rsp = await self.rpc.call(addr, m, req, timeout_s=timeout_s, retry=retry)
            except (LoomError, OSError) as exc:
                if not _move_on(exc):
                    self.primary = addr  # a real answer: this one is primary
                    raise
                last = exc
                if self.primary == addr:
                    self.primary = None
                hint = primary_hint(exc) if isinstance(exc, LoomError) and exc.status is Status.NOT_PRIMARY else None
                if hint is not None and hint not in tried:
                    self.redirects += 1
                    queue.insert(0, hint)
                continue
            if addr != first:
                self.failovers += 1
                logger.info("mgmtd primary now %s", addr)
            self.primary = addr
            return rsp
        assert last is not None
        raise last

    def __repr__(self) -> str:
        return f"MgmtdSet({','.join(map(str, self.addresses))} primary={self.primary})"


class RoutingClient:
    def __init__(self, rpc: RpcClient, mgmtd: Sequence[Address], *, refresh_s: float = 2.0):
        if not mgmtd:
            raise ValueError("at least one mgmtd address is needed")
        self.rpc = rpc
        self.mgmtd = list(mgmtd)
        self.mgmtd_set = MgmtdSet(rpc, self.mgmtd)  # shared by the process's mgmtd calls
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
            try:
                rsp = await self.mgmtd_set.call(GET_ROUTING, GetRoutingReq(known_version=known), timeout_s=5.0)
            except PermissionDenied:
                raise  # a refused credential is not an unreachable mgmtd: say so
            except (LoomError, OSError) as exc:
                if self._current is not None:
                    logger.warning("routing refresh failed, keeping v%d: %s", self._current.version, exc)
                    return self._current
                raise TimedOut(f"no mgmtd reachable at {','.join(map(str, self.mgmtd))}: {exc}") from exc
            body: GetRoutingRsp = rsp.body
            self.refreshes += 1
            if body.changed and body.routing is not None:
                if cur is None or body.routing.version >= cur.version:
                    self._current = Routing(body.routing)
                    if cur is None or body.routing.version != cur.version:
                        logger.debug("routing now v%d", body.routing.version)
                        self._changed.set()
                        self._changed = asyncio.Event()
            if self._current is None:
                raise TimedOut(f"mgmtd answered no routing (known v{known})")
            return self._current

    async def wait_changed(self, timeout_s: float) -> None:
        ev = self._changed
        try:  # asyncio.timeout: 3.11's wait_for can lose a cancel (storage/foreground.py)
            async with asyncio.timeout(timeout_s):
                await ev.wait()
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
