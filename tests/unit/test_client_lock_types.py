"""The undo of a lock call cut short keeps the lock TYPE its owner was told it holds, a lapsed
lease learnt by the owner's own next call is noticed, and an owner that holds nothing is
forgotten (no release, no renewals). Over meta's real lock handlers called in process (no
sockets; ``test_client_locks.InProcessMeta``, ``test_client_lock_undo.Wire``).

Review 2: R1 (a cut-short downgrade left an exclusive lock shared at meta: another client got a
shared lock over bytes the owner believed it held alone), R2 (a lease lapse learnt from a
LOCK_SET of an owner with older ranges on the same file went unnoticed) and R6's note (the
keys taken through the path API were never dropped: the lease was renewed forever)."""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import Any

import pytest
from test_client_lock_undo import Wire, cancelled, free, undos_done, until
from test_client_locks import InProcessMeta, run

from loomfs.client import locks as client_locks
from loomfs.client.lock_ranges import typed_cut, typed_join, typed_less, typed_set, undo_plan
from loomfs.client.locks import FLOCK, POSIX, READ, UNLOCK, WRITE, LockClient
from loomfs.common.clock import ManualClock
from loomfs.errors import TimedOut
from loomfs.wire.message import Message, Method


async def rows_of(meta: InProcessMeta, client_id: int, kind: int = POSIX) -> list[tuple[int, int, int]]:
    async with meta.ns.store.read() as txn:
        return [(r.first, r.last, r.type) for r in await txn.locks_on(5, kind) if r.client_id == client_id]


async def shared_granted(meta: InProcessMeta, first: int, last: int, kind: int = POSIX) -> bool:
    """Whether another client gets a READ lock over first..last now (then lets it go)."""
    c = LockClient(meta, 0x98)
    try:
        await c.set(5, kind, READ, first, last, owner=98)
    except BlockingIOError:
        return False
    await c.set(5, kind, UNLOCK, first, last, owner=98)
    return True


def test_a_downgrade_whose_answer_is_lost_leaves_the_lock_exclusive() -> None:
    """R1: the owner holds WRITE 0..99 and asks READ 50..149; meta applies it, the answer is
    lost. The call failed, so the owner still holds WRITE 0..99 (POSIX): 50..99 is set back to
    WRITE, 100..149 unlocked. Before: meta kept READ 50..99 and another client's READ 60..70
    was granted."""

    async def body(meta: InProcessMeta, clock: ManualClock) -> None:
        b = LockClient(Wire(meta, lost=(1,)), 2)
        await b.set(5, POSIX, WRITE, 0, 99, owner=20)
        with pytest.raises(TimedOut):
            await b.set(5, POSIX, READ, 50, 149, owner=20)
        await undos_done()
        assert await rows_of(meta, 2) == [(0, 99, WRITE)]
        assert b._owners[(5, POSIX, 20)].held == [(0, 99, WRITE)]
        assert not await shared_granted(meta, 60, 70)
        assert await shared_granted(meta, 100, 149)
        assert b.lost_total == 0

    run(body)


def test_a_cancelled_flock_downgrade_leaves_the_file_exclusive() -> None:
    """R1, flock: WRITE held, a READ cancelled while on the wire (meta grants it later)."""

    async def body(meta: InProcessMeta, clock: ManualClock) -> None:
        wire = Wire(meta, slow=(1,))
        b = LockClient(wire, 2)
        await b.set(5, FLOCK, WRITE, owner=20)
        t = asyncio.ensure_future(b.set(5, FLOCK, READ, owner=20))
        await until(lambda: 1 in wire.served, "the downgrade on the wire")
        await cancelled(t)
        wire.open(1)
        await wire.served_all()
        await undos_done()
        assert [r[2] for r in await rows_of(meta, 2, FLOCK)] == [WRITE]
        assert not await shared_granted(meta, 0, 0, FLOCK)

    run(body)


def test_a_cancelled_upgrade_leaves_the_lock_shared() -> None:
    """The other way: READ held, a WRITE cut short is set back to READ (before it stayed WRITE,
    refusing other readers)."""

    async def body(meta: InProcessMeta, clock: ManualClock) -> None:
        wire = Wire(meta, slow=(1,))
        b = LockClient(wire, 2)
        await b.set(5, POSIX, READ, 0, 99, owner=20)
        t = asyncio.ensure_future(b.set(5, POSIX, WRITE, 0, 99, owner=20))
        await until(lambda: 1 in wire.served, "the upgrade on the wire")
        await cancelled(t)
        wire.open(1)
        await wire.served_all()
        await undos_done()
        assert await rows_of(meta, 2) == [(0, 99, READ)]
        assert await shared_granted(meta, 0, 99)
        assert not await free(meta, 0, 99, POSIX)

    run(body)


