"""Re-running operations that lost a serialisation conflict (loomfs.meta.service): bounded,
the later runs alone, other errors untouched; the namespace proxy wraps only coroutines."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from loomfs.errors import NotFound
from loomfs.meta.service import ConflictRetrying, retry_conflicts
from loomfs.meta.store.base import WRITE_ALONE, TxnConflict
from loomfs.meta.store.sqlite import SqliteStore


def test_reruns_until_success_and_runs_alone_after_two_losses() -> None:
    seen: list[bool] = []

    async def op(x: int) -> int:
        seen.append(WRITE_ALONE.get())
        if len(seen) < 4:
            raise TxnConflict("lost")
        return x * 2

    retries: list[int] = []
    got = asyncio.run(retry_conflicts(op, 21, rng=random.Random(1), on_retry=lambda: retries.append(1)))
    assert got == 42 and len(retries) == 3
    assert seen == [False, False, True, True]  # alone from the third run on
    assert WRITE_ALONE.get() is False  # reset afterwards


def test_gives_up_after_its_attempts_with_eagain() -> None:
    runs = 0

    async def op() -> None:
        nonlocal runs
        runs += 1
        raise TxnConflict("always")

    with pytest.raises(TxnConflict) as err:
        asyncio.run(retry_conflicts(op, attempts=3, rng=random.Random(2)))
    assert runs == 3 and err.value.errno == 11


def test_other_errors_are_not_rerun() -> None:
    runs = 0

    async def op() -> None:
        nonlocal runs
        runs += 1
        raise NotFound("gone")

    with pytest.raises(NotFound):
        asyncio.run(retry_conflicts(op))
    assert runs == 1


class _Ns:
    store = "the store"

    def __init__(self) -> None:
        self.calls = 0

    def plain(self) -> str:
        return "plain"

    async def op(self, v: int) -> int:
        self.calls += 1
        if self.calls == 1:
            raise TxnConflict("first loses")
        return v


def test_proxy_wraps_coroutines_only() -> None:
    ns = _Ns()
    p = ConflictRetrying(ns)  # type: ignore[arg-type]
    assert p.store == "the store" and p.plain() == "plain"
    assert asyncio.run(p.op(5)) == 5 and ns.calls == 2 and p.retries == 1
    assert p.op is p.op  # wrapped once


def test_a_run_that_stored_something_is_not_rerun(tmp_path: Path) -> None:
    """First transaction commits, the second loses: re-running would apply the first twice,
    so the conflict reaches the caller (EAGAIN) after one run."""
    store = SqliteStore(str(tmp_path / "m.db"))
    runs = 0

    async def op() -> None:
        nonlocal runs
        runs += 1
        async with store.write() as t:
            await t.add_counter("applied", 1)
        raise TxnConflict("the second transaction lost")

    async def nothing_stored_first() -> int:
        calls = 0

        async def op2() -> int:
            nonlocal calls
            calls += 1
            if calls == 1:
                with pytest.raises(RuntimeError):
                    async with store.write() as t:  # rolled back: nothing stored
                        await t.add_counter("applied", 100)
                        raise RuntimeError("body fails")
                raise TxnConflict("lost before storing anything")
            return calls

        return await retry_conflicts(op2)

    async def go() -> None:
        with pytest.raises(TxnConflict):
            await retry_conflicts(op)
        assert runs == 1
        assert await nothing_stored_first() == 2  # re-run: its first run stored nothing
        async with store.read() as t:
            assert (await t.counters())["applied"] == 1

    try:
        asyncio.run(go())
    finally:
        asyncio.run(store.close())
