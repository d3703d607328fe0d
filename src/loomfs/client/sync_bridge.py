"""The bridge under the blocking API (``sync.LoomFS``): the async core on one daemon
event-loop thread named ``loomfs-io``, calls submitted to it from the caller's thread.

Calls from that thread are refused (they would deadlock). After ``os.fork()`` (DataLoader
workers) the bridge sees the pid changed and starts a fresh loop and client in the child;
file objects opened before the fork are not usable there.
"""

from __future__ import annotations

import _thread
import asyncio
import atexit
import contextvars
import logging
import os
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Self, TypeVar

from loomfs.client.core import AsyncClient
from loomfs.client.fastpath import SyncMetaPath
from loomfs.client.file import AsyncFile
from loomfs.client.meta_client import MetaClient
from loomfs.common import trace
from loomfs.errors import LoomError

logger = logging.getLogger(__name__)

T = TypeVar("T")
LOOP_THREAD_NAME = "loomfs-io"
CLOSE_WAIT_S = 60.0
CANCEL_WAIT_S = 10.0  # an interrupted blocking call waits this long for its work to stop
ClientFactory = Callable[[], Awaitable[AsyncClient]]

_lock = threading.Lock()


_PID = [os.getpid()]  # this process's pid, kept by the fork hook (no getpid per call)


def _reset_lock() -> None:
    global _lock
    _lock = threading.Lock()
    _PID[0] = os.getpid()


os.register_at_fork(after_in_child=_reset_lock)


def _close_at_exit(ref: weakref.ref[SyncBridge]) -> None:
    fs = ref()
    if fs is not None:
        fs.close()


def _new_loop() -> asyncio.AbstractEventLoop:
    """asyncio's loop; uvloop only when asked (LOOMFS_UVLOOP=1): measured here it was not
    faster, and asyncio's loop lets large sends skip the transport's buffer copy."""
    if os.environ.get("LOOMFS_UVLOOP") == "1":
        try:
            import uvloop

            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
            return loop
        except ImportError:
            logger.warning("LOOMFS_UVLOOP=1 but uvloop is not installed (pip install loomfs[uvloop])")
    return asyncio.new_event_loop()