class HookWire(Wire):
    """LOCK_SET number ``n`` reaches meta, then ``hook`` runs, then its answer is lost."""

    def __init__(self, meta: InProcessMeta, n: int, hook: Any):
        super().__init__(meta)
        self.n, self.hook = n, hook

    async def call(self, m: Method, req: Message) -> Any:
        if m == client_locks.wl.LOCK_SET and self.sets == self.n:
            self.sets += 1
            await self.meta.call(m, req)
            await self.hook()
            raise TimedOut("LOCK_SET: no answer")
        return await super().call(m, req)


def test_an_exclusive_lock_another_client_shared_meanwhile_is_counted_lost(caplog: pytest.LogCaptureFixture) -> None:
    """R1's case POSIX cannot express: while the cut-short READ held 50..99 shared, another
    client took READ 60..70; setting WRITE back is refused. The owner's WRITE over 50..99 is
    lost: counted, logged as an error, out of its record; the READ meta holds stays the
    owner's (writers stay out) and goes at its release."""

    async def body(meta: InProcessMeta, clock: ManualClock) -> None:
        other = LockClient(meta, 3)

        async def other_reads() -> None:
            await other.set(5, POSIX, READ, 60, 70, owner=30)

        b = LockClient(HookWire(meta, 1, other_reads), 2)
        await b.set(5, POSIX, WRITE, 0, 99, owner=20)
        with caplog.at_level(logging.ERROR, logger="loomfs.client.locks"), pytest.raises(TimedOut):
            await b.set(5, POSIX, READ, 50, 149, owner=20)
        await undos_done()
        assert b.lost_total == 1
        assert any("lost its exclusive lock over 50..99" in r.getMessage() for r in caplog.records)
        assert b._owners[(5, POSIX, 20)].held == [(0, 49, WRITE)]
        assert await rows_of(meta, 2) == [(0, 49, WRITE), (50, 99, READ)]
        assert b.holds(5, POSIX, 20)
        assert await b.release(5, POSIX, 20) == 2
        assert await rows_of(meta, 2) == []

    run(body)


def test_a_lapsed_lease_learnt_by_the_same_owners_next_lock_is_counted_lost() -> None:
    """R2: owner 20 holds 0..9; cut off past its lease, its next lock (20..29) finds the lease
    new. 0..9 went with it: counted, logged, out of the record (before: kept, lost_total 0)."""

    async def body(meta: InProcessMeta, clock: ManualClock) -> None:
        b = LockClient(meta, 2, lease_s=5.0)
        await b.set(5, POSIX, WRITE, 0, 9, owner=20)
        clock.advance(60)
        await b.set(5, POSIX, WRITE, 20, 29, owner=20)
        assert b.lost_total == 1
        assert b._owners[(5, POSIX, 20)].held == [(20, 29, WRITE)]
        other = LockClient(meta, 3)
        await other.set(5, POSIX, WRITE, 0, 9, owner=30)  # it is gone at meta too
        assert not await free(meta, 20, 29, POSIX)
        await b.close()
        await other.close()

    run(body)


def test_a_lapse_learnt_while_another_owner_is_on_the_wire_keeps_that_owners_grant() -> None:
    """Owner 21's flock is on the wire when owner 20's lock learns the lease lapsed: 21 held
    nothing (not counted lost), and its grant, which comes after, is still released at close
    (before: the lapse took its key out of what the client may hold)."""

    async def body(meta: InProcessMeta, clock: ManualClock) -> None:
        wire = Wire(meta, slow=(1,))
        b = LockClient(wire, 2, lease_s=5.0)
        await b.set(5, POSIX, WRITE, 0, 9, owner=20)
        t = asyncio.ensure_future(b.set(5, FLOCK, WRITE, owner=21))
        await until(lambda: 1 in wire.served, "owner 21's lock on the wire")
        clock.advance(60)
        await b.set(5, POSIX, WRITE, 20, 29, owner=20)
        assert b.lost_total == 1
        wire.open(1)
        await asyncio.wait_for(t, 10)
        assert b.holds(5, FLOCK, 21)
        assert await b.release(5, FLOCK, 21) == 1

    run(body)


@dataclass
class _Attr:
    inode: int


