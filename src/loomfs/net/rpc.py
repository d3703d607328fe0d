"""RPC over frames: a server that dispatches by (service, method) and a pooled client.

Servers: every request runs in its own task (bounded per connection, reading pauses past
the bound); unknown methods, undecodable bodies and bad payload CRCs get an error status;
handler exceptions become status codes (never pickled); a broken peer only loses its own
connection. Clients: one multiplexed connection per peer, deadlines on every call, retry
with exponential backoff for idempotent methods, replies received straight into the
caller's buffer when one is given.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from loomfs.common import trace
from loomfs.common.clock import LOOP_CLOCK, Clock
from loomfs.common.identity import TRUSTED, Identity, Right
from loomfs.common.retry import Backoff
from loomfs.errors import (
    ConnectionFailed,
    ConnectRefused,
    LoomError,
    PermissionDenied,
    ProtocolError,
    StatusError,
    TimedOut,
    from_status,
    status_for_exception,
)
from loomfs.net.auth import UNAUTHENTICATED, AuthError, client_proof, new_nonce, server_proof
from loomfs.net.budget import PROCESS_BUDGET, ByteBudget
from loomfs.net.buffers import DEFAULT_POOL, Buffer, BufferPool
from loomfs.net.credentials import Credential
from loomfs.net.limits import IDLE_TIMEOUT_S, ServerLimits, sweep_forever
from loomfs.net.policy import needs_of
from loomfs.net.transport import Address, Channel, Listener, Transport
from loomfs.wire import auth as wa
from loomfs.wire import frame as fr
from loomfs.wire.message import Message, Method
from loomfs.wire.status import AUTH_STATUSES, Status, status_of

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)

_EMPTY = memoryview(b"")
AUTH_CLOSE_DELAY_S = 1.0  # a peer refused for its credentials is closed this long after the answer


def remote_error(code: int, message: str) -> LoomError:
    """The exception for a non-OK reply; refused credentials are EACCES (PermissionError)."""
    status = status_of(code)
    if status in AUTH_STATUSES:
        exc: LoomError = PermissionDenied(f"{status.name}: {message}")
        exc.status = status
        return exc
    return from_status(code, message)


@dataclass(slots=True)
class CallContext:
    """What a handler gets besides the decoded request."""

    payload: memoryview
    request_id: int
    peer: str
    deadline: float | None  # loop.time() by which the reply is due; None = no deadline
    payload_crc: int = 0  # CRC32C of ``payload``, already verified by the framing layer
    # who the connection authenticated as (``loomfs.common.identity``); TRUSTED without auth
    identity: Identity = TRUSTED


@dataclass(slots=True)
class Reply:
    """A handler's answer when it has a payload to send."""

    body: Message
    payload: bytes | bytearray | memoryview | None = None
    payload_crc: int | None = None  # precomputed (e.g. the stored chunk CRC)
    on_sent: Callable[[], None] | None = None  # e.g. give a pooled buffer back


Handler = Callable[[Any, CallContext], Awaitable[Message | Reply]]


class RpcObserver(Protocol):
    """Told about every finished call (metrics). ``side`` is "server" or "client";
    ``method`` the method's name ("stat", "write", ... or "unknown")."""

    def on_call(
        self, side: str, method: str, status: int, seconds: float, bytes_in: int, bytes_out: int
    ) -> None: ...


