"""How a server connection runs one request: the checks, the handler, the reply.

Two ways, same answers. The ordinary one runs each request in its own Task, its handler
under ``asyncio.timeout_at`` (the request's deadline). The eager one (``RpcServer(eager=
True)``, ``net.rpc_eager``) runs the checks and the handler's first step at once, inside the
frame callback, in a fresh copy of the context, and sends the reply from there when the
handler finished without suspending: no Task, no timer, no extra loop iteration. A handler
that suspends continues in a Task (same context, so ``contextvars`` tokens stay valid) under
the same deadline, measured from the same moment. Eager runs do not nest: a frame that
arrives while one runs (a budget wake-up resuming another connection's reading), or while a
Task is current, takes the Task way, so the stack stays flat and a handler never runs inside
someone else's task.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING, Any

from loomfs.common import trace
from loomfs.common.identity import Identity, Right
from loomfs.errors import LoomError, StatusError, status_for_exception
from loomfs.net.budget import ByteBudget
from loomfs.net.buffers import Buffer
from loomfs.net.rpc_base import CallContext, Handler, Reply
from loomfs.net.rpc_eager import first_step, resume
from loomfs.net.transport import Channel
from loomfs.wire import frame as fr
from loomfs.wire.message import Method
from loomfs.wire.status import AUTH_STATUSES, Status

if TYPE_CHECKING:
    from loomfs.net.rpc_server import RpcServer

logger = logging.getLogger("loomfs.net.rpc")

_Entry = tuple[Method, Handler, Right]
# what _finish needs besides the handler: header, payload, buffer, cost, tenant budget, entry, start time
_Args = tuple[fr.Header, memoryview, Buffer | None, int, ByteBudget | None, "_Entry | None", float]


_RESTARTED: Any = object()


class _Rest:
    """The rest of an eagerly started request whose handler suspended, in a Task. A Task
    cancelled before its first step (shutdown) never runs its coroutine: then the handler is
    cancelled where it waits, in a Task of its own, and answers as in any cancelled Task."""

    __slots__ = ("conn", "ctx", "args", "coro", "yielded", "deadline", "begun")

    def __init__(self, conn: RequestRunner, ctx: contextvars.Context, args: _Args,
                 coro: Coroutine[Any, Any, Any], yielded: Any, deadline: float | None):
        self.conn, self.ctx, self.args = conn, ctx, args
        self.coro, self.yielded, self.deadline = coro, yielded, deadline
        self.begun = False

    def start(self) -> None:
        conn = self.conn
        task = conn._loop.create_task(self._run(None, self.yielded), context=self.ctx)
        conn._track(task)
        task.add_done_callback(self._done)

    async def _run(self, throw: BaseException | None, yielded: Any) -> None:
        self.begun = True
        await self.conn._finish(*self.args, resume(self.coro, yielded, throw), self.deadline)

    def _done(self, task: asyncio.Task[None]) -> None:
        if not self.begun and task.cancelled() and self.yielded is not _RESTARTED:
            self.yielded, yielded = _RESTARTED, self.yielded  # once: a second early cancel leaves it
            task = self.conn._loop.create_task(self._run(asyncio.CancelledError(), yielded), context=self.ctx)
            self.conn._track(task)


class RequestRunner:
    """The request half of ``rpc_server._ServerConnection`` (which sets these attributes)."""

    server: RpcServer
    channel: Channel
    authenticated: bool
    identity: Identity
    expires_at_s: float
    inflight: int
    inflight_bytes: int
    _conn_wait_bytes: int
    _count_paused: bool
    _tasks: set[asyncio.Task[None]]
    _loop: asyncio.AbstractEventLoop

    if TYPE_CHECKING:
        def note_auth_refusal(self, status: Status, reason: str) -> None: ...
        def _conn_bytes_freed(self) -> None: ...
        def _maybe_resume(self) -> None: ...

    def start_request(self, header: fr.Header, payload: memoryview, buf: Buffer | None, crc_ok: bool, cost: int,
                      tb: ByteBudget | None) -> None:
        server = self.server
        if server.eager and not server.eager_running and asyncio.current_task(self._loop) is None:
            ctx = contextvars.copy_context()
            ctx.run(self._serve_now, ctx, header, payload, buf, crc_ok, cost, tb)
            return
        self._track(self._loop.create_task(self._serve(header, payload, buf, crc_ok, cost, tb)))

    def _track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- the two ways ------------------------------------------------------------------------
    def _serve_now(self, ctx: contextvars.Context, header: fr.Header, payload: memoryview, buf: Buffer | None,
                   crc_ok: bool, cost: int, tb: ByteBudget | None) -> None:
        """The eager way (inside ``ctx``): a Task only if the handler suspends."""
        server = self.server
        server.eager_running = True
        try:
            started = time.perf_counter()
            entry = self._begin(header)
            args: _Args = (header, payload, buf, cost, tb, entry, started)
            try:
                coro, deadline = self._handler_call(header, payload, crc_ok, entry)
            except BaseException as exc:
                try:
                    status, message = self._status_for(exc, header)
                finally:
                    self._release_request(buf, cost, tb)
                self._answer_now(args, None, status, message)
                return
            self._step(ctx, args, coro, deadline, again=True)
        except Exception:  # nothing may escape into the transport's callback (it would close the connection)
            logger.exception("%s: serving %s.%s from %s failed", server.name, header.service, header.method,
                             self.channel.peer)
        finally:
            server.eager_running = False

    def _step(self, ctx: contextvars.Context, args: _Args, coro: Coroutine[Any, Any, Any],
              deadline: float | None, *, again: bool) -> None:
        """Run the handler to its next suspension; answer if it finished. A handler that
        suspends on a bare yield (``asyncio.sleep(0)``: a writer waiting one loop turn for its
        group's COMMIT) is stepped ``again`` once from a loop callback, in ``ctx``, after what is
        ready now; otherwise (or the second time) the rest goes to a Task."""
        header, payload, buf, cost, tb, entry, started = args
        reply: Reply | None = None
        status, message = Status.OK, ""
        try:
            done, value = first_step(coro)
            if not done:  # it waits for something
                if again and value is None:
                    self._loop.call_soon(self._step_later, ctx, args, coro, deadline, context=ctx)
                else:  # the rest in a Task, in this same context
                    _Rest(self, ctx, args, coro, value, deadline).start()
                return
            reply = value if isinstance(value, Reply) else Reply(value)
        except BaseException as exc:
            try:
                status, message = self._status_for(exc, header)
            except BaseException:  # not a request's failure (KeyboardInterrupt...): re-raised, budget back
                self._release_request(buf, cost, tb)
                raise
        self._release_request(buf, cost, tb)
        self._answer_now(args, reply, status, message)

    def _step_later(self, ctx: contextvars.Context, args: _Args, coro: Coroutine[Any, Any, Any],
                    deadline: float | None) -> None:
        """(A loop callback, in ``ctx``.) The second step of an eager handler, as a Task's would
        run it (its deadline bites where the handler waits next, in the Task it then goes to);
        while another eager run is under way, the rest goes to a Task at once."""
        server = self.server
        if server.eager_running:
            _Rest(self, ctx, args, coro, None, deadline).start()
            return
        server.eager_running = True
        try:
            self._step(ctx, args, coro, deadline, again=False)
        except Exception:
            header = args[0]
            logger.exception("%s: serving %s.%s from %s failed", server.name, header.service, header.method,
                             self.channel.peer)
        finally:
            server.eager_running = False

    def _answer_now(self, args: _Args, reply: Reply | None, status: Status, message: str) -> None:
        """Encode and send the reply from here (a Task only if the socket is full or another
        reply is being sent), then the observers."""
        header, payload, _buf, _cost, _tb, entry, started = args
        frame, pay, status = self._encode(header, reply, status, message)
        send = None if self.channel.closed else self.channel.send(frame, pay)
        try:
            if send is not None:
                done, value = first_step(send)
                if not done:  # the socket is full or another reply is being sent: wait in a Task
                    self._track(self._loop.create_task(self._send_rest(
                        send, value, reply, entry, status, started, payload, pay)))
                    return  # the tail (``_sent``) is the Task's
        except (ConnectionError, OSError):
            pass
        except BaseException:
            self._sent(reply, entry, status, started, payload, pay, observe=False)
            raise
        self._sent(reply, entry, status, started, payload, pay)

    async def _serve(self, header: fr.Header, payload: memoryview, buf: Buffer | None, crc_ok: bool, cost: int,
                     tb: ByteBudget | None) -> None:
        """The Task way: the whole request in this task."""
        started = time.perf_counter()
        entry = self._begin(header)
        try:
            coro, deadline = self._handler_call(header, payload, crc_ok, entry)
        except BaseException as exc:
            try:
                status, message = self._status_for(exc, header)
            finally:
                self._release_request(buf, cost, tb)
            await self._reply(header, payload, entry, started, None, status, message)
            return
        await self._finish(header, payload, buf, cost, tb, entry, started, coro, deadline)

    async def _finish(self, header: fr.Header, payload: memoryview, buf: Buffer | None, cost: int,
                      tb: ByteBudget | None, entry: _Entry | None, started: float, call: Awaitable[Any],
                      deadline: float | None) -> None:
        """Await the handler (under the request's deadline), then reply."""
        reply: Reply | None = None
        status, message = Status.OK, ""
        try:
            if deadline is not None:
                async with asyncio.timeout_at(deadline):
                    result = await call
            else:
                result = await call
            reply = result if isinstance(result, Reply) else Reply(result)
        except BaseException as exc:
            status, message = self._status_for(exc, header)
        finally:
            self._release_request(buf, cost, tb)
        await self._reply(header, payload, entry, started, reply, status, message)

    # ---- the parts ---------------------------------------------------------------------------
    def _begin(self, header: fr.Header) -> _Entry | None:
        server = self.server
        server.requests_total += 1
        trace.TRACE.set(header.trace or trace.new_id())  # this request's context: logs and onward calls
        return server._handlers.get((header.service, header.method))

    def _handler_call(self, header: fr.Header, payload: memoryview, crc_ok: bool,
                      entry: _Entry | None) -> tuple[Coroutine[Any, Any, Any], float | None]:
        """The checks, then the handler's coroutine (not started) and the deadline; raises
        what becomes the reply's status."""
        server = self.server
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
            raise StatusError(Status.UNKNOWN_METHOD, f"no method {header.service}.{header.method} on {server.name}")
        m, handler, needs = entry
        identity = self.identity
        if needs and not identity.can(needs):
            why = f"{m.name} needs the {needs.name} right; token {identity.token_id or identity.uid} lacks it"
            self.note_auth_refusal(Status.EPERM, why)  # a credential's refusal (a handler's EPERM is not)
            raise StatusError(Status.EPERM, why)
        if not crc_ok:
            raise StatusError(Status.CHECKSUM_MISMATCH, "request payload failed CRC32C")
        req = m.request.from_wire(header.body)
        deadline = self._loop.time() + header.deadline_ms / 1000 if header.deadline_ms > 0 else None
        ctx = CallContext(payload, header.request_id, self.channel.peer, deadline, header.payload_crc, identity)
        return handler(req, ctx), deadline  # type: ignore[return-value]

    def _status_for(self, exc: BaseException, header: fr.Header) -> tuple[Status, str]:
        """The reply's status for what the checks or the handler raised (re-raises what is not
        a request's failure: KeyboardInterrupt, SystemExit)."""
        if isinstance(exc, TimeoutError):
            return Status.DEADLINE_EXCEEDED, "deadline exceeded on server"
        if isinstance(exc, LoomError):
            return status_for_exception(exc), str(exc.strerror or exc)
        if isinstance(exc, OSError):
            return status_for_exception(exc), str(exc)
        if isinstance(exc, asyncio.CancelledError):
            return Status.SHUTTING_DOWN, "server shutting down"
        name = self.server.name
        if isinstance(exc, OverflowError):  # an integer from the request does not fit (e.g. SQLite's int64)
            logger.warning("%s: %s.%s from %s: value out of range: %s", name, header.service, header.method,
                           self.channel.peer, exc)
            return Status.BAD_REQUEST, f"value out of range: {exc}"
        if isinstance(exc, Exception):
            logger.error("%s: handler for %s.%s failed", name, header.service, header.method, exc_info=exc)
            return Status.INTERNAL, f"{type(exc).__name__}: {exc}"
        raise exc

    def _release_request(self, buf: Buffer | None, cost: int, tb: ByteBudget | None) -> None:
        server = self.server
        if buf is not None:
            server.pool.release(buf)
        self.inflight -= 1
        self.inflight_bytes -= cost
        if tb is not None:
            tb.used_bytes -= cost
            if tb.waiters:
                tb.wake()
        budget = server.budget
        budget.used_bytes -= cost
        if budget.waiters:
            budget.wake()
        if self._conn_wait_bytes:
            self._conn_bytes_freed()
        if self._count_paused and self.inflight < server.limits.inflight_per_connection_max // 2:
            self._count_paused = False
            self._maybe_resume()

    def _encode(self, header: fr.Header, reply: Reply | None, status: Status,
                message: str) -> tuple[bytes, Any, Status]:
        """The reply frame (and its payload, sent after it)."""
        body: dict[str, Any] = {}
        if reply is not None and status is Status.OK:
            try:
                body = reply.body.to_wire()
            except Exception as exc:  # a reply the handler built wrong: say so, not silence
                logger.error("%s: reply to %s.%s does not encode", self.server.name, header.service,
                             header.method, exc_info=exc)
                status, message = Status.INTERNAL, f"reply does not encode: {type(exc).__name__}: {exc}"
        if status is not Status.OK:
            self.server.errors_total += 1
            if status in AUTH_STATUSES:
                # logged; the connection stays (it may still authenticate), bounded by the limits
                self.note_auth_refusal(status, message)
        out = fr.Header(header.service, header.method, header.request_id, 0, int(status), message, body)
        pay = reply.payload if reply is not None and status is Status.OK else None
        return fr.encode(fr.KIND_RESPONSE, out, pay, reply.payload_crc if reply else None), pay, status

    async def _reply(self, header: fr.Header, payload: memoryview, entry: _Entry | None, started: float,
                     reply: Reply | None, status: Status, message: str) -> None:
        frame, pay, status = self._encode(header, reply, status, message)
        try:
            if not self.channel.closed:
                await self.channel.send(frame, pay)
        except (ConnectionError, OSError):
            pass
        except BaseException:  # cancelled while sending: on_sent still runs
            self._sent(reply, entry, status, started, payload, pay, observe=False)
            raise
        self._sent(reply, entry, status, started, payload, pay)

    async def _send_rest(self, send: Coroutine[Any, Any, None], yielded: Any, reply: Reply | None,
                         entry: _Entry | None, status: Status, started: float, payload: memoryview,
                         pay: Any) -> None:
        try:
            await resume(send, yielded)
        except (ConnectionError, OSError):
            pass
        except BaseException:  # cancelled while sending: on_sent still runs
            self._sent(reply, entry, status, started, payload, pay, observe=False)
            raise
        self._sent(reply, entry, status, started, payload, pay)

    def _sent(self, reply: Reply | None, entry: _Entry | None, status: Status, started: float,
              payload: memoryview, pay: Any, *, observe: bool = True) -> None:
        """The tail of every reply, sent or not (the peer gone): the reply's ``on_sent``, then
        the observers (not when sending was interrupted: cancelled, the process stopping)."""
        if reply is not None and reply.on_sent is not None:
            reply.on_sent()
        if observe:
            self._observe(entry, status, started, payload, pay)

    def _observe(self, entry: _Entry | None, status: Status, started: float, payload: memoryview,
                 pay: Any) -> None:
        observers = self.server.observers
        if observers:
            name = entry[0].name if entry is not None else "unknown"
            elapsed = time.perf_counter() - started
            sent = len(pay) if pay is not None else 0
            for obs in observers:
                obs.on_call("server", name, int(status), elapsed, len(payload), sent)
