"""Sync twins of the filesystem's coroutines, through the blocking client's bridge.

fsspec's own mirroring submits with ``run_coroutine_threadsafe`` and polls an event; this
one uses ``LoomFS.run``, the bridge every other blocking LoomFS call takes (one futex wait,
a trace id per call, Ctrl-C cancels the work, and a clear error when called from the
client's own loop thread). Which methods get a twin follows fsspec's rule: each ``_name``
coroutine (or async generator) whose ``name`` the class does not define itself.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any

from fsspec import AbstractFileSystem
from fsspec.asyn import AsyncFileSystem, async_methods, private

if TYPE_CHECKING:
    from loomfs.fsspec._filesystem import LoomFileSystem


def _twin(obj: LoomFileSystem, fn: Callable[..., Coroutine[Any, Any, Any]]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        coro = fn(*args, **kwargs)
        try:
            return obj.loom.run(coro)
        finally:
            coro.close()  # a no-op once it ran; never-awaited when run refused it

    return call


def _gen_twin(obj: LoomFileSystem, fn: Callable[..., AsyncIterator[Any]]) -> Callable[..., Iterator[Any]]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Iterator[Any]:
        gen = fn(*args, **kwargs)
        while True:
            try:
                yield obj.loom.run(_next(gen))
            except StopAsyncIteration:
                return

    return call


async def _next(gen: AsyncIterator[Any]) -> Any:
    return await gen.__anext__()


def mirror_sync_methods(obj: LoomFileSystem) -> None:
    for method in set(async_methods + dir(AsyncFileSystem)):
        if not private.match(method):
            continue
        smethod = method[1:]
        unsync = getattr(getattr(obj, smethod, False), "__func__", None)
        if unsync is not getattr(AbstractFileSystem, smethod, ""):
            continue  # the class has its own
        fn = getattr(obj, method, None)
        if inspect.iscoroutinefunction(fn):
            twin = _twin(obj, fn)
        elif inspect.isasyncgenfunction(fn):
            twin = _gen_twin(obj, fn)
        else:
            continue
        if not twin.__doc__:
            twin.__doc__ = getattr(getattr(AbstractFileSystem, smethod, None), "__doc__", "")
        setattr(obj, smethod, twin)