def handles(m: Method) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a service coroutine as the handler of ``m``: ``@handles(STAT)``."""

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.__loomfs_method__ = m  # type: ignore[attr-defined]
        return fn

    return mark


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
    ):
        """``limits``: connection cap, per-connection bounds and timeouts; ``budget``: the
        bytes of request payloads (and headers) all servers of this process may hold."""
        self.name = name
        self.transport = transport
        limits = limits or ServerLimits()
        if inflight_per_connection_max is not None:
            limits = dataclasses.replace(limits, inflight_per_connection_max=inflight_per_connection_max)
        self.limits = limits
        self.inflight_per_connection_max = limits.inflight_per_connection_max
        self.budget = budget
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


class _ServerConnection:
    def __init__(self, server: RpcServer, channel: Channel):
        self.server = server
        self.channel = channel
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
        self._bufs: dict[int, tuple[Buffer, int]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # sweeper state (net.limits)
        self.seen_frames = 0
        self.active_at = asyncio.get_running_loop().time()
        self.partial_since: float | None = None

    # ---- admission -------------------------------------------------------------------------
    def payload_buffer(self, kind: int, header: fr.Header, length: int) -> memoryview | None:
        if header.service == wa.SERVICE_AUTH:  # the handshake has no payloads
            self._auth_refused(header, Status.AUTH_FAILED, "payload in a handshake frame")
            return None
        cost = length + header.wire_bytes
        budget = self.server.budget
        used = budget.used_bytes
        if self._granted_bytes:
            self._granted_bytes = 0  # the budget took ``cost`` for us while we waited
        elif (self.refused or budget.waiters or (used and used + cost > budget.limit_bytes)
              or (self.inflight_bytes and self.inflight_bytes + cost > self._conn_bytes_max)):
            if self.refused or not self._admit(cost):
                return None
        else:  # the common case, inlined (this runs for every request with a payload)
            used += cost
            budget.used_bytes = used
            if used > budget.peak_bytes:
                budget.peak_bytes = used
        self.inflight_bytes += cost
        buf = self.server.pool.acquire(length)
        self._bufs[id(header)] = (buf, cost)
        return memoryview(buf)[:length]

    def _admit(self, cost: int) -> bool:
        server = self.server
        if self.inflight_bytes and self.inflight_bytes + cost > self._conn_bytes_max:
            self._conn_wait_bytes = cost
        elif server.budget.try_acquire(cost):
            return True
        else:
            self._budget_cancel = server.budget.wait(cost, lambda: self._on_grant(cost))
        self._reading_stopped = True  # the channel stops reading until the bytes are there
        return False

    def _on_grant(self, cost: int) -> None:
        self._budget_cancel = None
        if self.channel.closed:
            self.server.budget.release(cost)
            return
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

    def _release(self, cost: int) -> None:
        self.inflight_bytes -= cost
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
            buf, cost = None, header.wire_bytes
            self.inflight_bytes += cost
            budget = self.server.budget
            budget.used_bytes += cost
            if budget.used_bytes >= budget.limit_bytes and self._budget_cancel is None:
                self._budget_cancel = budget.wait(0, self._on_budget_below_limit)
                self._stop_reading()
        else:
            buf, cost = entry
        self.inflight += 1
        if self.inflight >= self.server.limits.inflight_per_connection_max and not self._count_paused:
            self._count_paused = True
            self._stop_reading()
        task = asyncio.get_running_loop().create_task(self._handle(header, payload, buf, crc_ok, cost))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _stop_reading(self) -> None:
        if not self._reading_stopped:
            self._reading_stopped = True
            self.channel.pause_reading()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.server._connections.discard(self)
        for buf, cost in self._bufs.values():
            self.server.pool.release(buf)
            self._release(cost)
        self._bufs.clear()
        if self._budget_cancel is not None:
            self._budget_cancel()
            self._budget_cancel = None
        if self._granted_bytes:
            self.server.budget.release(self._granted_bytes)
            self._granted_bytes = 0

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
            await asyncio.wait_for(self.channel.send(frame, None), 1.0)
        except (ConnectionError, OSError, TimeoutError):
            pass
        asyncio.get_running_loop().call_later(AUTH_CLOSE_DELAY_S, self.channel.abort)

    async def _send_refusal(self, frame: bytes) -> None:
        try:
            await asyncio.wait_for(self.channel.send(frame, None), 1.0)
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

    async def _handle(
        self, header: fr.Header, payload: memoryview, buf: Buffer | None, crc_ok: bool, cost: int
    ) -> None:
        server = self.server
        server.requests_total += 1
        reply: Reply | None = None
        status, message = Status.OK, ""
        started = time.perf_counter()
        entry = server._handlers.get((header.service, header.method))
        trace.TRACE.set(header.trace or trace.new_id())  # this task's context: logs and onward calls
        try:
            # nothing from a peer that has not authenticated is decoded or handled
            if not self.authenticated:
                raise StatusError(Status.AUTH_REQUIRED, f"{server.name} needs credentials: give the client a "
                                  "token (LOOMFS_TOKEN_FILE or rpc.token_file), or the service the cluster secret")
            if self.expires_at_s and server.verifier is not None:  # a token's connection
                if server.verifier.wall_clock() > self.expires_at_s:
                    raise StatusError(Status.AUTH_EXPIRED, f"token {self.identity.token_id} expired; "
                                      "reconnect with a new one")
                if server.verifier.is_revoked(self.identity.token_id):
                    raise StatusError(Status.AUTH_REVOKED, f"token {self.identity.token_id} is revoked")
            if entry is None:
                raise StatusError(
                    Status.UNKNOWN_METHOD, f"no method {header.service}.{header.method} on {server.name}"
                )
            m, handler, needs = entry
            identity = self.identity
            if needs and not identity.can(needs):
                why = f"{m.name} needs the {needs.name} right; token {identity.token_id or identity.uid} lacks it"
                self.note_auth_refusal(Status.EPERM, why)  # a credential's refusal (a handler's EPERM is not)
                raise StatusError(Status.EPERM, why)
            if not crc_ok:
                raise StatusError(Status.CHECKSUM_MISMATCH, "request payload failed CRC32C")
            req = m.request.from_wire(header.body)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + header.deadline_ms / 1000 if header.deadline_ms > 0 else None
            ctx = CallContext(payload, header.request_id, self.channel.peer, deadline, header.payload_crc, identity)
            if deadline is not None:
                async with asyncio.timeout_at(deadline):
                    result = await handler(req, ctx)
            else:
                result = await handler(req, ctx)
            reply = result if isinstance(result, Reply) else Reply(result)
        except TimeoutError:
            status, message = Status.DEADLINE_EXCEEDED, "deadline exceeded on server"
        except LoomError as exc:
            status, message = status_for_exception(exc), str(exc.strerror or exc)
        except OSError as exc:
            status, message = status_for_exception(exc), str(exc)
        except asyncio.CancelledError:
            status, message = Status.SHUTTING_DOWN, "server shutting down"
        except OverflowError as exc:  # an integer from the request does not fit (e.g. SQLite's int64)
            logger.warning("%s: %s.%s from %s: value out of range: %s", server.name, header.service,
                           header.method, self.channel.peer, exc)
            status, message = Status.BAD_REQUEST, f"value out of range: {exc}"
        except Exception as exc:
            logger.exception("%s: handler for %s.%s failed", server.name, header.service, header.method)
            status, message = Status.INTERNAL, f"{type(exc).__name__}: {exc}"
        finally:
            if buf is not None:
                server.pool.release(buf)
            self.inflight -= 1
            self.inflight_bytes -= cost  # _release, inlined
            budget = server.budget
            budget.used_bytes -= cost
            if budget.waiters:
                budget.wake()
            if self._conn_wait_bytes:
                self._conn_bytes_freed()
            if self._count_paused and self.inflight < server.limits.inflight_per_connection_max // 2:
                self._count_paused = False
                self._maybe_resume()
        if status is not Status.OK:
            server.errors_total += 1
            if status in AUTH_STATUSES:
                # logged; the connection stays (it may still authenticate), bounded by the limits
                self.note_auth_refusal(status, message)
        body = reply.body.to_wire() if reply is not None and status is Status.OK else {}
        out = fr.Header(header.service, header.method, header.request_id, 0, int(status), message, body)
        pay = reply.payload if reply is not None and status is Status.OK else None
        try:
            if not self.channel.closed:
                await self.channel.send(
                    fr.encode(fr.KIND_RESPONSE, out, pay, reply.payload_crc if reply else None), pay
                )
        except (ConnectionError, OSError):
            pass
        finally:
            if reply is not None and reply.on_sent is not None:
                reply.on_sent()
        if server.observers:
            name = entry[0].name if entry is not None else "unknown"
            elapsed = time.perf_counter() - started
            sent = len(pay) if pay is not None else 0
            for obs in server.observers:
                obs.on_call("server", name, int(status), elapsed, len(payload), sent)


# ---------------------------------------------------------------------------------------
# client side


@dataclass(slots=True)
class Response(Generic[M]):
    body: M
    payload: memoryview  # a view of recv_into when one was given


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[tuple[fr.Header, memoryview, bool]]
    recv_into: memoryview | None


class ClientConnection:
    """One multiplexed connection to a peer."""

    _ids = itertools.count(1)

    def __init__(self, address: Address):
        self.address = address
        self.channel: Channel | None = None
        self._pending: dict[int, _Pending] = {}
        self._receiving: int = 0  # request id whose payload is being received, 0 = none
        self._refusal = ""  # why the server refused this connection (TOO_MANY_CONNECTIONS)
        self.closed = False
        self.used_at = float("inf")  # clock time of the last call (set by RpcClient)
        self._scratch: Buffer | None = None  # pooled buffer draining an unwanted reply payload

    @property
    def idle(self) -> bool:
        return not self._pending

    # FrameSink
    def payload_buffer(self, kind: int, header: fr.Header, length: int) -> memoryview:
        p = self._pending.get(header.request_id)
        self._receiving = header.request_id
        if p is not None and p.recv_into is not None and len(p.recv_into) >= length:
            return p.recv_into[:length]
        if p is None:  # a late reply nobody waits for (or a peer's invention): drain it into the pool
            self._scratch = DEFAULT_POOL.acquire(length)
            return memoryview(self._scratch)[:length]
        return memoryview(bytearray(length))

    def frame_received(self, kind: int, header: fr.Header, payload: memoryview, crc_ok: bool) -> None:
        self._receiving = 0
        if self._scratch is not None:
            scratch, self._scratch = self._scratch, None
            payload.release()
            DEFAULT_POOL.release(scratch)
            payload = _EMPTY
        if kind != fr.KIND_RESPONSE:
            logger.warning("request frame from server %s; closing", self.address)
            self.abort()
            return
        if header.request_id == 0 and header.status != Status.OK:  # the server refuses this connection
            self._refusal = f"{header.message or status_of(header.status).name}"
            self.abort()
            self.connection_lost(None)
            return
        p = self._pending.pop(header.request_id, None)
        if p is not None and not p.future.done():
            p.future.set_result((header, payload, crc_ok))

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        pending, self._pending = self._pending, {}
        for p in pending.values():
            if not p.future.done():
                if self._refusal:  # refused before anything was processed: safe to retry
                    p.future.set_exception(ConnectRefused(f"{self.address} refused: {self._refusal}"))
                else:
                    p.future.set_exception(ConnectionFailed(f"connection to {self.address} lost"))

    def abort(self) -> None:
        self.closed = True
        if self.channel is not None:
            self.channel.abort()

    async def authenticate(self, cred: Credential, *, timeout_s: float) -> None:
        """The handshake (``loomfs.wire.auth``): two round trips, once per connection."""
        client_nonce = new_nonce()
        hello = (await self.call(wa.HELLO, wa.HelloReq(client_nonce=client_nonce), timeout_s=timeout_s)).body
        if not hello.auth_required:
            return  # a server without a cluster secret: every caller is trusted there
        if len(hello.server_nonce) != wa.NONCE_BYTES:
            raise ProtocolError(f"{self.address}: bad server nonce in the handshake")
        proof = client_proof(cred.key, hello.server_nonce, client_nonce)
        rsp = (await self.call(wa.PROVE, wa.ProveReq(claims=cred.claims.to_wire(), proof=proof),
                               timeout_s=timeout_s)).body
        if rsp.server_proof != server_proof(cred.key, hello.server_nonce, client_nonce):
            raise PermissionDenied(f"{self.address} did not prove the cluster secret: not a LoomFS server of "
                                   "this cluster")

    async def call(
        self,
        m: Method,
        req: Message,
        *,
        payload: bytes | bytearray | memoryview | None = None,
        payload_crc: int | None = None,
        recv_into: memoryview | None = None,
        timeout_s: float,
    ) -> Response[Any]:
        if self.closed or self.channel is None or self.channel.closed:
            if self._refusal:
                raise ConnectRefused(f"{self.address} refused: {self._refusal}")
            raise ConnectionFailed(f"connection to {self.address} is closed")
        rid = next(self._ids)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[fr.Header, memoryview, bool]] = loop.create_future()
        self._pending[rid] = _Pending(fut, recv_into)
        header = fr.Header(m.service, m.method, rid, max(1, int(timeout_s * 1000)), 0, "", req.to_wire(),
                           0, trace.outgoing())
        try:
            # the send is inside the deadline too: a peer that stopped reading (a cut link, a
            # hung process) fills the socket buffer and the send waits for room
            async with asyncio.timeout(timeout_s):
                try:
                    await self.channel.send(fr.encode(fr.KIND_REQUEST, header, payload, payload_crc), payload)
                except asyncio.CancelledError:
                    self.abort()  # stopped mid-frame: the stream cannot be used any more
                    raise
                rh, rpayload, crc_ok = await fut
        except TimeoutError as exc:
            self._pending.pop(rid, None)
            if self._receiving == rid:
                # the reply is landing in the caller's buffer right now; only closing stops it
                self.abort()
            raise TimedOut(f"{m.name} to {self.address} timed out after {timeout_s:.3g}s") from exc
        except (ConnectionError, OSError) as exc:
            self._pending.pop(rid, None)
            if isinstance(exc, LoomError):
                raise
            raise ConnectionFailed(f"{m.name} to {self.address}: {exc}") from exc
        except BaseException:
            self._pending.pop(rid, None)
            if self._receiving == rid:
                self.abort()
            raise
        if rh.status != Status.OK:
            raise remote_error(rh.status, rh.message)
        if not crc_ok:
            exc2 = from_status(Status.CHECKSUM_MISMATCH, f"{m.name} reply from {self.address} failed CRC32C")
            raise exc2
        try:
            body = m.response.from_wire(rh.body)
        except StatusError as exc:
            raise ProtocolError(f"bad {m.name} reply from {self.address}: {exc}") from exc
        return Response(body, rpayload if len(rpayload) else _EMPTY)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts_max: int = 6
    backoff_initial_s: float = 0.05
    backoff_max_s: float = 2.0
    retry_statuses: frozenset[Status] = field(
        default_factory=lambda: frozenset({Status.SHUTTING_DOWN, Status.EAGAIN, Status.CHECKSUM_MISMATCH})
    )

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        return Backoff(self.backoff_initial_s, self.backoff_max_s).delay_s(attempt, rng)


class RpcClient:
    """Connection pool + deadlines + retries. One per process (or per event loop)."""

    def __init__(
        self,
        transport: Transport,
        *,
        connect_timeout_s: float = 3.0,
        call_timeout_s: float = 30.0,
        retry: RetryPolicy | None = None,
        rng: random.Random | None = None,
        clock: Clock = LOOP_CLOCK,
        idle_reconnect_s: float = IDLE_TIMEOUT_S / 2,
    ):
        """``rng`` (retry jitter) and ``clock`` (deadlines; default: the running loop's clock,
        the one ``asyncio.timeout`` uses) are seams for the simulator. A connection unused for
        ``idle_reconnect_s`` is replaced before the next call, so a call never races a server
        closing it for idleness (which could fail a call that may not be retried)."""
        self.transport = transport
        self.clock = clock
        self.idle_reconnect_s = idle_reconnect_s
        self.connect_timeout_s = connect_timeout_s
        self.call_timeout_s = call_timeout_s
        self.retry = retry or RetryPolicy()
        self._rng = rng or random.Random()
        # what this client proves at connect (``loomfs.net.auth``): the service key or a token
        self._auth = getattr(transport, "auth", None)
        self._conns: dict[Address, ClientConnection] = {}
        self._connecting: dict[Address, asyncio.Future[ClientConnection]] = {}
        self.calls_total = 0
        self.retries_total = 0
        self.observers: list[RpcObserver] = []

    @property
    def credential(self) -> Credential | None:
        """What this client proves at connect (``loomfs.net.auth``): the service key or a token
        (its file read again when it changed, so a renewed token serves new connections)."""
        return self._auth.outgoing() if self._auth is not None else None

    async def connection(self, address: Address) -> ClientConnection:
        while True:
            conn = self._conns.get(address)
            if conn is not None and not conn.closed:
                return conn
            waiting = self._connecting.get(address)
            if waiting is None:
                return await self._connect(address)
            try:
                return await asyncio.shield(waiting)
            except asyncio.CancelledError:
                # the caller that was connecting was cancelled (its request abandoned): that
                # is no reason to give up ours — connect again, unless we are cancelled too
                task = asyncio.current_task()
                if not waiting.cancelled() or (task is not None and task.cancelling()):
                    raise

    async def _connect(self, address: Address) -> ClientConnection:
        fut: asyncio.Future[ClientConnection] = asyncio.get_running_loop().create_future()
        self._connecting[address] = fut
        try:
            conn = ClientConnection(address)
            conn.channel = await self.transport.connect(
                address, lambda ch: conn, timeout_s=self.connect_timeout_s
            )
            credential = self.credential
            if credential is not None:
                try:
                    await conn.authenticate(credential, timeout_s=self.connect_timeout_s)
                except BaseException:
                    conn.abort()
                    raise
            self._conns[address] = conn
            fut.set_result(conn)
            return conn
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved
            raise
        finally:
            self._connecting.pop(address, None)

    async def call(
        self,
        address: Address,
        m: Method,
        req: Message,
        *,
        payload: bytes | bytearray | memoryview | None = None,
        payload_crc: int | None = None,
        recv_into: memoryview | None = None,
        timeout_s: float | None = None,
        retry: bool | None = None,
    ) -> Response[Any]:
        """Call ``m`` at ``address``.

        ``retry=None``: idempotent methods retry transient failures (``attempts_max``) and
        every method retries refused connects until the deadline; ``True``: retry transient
        failures (``attempts_max``) whatever the method; ``False``: one attempt only.
        """
        timeout_s = self.call_timeout_s if timeout_s is None else timeout_s
        deadline = self.clock.monotonic() + timeout_s
        may_retry = m.idempotent if retry is None else retry
        attempt = 0
        while True:
            self.calls_total += 1
            remaining = deadline - self.clock.monotonic()
            try:
                if remaining <= 0:
                    raise TimedOut(f"{m.name} to {address}: deadline passed")
                conn = self._conns.get(address)
                now = deadline - remaining
                if conn is None or conn.closed or now - conn.used_at > self.idle_reconnect_s:
                    if conn is not None and not conn.closed and conn.idle:
                        self.drop(address)  # idle too long: the server may be about to close it
                    conn = await self.connection(address)
                conn.used_at = now
                started = time.perf_counter()
                try:
                    rsp = await conn.call(
                        m, req, payload=payload, payload_crc=payload_crc, recv_into=recv_into,
                        timeout_s=remaining,
                    )
                except LoomError as exc:
                    self._observe(m, exc.status or Status.EIO, started, payload, 0)
                    if exc.status in (Status.AUTH_EXPIRED, Status.AUTH_REVOKED):
                        self.drop(address)  # the next call connects again (with a renewed token file)
                    raise
                self._observe(m, Status.OK, started, payload, len(rsp.payload))
                return rsp
            except (ConnectionFailed, TimedOut, LoomError) as exc:
                transient = isinstance(exc, ConnectionFailed | TimedOut) or (
                    exc.status in self.retry.retry_statuses
                )
                attempt += 1
                # a refused connect never sent the request: with the default policy any
                # method retries it until the deadline (a peer that is restarting)
                patient = retry is None and isinstance(exc, ConnectRefused)
                if not patient and not (may_retry and transient and attempt < self.retry.attempts_max):
                    raise
                delay = min(self.retry.delay_s(attempt - 1, self._rng), max(0.0, deadline - self.clock.monotonic()))
                if delay <= 0:
                    raise
                self.retries_total += 1
                logger.debug("retrying %s to %s after %s (attempt %d)", m.name, address, exc, attempt)
                await asyncio.sleep(delay)

    def _observe(self, m: Method, status: int, started: float,
                 payload: bytes | bytearray | memoryview | None, received: int) -> None:
        if self.observers:
            elapsed = time.perf_counter() - started
            sent = len(payload) if payload is not None else 0
            for obs in self.observers:
                obs.on_call("client", m.name, int(status), elapsed, received, sent)

    def drop(self, address: Address) -> None:
        conn = self._conns.pop(address, None)
        if conn is not None:
            conn.abort()

    async def close(self) -> None:
        for conn in list(self._conns.values()):
            conn.abort()
        self._conns.clear()

    def __repr__(self) -> str:
        return f"RpcClient(conns={len(self._conns)} calls={self.calls_total} retries={self.retries_total})"
