"""The simulator's event loop: virtual time, no I/O, hosts whose tasks can be frozen or killed.

``SimLoop`` is an asyncio loop whose ``time()`` is virtual. Nothing real is ever waited on
(all traffic is ``net.sim`` callbacks), so when no callback is ready the "selector" jumps
the clock to the next timer: a 60 s run takes only the CPU time its work needs, and the
schedule depends on nothing but the program and its seeds.

Hosts: every task remembers the simulated host it was created on (``net.sim.CURRENT_HOST``,
which the network sets when it delivers a frame to a host), so the simulator can

* ``kill_host``: cancel every task of a host (a process crash: in-flight handlers die too);
* ``pause_host`` / ``resume_host``: freeze a host's tasks (SIGSTOP, a VM pause, a long GC):
  a frozen task takes no step (timers, replies and cancellations wait) until resumed.

Guards: threads and executors raise ``SimError`` (a thread would run outside virtual time), a
loop with nothing scheduled while the main task waits raises ``SimStalled``, and a run that
exceeds its wall-clock budget raises ``SimWallLimit``.
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextlib
import contextvars
import threading
import time
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

from loomfs.net.sim import CURRENT_HOST

T = TypeVar("T")


class SimError(RuntimeError):
    """The code under simulation did something the simulator cannot model."""


class SimStalled(SimError):
    """Nothing is ready and nothing is scheduled, yet the run is not finished: a deadlock."""


class SimWallLimit(SimError):
    """The run used more real time than it was allowed."""


class _Host:
    __slots__ = ("name", "paused", "tasks", "waiters")

    def __init__(self, name: str):
        self.name = name
        self.paused = False
        self.tasks: list[asyncio.Task[Any]] = []
        self.waiters: list[asyncio.Future[None]] = []


class _Frozen(collections.abc.Coroutine[Any, Any, Any]):
    """Wraps a host task's coroutine: while the host is paused, every step (a value, an
    exception, a cancellation) is kept back and the task waits on a private future instead."""

    __slots__ = ("_coro", "_host", "_loop", "_deferred", "_waiting")

    def __init__(self, coro: Coroutine[Any, Any, Any], host: _Host, loop: asyncio.AbstractEventLoop):
        self._coro = coro
        self._host = host
        self._loop = loop
        self._deferred: tuple[bool, Any] = (False, None)  # (is_exception, value) kept back
        self._waiting = False  # the task waits on one of our futures (the host is paused)

    def _wait(self) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = self._loop.create_future()
        fut._asyncio_future_blocking = True
        self._host.waiters.append(fut)
        self._waiting = True
        return fut

    def _forward(self, is_exc: bool, value: Any) -> Any:
        if self._host.paused:
            self._deferred = (is_exc, value)
            return self._wait()
        self._deferred = (False, None)
        return self._coro.throw(value) if is_exc else self._coro.send(value)

    def send(self, value: Any) -> Any:
        if self._waiting:  # our own future: the host was resumed
            self._waiting = False
            return self._forward(*self._deferred)
        return self._forward(False, value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        exc = typ if val is None and isinstance(typ, BaseException) else (val if val is not None else typ())
        self._waiting = False  # an exception (a cancellation) supersedes a kept-back value
        return self._forward(True, exc)

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, Any]:
        raise SimError("a host task's coroutine is not awaitable")

    def __repr__(self) -> str:
        return f"_Frozen({self._host.name} {self._coro!r})"


class _VirtualSelector:
    def __init__(self, loop: SimLoop):
        self._loop = loop

    def select(self, timeout: float | None) -> list[Any]:
        loop = self._loop
        loop.steps += 1
        if loop.wall_limit_s is not None and loop.steps % 4096 == 0 \
                and time.perf_counter() - loop.wall_started > loop.wall_limit_s:
            raise SimWallLimit(f"run exceeded {loop.wall_limit_s:.0f}s of wall time at t={loop.time():.3f}")
        if timeout is None:
            raise SimStalled(f"t={loop.time():.3f}: nothing ready and nothing scheduled")
        if timeout > 0:
            scheduled = loop._scheduled  # type: ignore[attr-defined]
            when = scheduled[0]._when if scheduled else loop.time() + timeout
            loop._now_s = max(loop._now_s, when)
        return []

    def close(self) -> None:
        pass


class SimLoop(asyncio.BaseEventLoop):
    def __init__(self, *, start_s: float = 0.0, wall_limit_s: float | None = None):
        super().__init__()
        self._now_s = start_s
        self._selector = _VirtualSelector(self)
        self.wall_limit_s = wall_limit_s
        self.wall_started = time.perf_counter()
        self.steps = 0
        self._hosts: dict[str, _Host] = {}
        self.errors: list[str] = []  # exceptions nobody retrieved (callbacks, tasks)
        self.set_task_factory(self._make_task)  # type: ignore[arg-type]
        self.set_exception_handler(self._on_exception)

    def time(self) -> float:
        return self._now_s

    # ---- hosts --------------------------------------------------------------------------
    def _host(self, name: str) -> _Host:
        h = self._hosts.get(name)
        if h is None:
            h = self._hosts[name] = _Host(name)
        return h

    def _make_task(self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any],
                   context: contextvars.Context | None = None) -> asyncio.Task[Any]:
        name = context.get(CURRENT_HOST, "") if context is not None else CURRENT_HOST.get()
        if not name:
            return asyncio.Task(coro, loop=self, context=context)
        host = self._host(name)
        task = asyncio.Task(_Frozen(coro, host, self), loop=self, context=context)
        if len(host.tasks) > 64 and len(host.tasks) % 64 == 0:
            host.tasks = [t for t in host.tasks if not t.done()]
        host.tasks.append(task)
        return task

    def pause_host(self, name: str) -> None:
        self._host(name).paused = True

    def resume_host(self, name: str) -> None:
        host = self._host(name)
        host.paused = False
        waiters, host.waiters = host.waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def host_paused(self, name: str) -> bool:
        h = self._hosts.get(name)
        return h is not None and h.paused

    def kill_host(self, name: str) -> list[asyncio.Task[Any]]:
        """Cancel every live task of ``name`` (in creation order); returns them."""
        host = self._host(name)
        self.resume_host(name)  # a dead process is not paused; its tasks must see the cancel
        doomed = [t for t in host.tasks if not t.done()]
        host.tasks = []
        for t in doomed:
            t.cancel()
        return doomed

    # ---- guards -------------------------------------------------------------------------
    def run_in_executor(self, executor: Any, func: Any, *args: Any) -> Any:  # type: ignore[override]
        raise SimError(f"run_in_executor({func!r}) under the simulator: threads run outside virtual time")

    def _write_to_self(self) -> None:
        if threading.get_ident() != self._thread_id:  # type: ignore[attr-defined]
            raise SimError("call_soon_threadsafe from a thread under the simulator: threads run outside "
                           "virtual time")

    def _asyncgen_finalizer_hook(self, agen: Any) -> None:
        """An async generator collected unfinished: close it in a task (as asyncio does),
        scheduled directly (we are on the loop's thread: collection is by refcount here)."""
        self._asyncgens.discard(agen)  # type: ignore[attr-defined]
        if not self.is_closed():
            self.call_soon(self.create_task, agen.aclose())

    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _on_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, SimError):
            raise exc
        fut = context.get("future") or context.get("task")
        where = ""
        if isinstance(fut, asyncio.Task):
            coro = fut.get_coro()
            inner = getattr(coro, "_coro", coro)  # a host task's coroutine is wrapped
            where = f" in {getattr(inner, '__qualname__', type(inner).__name__)}"
        self.errors.append(f"{context.get('message')}{where}: {exc!r}")

    def shutdown(self) -> None:
        """Kill every host, cancel every task, let them unwind, close."""
        try:
            for name in list(self._hosts):
                self.kill_host(name)
            for t in asyncio.all_tasks(self):
                t.cancel()
            with contextlib.suppress(SimError, RuntimeError):
                self.run_until_complete(asyncio.sleep(1.0))
        finally:
            self.close()

    def __repr__(self) -> str:
        return f"SimLoop(t={self._now_s:.6f} steps={self.steps} hosts={len(self._hosts)})"


def run(coro: Coroutine[Any, Any, T], *, wall_limit_s: float | None = None) -> T:
    """Run ``coro`` to completion on a fresh SimLoop, then shut the loop down."""
    loop = SimLoop(wall_limit_s=wall_limit_s)
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.shutdown()
