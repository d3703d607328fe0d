"""``ec_stripe.repairs_settled`` waits for this loop's repairs only: a repair task left by a
client whose loop closed meanwhile made the next caller's gather raise RuntimeError ("attached
to a different loop"); it failed test_ec_reduced_marks in the clean-clone CI of session 16."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from loomfs.client import ec_stripe as es


@pytest.fixture
def stale() -> Iterator[asyncio.Task[None]]:
    """A repair whose loop closed before it finished (registered as a repair registers)."""
    loop = asyncio.new_event_loop()
    coro = asyncio.sleep(3600)
    task = loop.create_task(coro)
    es._REPAIRS.add(task)  # noqa: SLF001
    loop.close()
    yield task
    es._REPAIRS.discard(task)  # noqa: SLF001
    coro.close()


def test_a_repair_of_a_closed_loop_is_dropped(stale: asyncio.Task[None]) -> None:
    asyncio.run(asyncio.wait_for(es.repairs_settled(), 5))
    assert stale not in es._REPAIRS  # noqa: SLF001


def test_this_loops_repairs_are_awaited(stale: asyncio.Task[None]) -> None:
    finished: list[int] = []

    async def repair() -> list[int]:
        await asyncio.sleep(0)
        finished.append(1)
        return []

    async def main() -> None:
        mine = asyncio.ensure_future(repair())
        es._REPAIRS.add(mine)  # noqa: SLF001
        mine.add_done_callback(es._REPAIRS.discard)  # noqa: SLF001
        await asyncio.wait_for(es.repairs_settled(), 5)

    asyncio.run(main())
    assert finished == [1]
