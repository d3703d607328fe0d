"""Lock client ids are bound to the user who uses them (``loomfs.meta.locks``: ``bound_client_id``,
``shown_to``), over ``LockTable`` on a SQLite file (no sockets): a user naming another user's
client id (and owner) cannot take, release, unlock, renew or end that client's locks, and is
not told other clients' ids; the lease still ends a dead client's locks; privileged callers
(admin tokens, services, auth-off ``TRUSTED``) name stored ids as they are."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from loomfs.common.clock import ManualClock
from loomfs.common.identity import SERVICE, TRUSTED, Identity, Right
from loomfs.meta.locks import (
    FLOCK,
    POSIX,
    READ,
    UNLOCK,
    WRITE,
    LockTable,
    bound_client_id,
    shown_to,
)
from loomfs.meta.store.base import LockRow, MetaStore
from loomfs.wire.types import Attr, FileType

ALICE = Identity(uid=1000, gid=1000, token_id="t-alice")
ALICE_RENEWED = Identity(uid=1000, gid=1000, token_id="t-alice-2")  # a renewed token: same user
ALICE_IN_TENANT = Identity(uid=1000, gid=1000, tenant="acme", token_id="t-acme")
BOB = Identity(uid=1001, gid=1001, token_id="t-bob")
ADMIN = Identity(uid=0, gid=0, rights=Right.user() | Right.ADMIN, token_id="t-admin")
X, OWN = 0x1234_5678_9ABC, 77  # alice's client id and lock owner (bob learns both)
INO = 5


def run(tmp_path: Path, body: Callable[[MetaStore, LockTable, ManualClock], Awaitable[None]]) -> None:
    async def main() -> None:
        store = MetaStore.open(f"sqlite:///{tmp_path / 'meta.db'}")
        try:
            async with store.write() as txn:
                await txn.put_inode(Attr(inode=INO, type=FileType.FILE, mode=0o666, nlink=1))
            clock = ManualClock(1_000.0)
            await body(store, LockTable(store, clock), clock)
        finally:
            await store.close()

    asyncio.run(main())


async def rows(t: LockTable) -> list[tuple[int, LockRow]]:
    return sorted(await t.list(INO), key=lambda kr: (kr[0], kr[1].client_id, kr[1].first))


async def lease_of(store: MetaStore, client_id: int) -> int | None:
    async with store.read() as txn:
        return (await txn.lock_clients_expiry([client_id])).get(client_id)


def test_bound_ids_are_per_user_negative_and_stable() -> None:
    a = bound_client_id(ALICE, X)
    assert a == bound_client_id(ALICE, X) == bound_client_id(ALICE_RENEWED, X)  # the user, not the token
    assert len({a, bound_client_id(BOB, X), bound_client_id(ALICE_IN_TENANT, X), bound_client_id(ALICE, X + 1)}) == 4
    for who in (ALICE, BOB, ALICE_IN_TENANT):
        for cid in (0, 1, X, (1 << 63) - 1, -5):
            assert -(1 << 63) <= bound_client_id(who, cid) <= -1  # a signed bigint, never a client's own pick
    for who in (ADMIN, SERVICE, TRUSTED):
        assert bound_client_id(who, X) == X


def test_the_lock_in_the_way_hides_other_clients_from_users() -> None:
    hit = LockRow(client_id=-42, owner=OWN, type=WRITE, first=0, last=9, pid=7)
    assert shown_to(ALICE, hit, -42, X) == LockRow(X, OWN, WRITE, 0, 9, 7)  # its own client: the id it sent
    assert shown_to(BOB, hit, -43, X) == LockRow(0, 0, WRITE, 0, 9, 7)  # another's: range, type, pid only
    assert shown_to(ADMIN, hit, X, X) == hit


def test_another_user_naming_a_client_id_cannot_touch_its_locks(tmp_path: Path) -> None:
    async def body(store: MetaStore, t: LockTable, _: ManualClock) -> None:
        assert await t.setlk(INO, X, OWN, POSIX, WRITE, 0, 99, pid=7, who=ALICE) is None
        assert await t.setlk(INO, X, OWN, FLOCK, READ, who=ALICE) is None
        before, lease = await rows(t), await lease_of(store, bound_client_id(ALICE, X))
        assert lease is not None and {r.client_id for _, r in before} == {bound_client_id(ALICE, X)}
        # bob names alice's client id and owner in every call
        got = await t.getlk(INO, X, OWN, POSIX, WRITE, 50, 50, who=BOB)
        assert got == LockRow(0, 0, WRITE, 0, 99, 7)  # refused, without alice's client id or owner
        assert await t.setlk(INO, X, OWN, POSIX, WRITE, 0, 99, who=BOB) == LockRow(0, 0, WRITE, 0, 99, 7)
        assert await t.setlk(INO, X, OWN, FLOCK, WRITE, who=BOB) is not None
        assert await t.setlk(INO, X, OWN, POSIX, UNLOCK, 0, 99, who=BOB) is None  # unlocks nothing of alice's
        assert await t.setlk(INO, X, OWN, FLOCK, UNLOCK, who=BOB) is None
        assert await t.release(INO, X, OWN, POSIX, who=BOB) == 0
        assert await t.release(INO, X, OWN, FLOCK, who=BOB) == 0
        assert await t.renew(X, 600.0, who=BOB) is True  # bob's own lease (his calls made one), not alice's
        assert await lease_of(store, bound_client_id(BOB, X)) != lease
        assert await t.drop_client(X, who=BOB) == 0  # bob's client, holding nothing
        assert await lease_of(store, bound_client_id(BOB, X)) is None
        # the same user in a tenant is another user here (and a tenant's inodes are its own anyway)
        assert await t.release(INO, X, OWN, POSIX, who=ALICE_IN_TENANT) == 0
        assert await rows(t) == before
        assert await lease_of(store, bound_client_id(ALICE, X)) == lease
        # alice herself: another owner of hers sees her own id; her release works
        got = await t.getlk(INO, X, OWN + 1, POSIX, WRITE, 0, 0, who=ALICE)
        assert got == LockRow(X, OWN, WRITE, 0, 99, 7)
        assert await t.release(INO, X, OWN, POSIX, who=ALICE_RENEWED) == 1  # a renewed token: same user
        assert await t.drop_client(X, who=ALICE) == 1  # the flock
        assert await rows(t) == []

    run(tmp_path, body)


def test_a_dead_users_client_still_loses_its_locks_one_lease_later(tmp_path: Path) -> None:
    async def body(store: MetaStore, t: LockTable, clock: ManualClock) -> None:
        assert await t.setlk(INO, X, OWN, POSIX, WRITE, 0, 99, lease_s=10.0, who=ALICE) is None
        assert await t.setlk(INO, X, OWN, POSIX, WRITE, 0, 99, who=BOB) is not None
        clock.advance(5.0)
        assert await t.renew(X, 10.0, who=ALICE) is True  # her renewals keep her lease
        clock.advance(9.0)
        assert await t.setlk(INO, X, OWN, POSIX, WRITE, 0, 99, who=BOB) is not None
        clock.advance(2.0)  # 11 s after her last renewal: gone
        assert await t.setlk(INO, X, OWN, POSIX, WRITE, 0, 99, who=BOB) is None
        assert [r.client_id for _, r in await rows(t)] == [bound_client_id(BOB, X)]
        assert t.expired_total == 1
        fresh = await t.setlk_lease(INO, X, OWN, POSIX, READ, 200, 299, who=ALICE)
        assert fresh == (None, True)  # alice comes back: told her old locks are gone

    run(tmp_path, body)


@pytest.mark.parametrize("who", [ADMIN, SERVICE, TRUSTED], ids=["admin", "service", "trusted"])
def test_privileged_callers_see_and_end_any_clients_locks_by_the_stored_id(tmp_path: Path, who: Identity) -> None:
    async def body(store: MetaStore, t: LockTable, _: ManualClock) -> None:
        assert await t.setlk(INO, X, OWN, POSIX, WRITE, 0, 99, pid=7, who=ALICE) is None
        got = await t.getlk(INO, 1, 1, POSIX, READ, 0, 0, who=who)
        stored = bound_client_id(ALICE, X)
        assert got == LockRow(stored, OWN, WRITE, 0, 99, 7)
        assert await t.release(INO, X, OWN, POSIX, who=who) == 0  # alice's raw id is not what is stored
        assert await t.release(INO, stored, OWN, POSIX, who=who) == 1
        assert await t.setlk(INO, X, OWN, POSIX, WRITE, 0, 9, who=who) is None  # its own, under the raw id
        assert [r.client_id for _, r in await rows(t)] == [X]

    run(tmp_path, body)
