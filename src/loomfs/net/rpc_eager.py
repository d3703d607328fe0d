"""Run a coroutine's first step at once, on the caller's stack; a Task only if it suspends.

Python 3.12 has ``asyncio.eager_task_factory``; 3.11 (ours) does not. A meta request whose
handler never waits (SQLite answers a stat without suspending) pays for a Task (creation, a
``call_soon``, one more loop iteration, its done callback) and for ``asyncio.timeout_at``
(a timer) for nothing. ``RpcServer`` with ``eager=True`` therefore steps the handler's
coroutine once itself (``first_step``); only when it suspends does it hand the half-run
coroutine to a Task through ``resume``, which re-yields what the coroutine yielded to the
Task and forwards the Task's sends and throws (a cancellation included) back into it, so the
Task treats it exactly as if it had run the coroutine from its start.

The first step runs with no current task (``asyncio.current_task()`` is None). Code that needs
one before its first suspension (``asyncio.timeout``, ``asyncio.TaskGroup``) must check and
move into a task of its own (``ClientConnection.call`` does). That is why eagerness is the
server owner's choice (meta on SQLite), not a default.
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from typing import Any, Generic, TypeVar

T = TypeVar("T")

def first_step(coro: Coroutine[Any, Any, T]) -> tuple[bool, Any]:
    """Run ``coro`` to its first suspension: ``(True, result)`` if it finished, ``(False,
    yielded)`` if it suspended (hand it to ``resume`` in a Task). Exceptions propagate."""
    try:
        yielded = coro.send(None)
    except StopIteration as stop:
        return True, stop.value
    return False, yielded


class resume(Generic[T]):  # noqa: N801  (used like a function: ``await resume(coro, yielded)``)
    """Await the rest of a coroutine that ``first_step`` left suspended on ``yielded``."""

    __slots__ = ("_coro", "_yielded", "_throw")

    def __init__(self, coro: Coroutine[Any, Any, T], yielded: Any, throw: BaseException | None = None):
        """``throw``: raise this in the coroutine first (where it waits) instead of waiting."""
        self._coro = coro
        self._yielded = yielded
        self._throw = throw

    def __await__(self) -> Generator[Any, Any, T]:
        coro, value = self._coro, self._yielded
        self._yielded = None
        if self._throw is not None:
            exc, self._throw = self._throw, None
            try:
                value = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
        while True:
            try:
                sent = yield value  # to the Task: the future the coroutine waits on (or None)
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # the Task throws in (a cancellation): into the coroutine
                try:
                    value = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    value = coro.send(sent)
                except StopIteration as stop:
                    return stop.value
