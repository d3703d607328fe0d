"""Concurrent jobs that end together: ``run_all`` awaits coroutines at once and, when one of
them fails (or the caller is cancelled), cancels the others and waits until every one has
ended before the error goes on.

``asyncio.gather`` hands the first error to its caller at once and leaves the other jobs
running. A get's jobs read straight into the caller's ``into=`` buffers (tensors, arrays), so
such a job would still write there after ``get_many`` had raised in the caller's thread. A
cancelled read aborts its connection mid-receive before the job ends (``net.scatter``), so once
``run_all`` has returned or raised, nothing it started writes anywhere.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


async def run_all(coros: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
    """The results of ``coros`` run concurrently, in order. On the first error (or a cancel of
    this call) every other job is cancelled and waited for, then the error is raised."""
    if not coros:
        return []
    if len(coros) == 1:
        return [await coros[0]]
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await _settle(tasks)
        raise


async def _settle(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Wait until every task has ended, whatever cancels reach this call meanwhile (one that
    did is raised once they all have)."""
    cancelled = False
    while pending := [t for t in tasks if not t.done()]:
        try:
            await asyncio.wait(pending)
        except asyncio.CancelledError:
            cancelled = True
    for t in tasks:  # retrieved: a second failure is not logged as never retrieved
        if not t.cancelled():
            t.exception()
    if cancelled:
        raise asyncio.CancelledError
