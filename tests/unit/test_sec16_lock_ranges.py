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
from loomfs.common.identity import Identity
from loomfs.errors import LoomError
from loomfs.meta.locks import POSIX, READ, LockTable, bound_client_id
from loomfs.meta.store.base import LockRow, MetaStore
from loomfs.wire.types import Attr, FileType

BOB = Identity(uid=1001, gid=1001, token_id="t-bob")
INO = 5
CLIENT, OWNER = 0x77, 1
HELD = 5000  # rows bob already holds on the file (put straight into the store: building them
# through LockTable costs minutes, which is the point)


@pytest.mark.xfail(strict=True, reason="security hunt 16: no bound on the lock ranges an unprivileged "
                   "client holds on one inode (every lock call on it reads them all); fix in meta/locks.py")
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
