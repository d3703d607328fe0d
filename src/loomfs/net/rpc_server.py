"""RPC server: dispatch by (service, method), one task per request (or none: ``eager``,
``net.rpc_serve``), bounded per connection;
unknown methods, undecodable bodies and bad payload CRCs get an error status; handler
exceptions become status codes (never pickled); a broken peer only loses its own connection."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from loomfs.common.identity import TRUSTED, Identity, Right
from loomfs.errors import (
    StatusError,
)
from loomfs.net.auth import UNAUTHENTICATED, AuthError, new_nonce
from loomfs.net.budget import PROCESS_BUDGET, TENANT_BUDGETS, ByteBudget, TenantBudgets
from loomfs.net.buffers import DEFAULT_POOL, Buffer, BufferPool
from loomfs.net.limits import ServerLimits, sweep_forever
from loomfs.net.policy import needs_of
from loomfs.net.rpc_base import AUTH_CLOSE_DELAY_S, Handler, RpcObserver
from loomfs.net.rpc_serve import RequestRunner
from loomfs.net.transport import Address, Channel, Listener, Transport
from loomfs.wire import auth as wa
from loomfs.wire import frame as fr
from loomfs.wire.message import Method
from loomfs.wire.status import Status

logger = logging.getLogger("loomfs.net.rpc")

class RpcServer:
    def __init__(
        self,
        name: str,
        transport: Transport,
        *,
        inflight_per_connection_max: int | None = None,
        pool: BufferPool = DEFAULT_POOL,
        limits: ServerLimits | None = None,
        budget: ByteBudget = PROCESS_BUDGET,
        tenant_budgets: TenantBudgets = TENANT_BUDGETS,
        eager: bool = False,
    ):
        """``limits``: connection cap, per-connection bounds and timeouts; ``budget``: the
        bytes of request payloads (and headers) all servers of this process may hold;
        ``tenant_budgets``: what one tenant's connections may hold of it (``net.budget``);
        ``eager``: run each handler's first step at once and make a Task only if it suspends
        (``net.rpc_serve``; for services whose handlers need no current task before their
        first suspension: meta on SQLite)."""
        self.name = name
        self.eager = eager
        self.eager_running = False  # an eager request is being served now (they do not nest)
        self.transport = transport
        limits = limits or ServerLimits()
        if inflight_per_connection_max is not None:
            limits = dataclasses.replace(limits, inflight_per_connection_max=inflight_per_connection_max)
        self.limits = limits
        self.inflight_per_connection_max = limits.inflight_per_connection_max
        self.budget = budget
        self.tenant_budgets = tenant_budgets
        self.pool = pool
        self._handlers: dict[tuple[int, int], tuple[Method, Handler, Right]] = {}
        # checks credentials at connect when the transport has a cluster secret (None: TRUSTED)
        auth = getattr(transport, "auth", None)
        self.verifier = auth.verifier() if auth is not None else None
        self.auth_refused_total = 0  # handshakes and calls refused for credentials
        self._listener: Listener | None = None
        self._connections: set[_ServerConnection] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self.requests_total = 0
        self.errors_total = 0
        self.refused_total = 0  # connections over the cap
        self.closed_total: dict[str, int] = {}  # connections we closed, by kind of reason
        self.observers: list[RpcObserver] = []

    def register(self, m: Method, handler: Handler) -> None:
        if m.key in self._handlers:
            raise ValueError(f"{m.name} registered twice")
        self._handlers[m.key] = (m, handler, needs_of(m))

    def add_service(self, service: object) -> None:
        for attr in dir(service):
            fn = getattr(service, attr, None)
            m = getattr(fn, "__loomfs_method__", None)
            if isinstance(m, Method):
                self.register(m, fn)  # type: ignore[arg-type]

    async def start(self, address: Address) -> Address:
        self._listener = await self.transport.listen(address, self._new_connection)
        self._sweeper = asyncio.get_running_loop().create_task(
            sweep_forever(lambda: self._connections, self.limits)
        )
        logger.info("%s listening on %s", self.name, self._listener.address)
        return self._listener.address

    @property
    def address(self) -> Address:
        assert self._listener is not None
        return self._listener.address

    @property
    def connections(self) -> int:
        return len(self._connections)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._listener is not None:
            await self._listener.close()
        for conn in list(self._connections):
            conn.channel.abort()
        self._connections.clear()

    def _new_connection(self, channel: Channel) -> _ServerConnection:
        conn = _ServerConnection(self, channel)
        if len(self._connections) >= self.limits.connections_max:
            self.refused_total += 1
            if self.refused_total & (self.refused_total - 1) == 0:  # 1, 2, 4, 8...: no log flood
                logger.warning("%s: %d connections (cap %d): refusing %s (%d refused so far)", self.name,
                               len(self._connections), self.limits.connections_max, channel.peer,
                               self.refused_total)
            conn.refuse()
            return conn
        self._connections.add(conn)
        return conn

    def __repr__(self) -> str:
        return f"RpcServer({self.name} conns={len(self._connections)} requests={self.requests_total})"


class _ServerConnection(RequestRunner):
    def __init__(self, server: RpcServer, channel: Channel):
        self.server = server
        self.channel = channel
        self._loop = asyncio.get_running_loop()
        # who the peer proved to be at connect time (``loomfs.net.auth``); TRUSTED without auth
        self.authenticated = server.verifier is None
        self.identity: Identity = TRUSTED if self.authenticated else UNAUTHENTICATED
        self.expires_at_s = 0.0  # wall-clock expiry of the token the peer proved (0 = never)
        self._auth_step = 0  # 1: HELLO answered, 2: proved
        self._nonces = (b"", b"")  # (server, client) of this connection's handshake
        self.inflight = 0  # requests
        self.inflight_bytes = 0  # payload + header bytes of our requests, taken from the budget
        self.frames_in = 0
        self.refused = False
        self._count_paused = False  # at inflight_per_connection_max
        self._reading_stopped = False  # the channel is not reading (any reason)
        self._conn_wait_bytes = 0  # a payload waits for our own requests to finish
        self._conn_bytes_max = server.limits.inflight_bytes_per_connection_max
        self._budget_cancel: Callable[[], None] | None = None  # queued at the process budget
        self._granted_bytes = 0  # the budget granted our queued payload; not yet taken
        # the budget this connection's tenant shares (a token's, not a service's or an admin's);
        # set when the peer authenticates, taken before the process budget
        self.tenant_budget: ByteBudget | None = None
        self._tenant: str | None = None
        self._tenant_held = 0  # a queued payload's bytes taken from the tenant budget, not yet the process's
        self._bufs: dict[int, tuple[Buffer, int, ByteBudget | None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # sweeper state (net.limits)
        self.seen_frames = 0
        self.active_at = self._loop.time()
        self.partial_since: float | None = None

    # ---- admission -------------------------------------------------------------------------
    def payload_buffer(self, kind: int, header: fr.Header, length: int) -> memoryview | None:
        if header.service == wa.SERVICE_AUTH:  # the handshake has no payloads
            self._auth_refused(header, Status.AUTH_FAILED, "payload in a handshake frame")
            return None
        cost = length + header.wire_bytes
        budget = self.server.budget
        tb = self.tenant_budget
        used = budget.used_bytes
        if self._granted_bytes:
            self._granted_bytes = 0  # the budgets took ``cost`` for us while we waited
        elif (self.refused or budget.waiters or (used and used + cost > budget.limit_bytes)
              or (self.inflight_bytes and self.inflight_bytes + cost > self._conn_bytes_max)
              or (tb is not None and (tb.waiters or (tb.used_bytes and tb.used_bytes + cost > tb.limit_bytes)))):
            if self.refused or not self._admit(cost):
                return None
        else:  # the common case, inlined (this runs for every request with a payload)
            used += cost
            budget.used_bytes = used
            if used > budget.peak_bytes:
                budget.peak_bytes = used
            if tb is not None:
                tb.force(cost)
        self.inflight_bytes += cost
        buf = self.server.pool.acquire(length)
        self._bufs[id(header)] = (buf, cost, tb)
        return memoryview(buf)[:length]

    def _admit(self, cost: int) -> bool:
        """Take ``cost`` from the connection's bound, then its tenant's budget, then the
        process's; else queue where it does not fit (reading stops until it does)."""
        server = self.server
        if self.inflight_bytes and self.inflight_bytes + cost > self._conn_bytes_max:
            self._conn_wait_bytes = cost
        elif not self._take_tenant(cost):
            pass  # queued at the tenant's budget
        elif server.budget.try_acquire(cost):
            self._tenant_held = 0
            return True
        else:
            self._budget_cancel = server.budget.wait(cost, lambda: self._on_grant(cost))
        self._reading_stopped = True  # the channel stops reading until the bytes are there
        return False

    def _take_tenant(self, cost: int) -> bool:
        tb = self.tenant_budget
        if tb is None or self._tenant_held:
            return True
        if tb.try_acquire(cost):
            self._tenant_held = cost
            return True
        self._budget_cancel = tb.wait(cost, lambda: self._on_tenant_grant(cost))
        return False

    def _on_tenant_grant(self, cost: int) -> None:
        """The tenant's budget granted ``cost``: now the process budget."""
        self._budget_cancel = None
        self._tenant_held = cost
        if self.channel.closed:
            self._drop_tenant_held()
            return
        budget = self.server.budget
        if budget.try_acquire(cost):
            self._tenant_held = 0
            self._granted_bytes = cost
            self._maybe_resume()
        else:
            self._budget_cancel = budget.wait(cost, lambda: self._on_grant(cost))

    def _drop_tenant_held(self) -> None:
        if self._tenant_held and self.tenant_budget is not None:
            self.tenant_budget.release(self._tenant_held)
        self._tenant_held = 0

    def _on_grant(self, cost: int) -> None:
        self._budget_cancel = None
        if self.channel.closed:
            self.server.budget.release(cost)
            self._drop_tenant_held()
            return
        self._tenant_held = 0
        self._granted_bytes = cost
        self._maybe_resume()

    def _on_budget_below_limit(self) -> None:
        self._budget_cancel = None
        self._maybe_resume()

    def _maybe_resume(self) -> None:
        if (self._reading_stopped and not self._count_paused and self._budget_cancel is None
                and not self._conn_wait_bytes and not self.channel.closed):
            self._reading_stopped = False
            self.channel.resume_reading()

    def _release(self, cost: int, tb: ByteBudget | None) -> None:
        self.inflight_bytes -= cost
        if tb is not None:
            tb.release(cost)
        budget = self.server.budget
        budget.used_bytes -= cost
        if budget.waiters:
            budget.wake()
        if self._conn_wait_bytes:
            self._conn_bytes_freed()

    def _conn_bytes_freed(self) -> None:
        wait = self._conn_wait_bytes
        if not self.inflight_bytes or self.inflight_bytes + wait <= self._conn_bytes_max:
            self._conn_wait_bytes = 0
            self._maybe_resume()

    @property
    def reading_held(self) -> bool:
        return self._reading_stopped

    # ---- FrameSink -------------------------------------------------------------------------
    def frame_received(self, kind: int, header: fr.Header, payload: memoryview, crc_ok: bool) -> None:
        if self.refused:
            return
        if kind != fr.KIND_REQUEST:
            logger.warning("%s: response frame from client %s; closing", self.server.name, self.channel.peer)
            self.channel.abort()
            return
        self.frames_in += 1
        if header.service == wa.SERVICE_AUTH:
            self._auth_frame(header)
            return
        entry = self._bufs.pop(id(header), None)
        if entry is None:  # no payload: the header's bytes are charged now, admitted regardless
            buf, cost, tb = None, header.wire_bytes, self.tenant_budget
            self.inflight_bytes += cost
            budget = self.server.budget
            budget.used_bytes += cost
            if tb is not None:
                tb.force(cost)
            if self._budget_cancel is None:
                if budget.used_bytes >= budget.limit_bytes:
                    self._budget_cancel = budget.wait(0, self._on_budget_below_limit)
                    self._stop_reading()
                elif tb is not None and tb.used_bytes >= tb.limit_bytes:
                    self._budget_cancel = tb.wait(0, self._on_budget_below_limit)
                    self._stop_reading()
        else:
            buf, cost, tb = entry
        self.inflight += 1
        if self.inflight >= self.server.limits.inflight_per_connection_max and not self._count_paused:
            self._count_paused = True
            self._stop_reading()
        self.start_request(header, payload, buf, crc_ok, cost, tb)

    def _stop_reading(self) -> None:
        if not self._reading_stopped:
            self._reading_stopped = True
            self.channel.pause_reading()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.server._connections.discard(self)
        for buf, cost, tb in self._bufs.values():
            self.server.pool.release(buf)
            self._release(cost, tb)
        self._bufs.clear()
        if self._budget_cancel is not None:
            self._budget_cancel()
            self._budget_cancel = None
        if self._granted_bytes:
            self.server.budget.release(self._granted_bytes)
            if self.tenant_budget is not None:
                self.tenant_budget.release(self._granted_bytes)
            self._granted_bytes = 0
        self._drop_tenant_held()
        if self._tenant is not None:
            self.server.tenant_budgets.detach(self._tenant)
            self._tenant = None

    # ---- authentication (``loomfs.wire.auth``) -------------------------------------------------
    def _auth_frame(self, header: fr.Header) -> None:
        """The handshake, answered inline: it completes before the next frame is looked at."""
        verifier = self.server.verifier
        try:
            if header.method == wa.HELLO.method and self._auth_step == 0:
                hello = wa.HelloReq.from_wire(header.body)
                if len(hello.client_nonce) != wa.NONCE_BYTES:
                    raise AuthError(Status.AUTH_FAILED, f"client nonce of {len(hello.client_nonce)} bytes")
                self._nonces = (new_nonce(), hello.client_nonce)
                self._auth_step = 1
                rsp = wa.HelloRsp(server_nonce=self._nonces[0], auth_required=verifier is not None)
                self._auth_send(header, Status.OK, "", rsp.to_wire(), close=False)
                return
            if header.method == wa.PROVE.method and self._auth_step == 1 and verifier is not None:
                prove = wa.ProveReq.from_wire(header.body)
                ok = verifier.verify(prove.claims, prove.proof, *self._nonces)
                self.identity, self.expires_at_s, self.authenticated = ok.identity, ok.expires_at_s, True
                if not ok.identity.privileged and self._tenant is None and not self.channel.closed:
                    self._tenant = ok.identity.tenant  # its connections share one budget
                    self.tenant_budget = self.server.tenant_budgets.attach(self._tenant)
                self._auth_step = 2
                logger.debug("%s: %s authenticated as %s", self.server.name, self.channel.peer,
                             ok.identity.token_id)
                rsp2 = wa.ProveRsp(server_proof=ok.server_proof, token_id=ok.identity.token_id)
                self._auth_send(header, Status.OK, "", rsp2.to_wire(), close=False)
                return
            raise AuthError(Status.AUTH_FAILED, f"handshake step {header.method} out of order")
        except StatusError as exc:
            self._auth_refused(header, Status.AUTH_FAILED, f"malformed handshake: {exc}")
        except AuthError as exc:
            self._auth_refused(header, exc.status, exc.reason)

    def _auth_refused(self, header: fr.Header, status: Status, reason: str) -> None:
        """Say why (one reply), log it, and close: a refused peer gets nothing else."""
        self.note_auth_refusal(status, reason)
        self._auth_send(header, status, reason, {}, close=True)
        self.refused = True  # read nothing more from this peer

    def note_auth_refusal(self, status: Status, reason: str) -> None:
        server = self.server
        server.auth_refused_total += 1
        n = server.auth_refused_total
        if n <= 16 or n & (n - 1) == 0:  # the first ones, then 32, 64...: no log flood
            logger.warning("%s: refused %s from %s: %s (%d refused so far)", server.name, status.name,
                           self.channel.peer, reason, n)

    def _auth_send(self, header: fr.Header, status: Status, message: str, body: dict[str, Any], *,
                   close: bool) -> None:
        out = fr.Header(header.service, header.method, header.request_id, 0, int(status), message, body)
        task = asyncio.get_running_loop().create_task(
            self._send_and_close(fr.encode(fr.KIND_RESPONSE, out)) if close else
            self.channel.send(fr.encode(fr.KIND_RESPONSE, out), None))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- limits ----------------------------------------------------------------------------
    def refuse(self) -> None:
        """Over the connection cap: say so (request id 0) and close; nothing is processed."""
        self.refused = True
        self.server._connections.discard(self)
        out = fr.Header(0, 0, 0, 0, int(Status.TOO_MANY_CONNECTIONS),
                        f"{self.server.name}: too many connections", {})
        task = asyncio.get_running_loop().create_task(self._send_refusal(fr.encode(fr.KIND_RESPONSE, out)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_and_close(self, frame: bytes) -> None:
        """Answer a refused peer, then close a little later: an abort right away can reset the
        connection before the peer read why (nothing more is read from it meanwhile)."""
        try:
            async with asyncio.timeout(1.0):
                await self.channel.send(frame, None)
        except (ConnectionError, OSError, TimeoutError):
            pass
        asyncio.get_running_loop().call_later(AUTH_CLOSE_DELAY_S, self.channel.abort)

    async def _send_refusal(self, frame: bytes) -> None:
        try:
            async with asyncio.timeout(1.0):
                await self.channel.send(frame, None)
        except (ConnectionError, OSError, TimeoutError):
            pass
        self.channel.abort()

    def partial_frame(self) -> bool:
        return bool(getattr(self.channel, "partial_frame", False))

    def release_buffer(self) -> None:
        release = getattr(self.channel, "release_idle_buffer", None)
        if release is not None:
            release()

    def close_for(self, reason: str) -> None:
        kind = reason.split(" ", 1)[0]
        closed = self.server.closed_total
        closed[kind] = closed.get(kind, 0) + 1
        logger.info("%s: closing connection from %s: %s", self.server.name, self.channel.peer, reason)
        self.channel.abort()
        self.connection_lost(None)  # the transport may report it later; our books close now
