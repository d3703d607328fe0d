"""Security hunt 16: an unprivileged client holds as many byte-range locks as it likes.

Meta keeps every POSIX lock range as a row, and every lock call on an inode reads all rows of
that inode (``locks_on``) and rewrites all of the caller's (``locks_replace``): a client that
takes thousands of disjoint ranges on a file it may read (a shared dataset) makes every lock
call on that file, anyone's, cost time linear in its rows, on meta's event loop (SQLite runs
there), and its own calls quadratic in all. Measured over ``LockTable`` on in-memory SQLite:
1,000 disjoint ranges of one client took 20 s of calls to build, 2,000 took 66 s, and then a
single lock call of another user on the same file took 34 ms (2.5 ms at 1,000). Nothing
bounds it (Linux answers ENOLCK when its lock table is full).

The fix belongs in ``meta/locks.py`` (not this hunt's to edit): refuse a new range with ENOLCK
once the owner (or client) holds ``LOCK_RANGES_MAX`` (say 1024) rows on an inode, for callers
without ADMIN/SERVICE; and read only the rows overlapping the requested range (plus the
caller's own neighbours) instead of every row of the inode.
"""

from __future__ import annotations

import asyncio
import errno

import pytest

from loomfs.common.clock import ManualClock
from loomfs.common.identity import Identity, Right
from loomfs.errors import LoomError
from loomfs.meta.locks import POSIX, READ, LockTable, bound_client_id
from loomfs.meta.store.base import LockRow, MetaStore
from loomfs.wire.types import Attr, FileType

BOB = Identity(uid=1001, gid=1001, token_id="t-bob")
INO = 5
CLIENT, OWNER = 0x77, 1
HELD = 5000  # rows bob already holds on the file (put straight into the store: building them
# through LockTable costs minutes, which is the point)


def test_an_unprivileged_client_cannot_hold_unbounded_lock_ranges() -> None:
    async def main() -> None:
        store = MetaStore.open("sqlite://:memory:")
        try:
            async with store.write() as txn:
                await txn.put_inode(Attr(inode=INO, type=FileType.FILE, mode=0o644, nlink=1))
            table = LockTable(store, ManualClock(1_000.0))
            await table.setlk(INO, CLIENT, OWNER, POSIX, READ, 0, 0, who=BOB)  # bob's client and lease
            bound = bound_client_id(BOB, CLIENT)
            async with store.write() as txn:
                rows = [LockRow(bound, OWNER, READ, 2 * i, 2 * i) for i in range(HELD)]
                await txn.locks_replace(INO, POSIX, bound, OWNER, rows)
            with pytest.raises(LoomError) as ei:
                await table.setlk(INO, CLIENT, OWNER, POSIX, READ, 2 * HELD, 2 * HELD, who=BOB)
            assert ei.value.errno == errno.ENOLCK
        finally:
            await store.close()

    asyncio.run(main())


def test_the_bounds_count_what_a_call_adds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's client fills its room (small bounds here), then: a lock that merges with or
    replaces its ranges, and an unlock that removes some, go through; a new disjoint range
    and an unlock that splits a range are ENOLCK; an admin is not bounded; the inode's total
    bound refuses another user's client too."""
    from loomfs.meta import locks

    monkeypatch.setattr(locks, "CLIENT_RANGES_MAX", 4)
    monkeypatch.setattr(locks, "INODE_RANGES_MAX", 6)
    admin = Identity(uid=0, gid=0, token_id="t-admin", rights=Right.READ | Right.WRITE | Right.ADMIN)
    eve = Identity(uid=1002, gid=1002, token_id="t-eve")

    async def main() -> None:
        store = MetaStore.open("sqlite://:memory:")
        try:
            async with store.write() as txn:
                await txn.put_inode(Attr(inode=INO, type=FileType.FILE, mode=0o644, nlink=1))
            t = LockTable(store, ManualClock(1_000.0))

            async def lock(who: Identity, type_: int, first: int, last: int, client: int = CLIENT) -> int:
                try:
                    await t.setlk(INO, client, OWNER, POSIX, type_, first, last, who=who)
                except LoomError as exc:
                    return exc.errno or -1
                return 0

            for i in range(4):  # bob's client: 4 disjoint ranges, its bound
                assert await lock(BOB, READ, 10 * i, 10 * i + 1) == 0
            assert await lock(BOB, READ, 100, 101) == errno.ENOLCK
            assert await lock(BOB, READ, 2, 9) == 0  # joins the first two: 3 ranges now
            assert await lock(BOB, READ, 100, 101) == 0  # room again: 4
            assert await lock(BOB, 0, 100, 101) == 0  # an unlock that removes one: 3
            assert await lock(BOB, READ, 200, 300) == 0  # 4
            assert await lock(BOB, 0, 250, 250) == errno.ENOLCK  # would split 200..300: a fifth
            assert await lock(admin, READ, 1000, 1001, client=9) == 0  # not bounded; inode: 5
            assert await lock(eve, READ, 2000, 2001) == 0  # inode: 6
            assert await lock(eve, READ, 3000, 3001) == errno.ENOLCK  # the inode's bound
        finally:
            await store.close()

    asyncio.run(main())
