"""Locks across clients (``loomfs.meta.locks``) on every store engine: sqlite, and postgresql on a
private server (``pg_url`` in tests/conftest.py). Conflicts, F_GETLK, POSIX range splits and
merges, flock, release at close, leases (a dead client's locks go one lease later), and two
meta servers (two ``LockTable``s over one PostgreSQL database) granting one lock once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from loomfs.common.clock import ManualClock
from loomfs.meta.locks import FLOCK, OFFSET_MAX, POSIX, READ, UNLOCK, WRITE, LockTable
from loomfs.meta.service import retry_conflicts
from loomfs.meta.store.base import MetaStore
from loomfs.meta.store.postgres import PostgresStore
from loomfs.wire.types import Attr, FileType

BACKENDS: dict[str, Callable[[pytest.FixtureRequest, Path], str]] = {
    "sqlite": lambda request, tmp: f"sqlite:///{tmp / 'meta.db'}",
    "postgresql": lambda request, tmp: str(request.getfixturevalue("pg_url")),
}
A, B = 11, 22  # client ids
OWNER_HIGH = (1 << 64) - 5  # kernel lock owners are unsigned 64-bit


@pytest.fixture(params=sorted(BACKENDS))
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return BACKENDS[request.param](request, tmp_path)


def run_with(url: str, body: Callable[[MetaStore, LockTable, ManualClock], object]) -> None:
    async def main() -> None:
        store = MetaStore.open(url)
        clock = ManualClock(1_000.0)
        try:
            async with store.write() as txn:
                for ino in (5, 6):
                    await txn.put_inode(Attr(inode=ino, type=FileType.FILE, mode=0o644, nlink=1))
            await body(store, LockTable(store, clock), clock)  # type: ignore[misc]
        finally:
            if isinstance(store, PostgresStore):
                await store.release()
            await store.close()

    asyncio.run(main())


def test_posix_conflicts_getlk_and_ranges(url: str) -> None:
    async def body(store: MetaStore, t: LockTable, clock: ManualClock) -> None:
        assert await t.setlk(5, A, OWNER_HIGH, POSIX, WRITE, 0, 99, pid=7) is None
        hit = await t.setlk(5, B, 1, POSIX, READ, 50, 50)
        assert hit is not None and (hit.client_id, hit.owner, hit.type, hit.first, hit.last, hit.pid) == \
            (A, OWNER_HIGH, WRITE, 0, 99, 7)
        assert await t.setlk(5, B, 1, POSIX, WRITE, 100, OFFSET_MAX) is None  # beside it
        assert await t.setlk(6, B, 1, POSIX, WRITE, 0, 10) is None  # another file
        assert await t.setlk(5, A, 2, POSIX, READ, 0, 0) is not None  # another owner of the same client
        # read locks share
        assert await t.setlk(5, A, OWNER_HIGH, POSIX, READ, 0, 99) is None  # downgraded in place
        assert await t.setlk(5, B, 1, POSIX, READ, 10, 20) is None
        got = await t.getlk(5, B, 9, POSIX, WRITE, 15, 15)
        assert got is not None and got.type == READ
        assert await t.getlk(5, B, 1, POSIX, READ, 0, 50) is None
        # unlock in the middle splits; the rest still conflicts
        assert await t.setlk(5, A, OWNER_HIGH, POSIX, UNLOCK, 40, 59) is None
        mine = sorted((r.first, r.last) for k, r in await t.list(5) if r.client_id == A)
        assert mine == [(0, 39), (60, 99)]
        assert await t.setlk(5, B, 3, POSIX, WRITE, 40, 59) is None
        assert await t.setlk(5, B, 3, POSIX, WRITE, 39, 39) is not None
        # touching ranges of one type join
        assert await t.setlk(5, A, OWNER_HIGH, POSIX, UNLOCK, 0, 99) is None
        for first, last in ((200, 299), (300, 399), (150, 199)):
            assert await t.setlk(6, A, 4, POSIX, READ, first, last) is None
        assert [(r.first, r.last) for k, r in await t.list(6) if r.client_id == A] == [(150, 399)]
        assert await t.release(5, B, 1, POSIX) == 2  # 10..20 and 100..end
        assert await t.release(5, B, 1, POSIX) == 0

    run_with(url, body)


def test_flock_shared_exclusive_and_release(url: str) -> None:
    async def body(store: MetaStore, t: LockTable, clock: ManualClock) -> None:
        assert await t.setlk(5, A, 1, FLOCK, READ) is None
        assert await t.setlk(5, B, 1, FLOCK, READ) is None
        assert await t.setlk(5, B, 1, FLOCK, WRITE) is not None  # A shares it
        assert await t.setlk(5, A, 1, FLOCK, UNLOCK) is None
        assert await t.setlk(5, B, 1, FLOCK, WRITE) is None  # upgraded
        assert await t.setlk(5, A, 1, FLOCK, READ) is not None
        assert await t.setlk(5, A, 1, POSIX, WRITE, 0, 10) is None  # kinds do not meet (as on Linux)
        assert await t.release(5, B, 1, FLOCK) == 1
        assert await t.setlk(5, A, 1, FLOCK, WRITE) is None
        with pytest.raises(FileNotFoundError):
            await t.setlk(99, A, 1, FLOCK, WRITE)
        with pytest.raises(OSError):
            await t.setlk(5, A, 1, POSIX, WRITE, 10, 5)

    run_with(url, body)


def test_a_lapsed_lease_loses_every_lock(url: str) -> None:
    async def body(store: MetaStore, t: LockTable, clock: ManualClock) -> None:
        assert await t.setlk(5, A, 1, POSIX, WRITE, 0, 10, lease_s=5) is None
        assert await t.setlk(6, A, 1, FLOCK, WRITE, lease_s=5) is None
        clock.advance(3)
        assert await t.renew(A, 5)  # lasts until +8
        clock.advance(4)
        assert await t.setlk(5, B, 1, POSIX, WRITE, 0, 10, lease_s=5) is not None
        assert await t.getlk(5, B, 1, POSIX, WRITE, 0, 10) is not None
        clock.advance(2)  # A's lease ran out
        assert await t.getlk(5, B, 1, POSIX, WRITE, 0, 10) is None
        assert await t.setlk(5, B, 1, POSIX, WRITE, 0, 10, lease_s=5) is None  # drops A with all its rows
        assert [r.client_id for k, r in await t.list(6)] == []
        assert not await t.renew(A, 5)  # A learns it lost them
        assert await t.setlk_lease(6, A, 1, FLOCK, WRITE, lease_s=5) == (None, True)  # a new lease
        assert await t.setlk_lease(5, A, 1, FLOCK, WRITE, lease_s=5) == (None, False)  # the same one
        clock.advance(6)  # both ran out: a renewal by anyone sweeps them
        assert not await t.renew(B, 5)
        assert await t.list(5) == [] and await t.list(6) == []
        hit, fresh = await t.setlk_lease(5, A, 1, POSIX, WRITE, 0, 0, lease_s=5)  # A was swept: told so
        assert hit is None and fresh
        assert await t.release(5, A, 1, POSIX) == 1
        assert await t.setlk(6, B, 1, FLOCK, WRITE, lease_s=5) is None
        assert await t.drop_client(B) == 1

    run_with(url, body)


def test_two_meta_servers_grant_one_lock_once(pg_url: str) -> None:
    """Two LockTables over one PostgreSQL database race for one exclusive range many times:
    exactly one wins each round (SERIALIZABLE: the loser re-runs and sees the winner)."""

    async def main() -> None:
        s1, s2 = MetaStore.open(pg_url), MetaStore.open(pg_url)
        try:
            async with s1.write() as txn:
                await txn.put_inode(Attr(inode=5, type=FileType.FILE, mode=0o644, nlink=1))
            t1, t2 = LockTable(s1), LockTable(s2)
            for round_ in range(20):
                got = await asyncio.gather(
                    retry_conflicts(t1.setlk, 5, A, round_, POSIX, WRITE, 0, 100),
                    retry_conflicts(t2.setlk, 5, B, round_, POSIX, WRITE, 50, 150),
                )
                assert sum(g is None for g in got) == 1, got
                assert await t1.release(5, A, round_, POSIX) + await t2.release(5, B, round_, POSIX) == 1
        finally:
            for s in (s1, s2):
                assert isinstance(s, PostgresStore)
                await s.release()
                await s.close()

    asyncio.run(main())