class SyncBridge:
    """The loop thread, the client on it, and the hop to it (``_submit``); ``LoomFS``
    builds the blocking calls on it."""

    def __init__(self, address: str | None, client_factory: ClientFactory):
        self.address = address
        self._factory = client_factory
        self._pid = -1
        self._generation = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._loop_ident = -1  # the loop thread's ident (_check_thread: one compare per call)
        self._client: AsyncClient | None = None
        self._fast: SyncMetaPath | None = None  # caller-thread metadata reads
        self._metrics: Any = None  # loomfs.metrics.ServiceMetrics once serve_metrics() ran
        self.closed = False
        self._ensure()
        atexit.register(_close_at_exit, weakref.ref(self))

    # --- the loop thread ----------------------------------------------------------------

    def _ensure(self) -> AsyncClient:
        if self._pid == _PID[0] and self._client is not None:
            return self._client
        if self.closed:
            raise ValueError("LoomFS client is closed")
        with _lock:
            if self._pid == os.getpid() and self._client is not None:
                return self._client
            if self._pid != -1:
                logger.info("pid changed (%d -> %d): starting a fresh LoomFS client", self._pid, os.getpid())
            loop = _new_loop()
            thread = threading.Thread(target=loop.run_forever, name=LOOP_THREAD_NAME, daemon=True)
            thread.start()
            try:
                client = asyncio.run_coroutine_threadsafe(self._connect(), loop).result()
            except BaseException:
                loop.call_soon_threadsafe(loop.stop)
                thread.join(5.0)
                raise
            self._loop, self._thread, self._client = loop, thread, client
            self._loop_ident = thread.ident if thread.ident is not None else -1
            meta = getattr(client, "meta", None)
            self._fast = SyncMetaPath(meta) if isinstance(meta, MetaClient) and meta.rpc is not None else None
            self._generation += 1
            self._pid = os.getpid()
            return client

    async def _connect(self) -> AsyncClient:
        return await self._factory()

    def _submit(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop thread and block until it finishes.

        Leaner than ``run_coroutine_threadsafe`` (one futex wait, no chained futures):
        sequential small calls are bound by this hop, ~10% of a ``stat``.
        """
        loop = self._loop
        assert loop is not None
        done = _thread.allocate_lock()
        done.acquire()
        box: list[asyncio.Task[T]] = []

        def finished(task: asyncio.Task[T]) -> None:
            done.release()

        ctx = contextvars.copy_context()
        ctx.run(trace.TRACE.set, trace.new_id())  # one trace id for all RPCs of this call

        def start() -> None:
            task = loop.create_task(coro, context=ctx)
            box.append(task)
            task.add_done_callback(finished)

        loop.call_soon_threadsafe(start)
        try:
            done.acquire()
        except BaseException:  # e.g. KeyboardInterrupt while waiting: stop the work too
            # callbacks run in FIFO order, so start() has created the task by then
            loop.call_soon_threadsafe(lambda: box[0].cancel())
            # and wait for it to end: until then its reads may still land in the caller's
            # buffers (``readinto``, a KV cache's ``into=``); bounded, and a second interrupt
            # stops the wait
            try:
                done.acquire(timeout=CANCEL_WAIT_S)
            except BaseException:
                pass
            raise
        task = box[0]
        if task.cancelled():
            raise LoomError("operation cancelled", errno=125)
        return task.result()

    def _check_thread(self) -> None:
        if _thread.get_ident() == self._loop_ident and threading.current_thread() is self._thread:
            raise RuntimeError(
                "blocking LoomFS call from its own event loop thread 'loomfs-io' would deadlock; "
                "use the AsyncClient (fs.client) there"
            )

    def _run(self, make: Callable[[AsyncClient], Coroutine[Any, Any, T]]) -> T:
        self._check_thread()
        client = self._ensure()
        return self._submit(make(client))

    def _run_file(self, generation: int, make: Callable[[], Awaitable[T]]) -> T:
        self._check_thread()
        self._ensure()
        if generation != self._generation:
            raise LoomError("file was opened before fork (or by a closed client); reopen it", errno=9)

        async def call() -> T:
            return await make()

        return self._submit(call())

    def _close_file(self, generation: int, afile: AsyncFile) -> None:
        if generation != self._generation or self._pid != os.getpid() or self._loop is None:
            return  # the loop that owned it is gone
        if self._thread is not None and threading.current_thread() is self._thread:
            self._loop.create_task(afile.close())  # e.g. garbage-collected on the loop thread
            return
        if not self._loop.is_running():
            return
        self._submit(afile.close())

    @property
    def client(self) -> AsyncClient:
        """The async core (use it from coroutines on the loop thread)."""
        return self._ensure()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        self._ensure()
        assert self._loop is not None
        return self._loop

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._pid != os.getpid() or self._loop is None or self._client is None:
            return
        loop, client, thread = self._loop, self._client, self._thread
        try:
            if loop.is_running():
                if self._metrics is not None:
                    asyncio.run_coroutine_threadsafe(self._metrics.close(), loop).result(CLOSE_WAIT_S)
                    self._metrics = None
                asyncio.run_coroutine_threadsafe(client.close(), loop).result(CLOSE_WAIT_S)
        except Exception as exc:
            logger.warning("closing LoomFS client: %s", exc)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None and thread is not threading.current_thread():
                thread.join(5.0)
            self._client = None
            if self._fast is not None:
                self._fast.close()
                self._fast = None

    def serve_metrics(self, port: int = 0, host: str = "127.0.0.1") -> int:
        """Serve this client's Prometheus /metrics (RPC counts, bytes and latency, read-ahead
        and buffer-pool hits/misses, retries); returns the bound port (0 = any free one)."""
        from loomfs.metrics import ClientCollector, start_service_metrics

        if self._metrics is None:
            client = self._ensure()
            self._metrics = self._submit(start_service_metrics(
                "client", None, client.rpc, port=port, host=host, collectors=[ClientCollector(client)]
            ))
        return int(self._metrics.port)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine that uses ``fs.client`` on the client's loop and wait for it."""
        self._check_thread()
        self._ensure()
        return self._submit(coro)
