"""RPC client: one multiplexed connection per peer, deadlines on every call, retry with
exponential backoff for idempotent methods, replies received straight into the caller's
buffer when one is given."""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any, Generic

from loomfs.common import trace
from loomfs.common.clock import LOOP_CLOCK, Clock
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
)
from loomfs.net.auth import client_proof, new_nonce, server_proof
from loomfs.net.buffers import DEFAULT_POOL, Buffer
from loomfs.net.credentials import Credential
from loomfs.net.limits import IDLE_TIMEOUT_S
from loomfs.net.rpc_base import (
    _EMPTY,
    M,
    RpcObserver,
    remote_error,
)
from loomfs.net.scatter import Scatter
from loomfs.net.transport import Address, Channel, Transport
from loomfs.wire import auth as wa
from loomfs.wire import frame as fr
from loomfs.wire.message import Message, Method
from loomfs.wire.status import Status, status_of

logger = logging.getLogger("loomfs.net.rpc")


@dataclass(slots=True)
class Response(Generic[M]):
    body: M
    payload: memoryview  # a view of recv_into when one was given (empty when scattered)
    payload_crc: int = 0  # CRC32C of the payload as sent and checked on arrival (0: no payload)
    scattered: int = 0  # payload bytes received into the call's ``Scatter`` (its whole length)


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[tuple[fr.Header, memoryview, bool]]
    recv_into: memoryview | Scatter | None


_SCATTERED = memoryview(bytearray(0))  # frame_received's mark: the payload went into the Scatter


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
        self._scattering = False  # the payload being received goes into a call's Scatter

    @property
    def idle(self) -> bool:
        return not self._pending

    # FrameSink
    def payload_buffer(self, kind: int, header: fr.Header, length: int) -> memoryview | Scatter:
        self._forget_payload()  # a frame whose end a sink dropped (fault injection's blackhole)
        p = self._pending.get(header.request_id)
        self._receiving = header.request_id
        dest = p.recv_into if p is not None else None
        if isinstance(dest, Scatter):
            if len(dest) == length:
                self._scattering = True
                return dest
            return memoryview(bytearray(length))  # not the length asked for: the caller copies
        if dest is not None and len(dest) >= length:
            return dest[:length]
        if p is None:  # a late reply nobody waits for (or a peer's invention): drain it into the pool
            self._scratch = DEFAULT_POOL.acquire(length)
            return memoryview(self._scratch)[:length]
        return memoryview(bytearray(length))

    def _forget_payload(self) -> None:
        """Drop the state ``payload_buffer`` set for a payload whose frame never reached
        ``frame_received``, so that it cannot apply to the next frame."""
        self._scattering = False
        if self._scratch is not None:
            scratch, self._scratch = self._scratch, None
            DEFAULT_POOL.release(scratch)

    def frame_received(self, kind: int, header: fr.Header, payload: memoryview, crc_ok: bool) -> None:
        receiving, self._receiving = self._receiving, 0
        if receiving != header.request_id:  # a frame without a payload: nothing was set for it
            self._forget_payload()
        if self._scattering:
            self._scattering = False
            payload = _SCATTERED
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
        recv_into: memoryview | Scatter | None = None,
        timeout_s: float,
    ) -> Response[Any]:
        if asyncio.current_task() is None:
            # called from an eager handler's first step (``net.rpc_eager``): ``asyncio.timeout``
            # needs a task to cancel, so the call runs in one of its own (cancelled with its waiter)
            return await asyncio.ensure_future(self.call(
                m, req, payload=payload, payload_crc=payload_crc, recv_into=recv_into, timeout_s=timeout_s))
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
        if rpayload is _SCATTERED:
            assert isinstance(recv_into, Scatter)
            return Response(body, _EMPTY, rh.payload_crc, recv_into.nbytes)
        if not len(rpayload):
            return Response(body, _EMPTY)
        return Response(body, rpayload, rh.payload_crc)


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
        if asyncio.current_task() is None:
            # an eager handler's first step (``net.rpc_eager``): the transport's connect may
            # use ``asyncio.timeout`` (TCP does), which needs a task; the whole lookup moves
            # into one, so two first steps in one loop step share one connect
            return await asyncio.ensure_future(self.connection(address))
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
        recv_into: memoryview | Scatter | None = None,
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
                self._observe(m, Status.OK, started, payload, len(rsp.payload) or rsp.scattered)
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