class _PathClient:
    """What ``locks.lock()`` uses of an ``AsyncClient``: its meta, id and ``stat``."""

    def __init__(self, meta: InProcessMeta):
        self.meta, self.client_id = meta, 0x42

    async def stat(self, path: str) -> _Attr:
        return _Attr(5)


def test_an_owner_that_holds_nothing_is_forgotten_and_the_renewals_stop() -> None:
    """R6's note: lock/unlock through the path API never called release(), so the key stayed
    in ``_held`` and the lease was renewed every third of it forever. Now the key goes once
    the owner holds nothing and nothing is in flight. A stray lock (an unlock with no answer:
    meta may still hold it) keeps it until the owner's release."""

    async def body(meta: InProcessMeta, clock: ManualClock) -> None:
        fs: Any = _PathClient(meta)
        lc = client_locks.locks_of(fs)
        lc.lease_s = 1.0  # renewals every 0.33 s
        await client_locks.lock(fs, "/f", WRITE, kind=POSIX, first=0, last=9)
        key = (5, POSIX, lc.default_owner)
        assert lc.holds(*key)
        await client_locks.unlock(fs, "/f", kind=POSIX, first=0, last=4)
        assert lc.holds(*key)  # 5..9 still
        await client_locks.unlock(fs, "/f", kind=POSIX, first=5, last=9)
        assert not lc.holds(*key) and not lc._owners and not lc._held
        task = lc._renew_task
        assert task is not None
        await until(task.done, "the renewals stop")
        # an unlock whose answer is lost: the key stays, the release makes the call
        b = LockClient(Wire(meta, lost=(1,)), 2)
        await b.set(5, POSIX, WRITE, 0, 9, owner=20)
        with pytest.raises(TimedOut):
            await b.set(5, POSIX, UNLOCK, 0, 9, owner=20)
        assert b._owners[(5, POSIX, 20)].held == [] and b.holds(5, POSIX, 20)
        calls = meta.calls
        assert await b.release(5, POSIX, 20) == 0  # the unlock did reach meta
        assert meta.calls == calls + 1 and not b.holds(5, POSIX, 20)
        await client_locks.close_client(fs)

    run(body)


def test_typed_ranges_and_the_undo_plan_agree_with_bytes() -> None:
    """``lock_ranges``' typed helpers and ``undo_plan`` against a map byte -> type, over
    random ranges of 0..40."""

    def byte_map(rs: list[tuple[int, int, int]]) -> dict[int, int]:
        return {b: t for first, last, t in rs for b in range(first, last + 1)}

    def pair(rng: random.Random) -> tuple[int, int]:
        x, y = rng.randrange(40), rng.randrange(40)
        return min(x, y), max(x, y)

    def typed(rng: random.Random, n: int) -> list[tuple[int, int, int]]:
        held: list[tuple[int, int, int]] = []
        for _ in range(n):
            held = typed_set(held, (*pair(rng), rng.choice((READ, WRITE))))
        return held

    rng = random.Random(11)
    for _ in range(2000):
        held = typed(rng, rng.randrange(4))
        a, b = pair(rng)
        t = rng.choice((READ, WRITE))
        hm = byte_map(held)
        assert typed_join(held) == held
        assert all(x[1] < y[0] and (x[2] != y[2] or x[1] + 1 < y[0]) for x, y in zip(held, held[1:], strict=False))
        assert byte_map(typed_set(held, (a, b, t))) == hm | dict.fromkeys(range(a, b + 1), t)
        assert byte_map(typed_less(held, (a, b))) == {k: v for k, v in hm.items() if not a <= k <= b}
        assert byte_map(typed_cut(held, (a, b))) == {k: v for k, v in hm.items() if a <= k <= b}
        untold = [(*pair(rng), rng.choice((READ, WRITE))) for _ in range(rng.randrange(1, 3))]
        touched = sorted({(f, la) for f, la, _ in held} | {pair(rng) for _ in range(rng.randrange(2))})
        unlock, restore, left = undo_plan(untold, touched, held)
        reach = {k for f, la, _ in untold for k in range(f, la + 1)}
        in_touched = {k for f, la in touched for k in range(f, la + 1)}
        assert {k for f, la in unlock for k in range(f, la + 1)} == reach - in_touched
        assert byte_map(restore) == {k: hm[k] for k in reach & hm.keys()
                                     if any(f <= k <= la and ut != hm[k] for f, la, ut in untold)}
        assert {k for f, la in left for k in range(f, la + 1)} == (reach & in_touched) - hm.keys()
