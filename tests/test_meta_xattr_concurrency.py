"""Extended attributes from two meta servers on one PostgreSQL database at once (two stores
in one process, each with its namespace, as two stateless meta servers would be): an exclusive
create of one name succeeds exactly once, sets of different names all land, and a set racing
the file's last unlink never leaves attributes behind without their inode.
Directories: they hold attributes like files, and need no chunk placement."""

from __future__ import annotations

import asyncio
import errno
import random

from loomfs.common.clock import SYSTEM_CLOCK
from loomfs.errors import StatusError
from loomfs.meta.ops.namespace import Namespace
from loomfs.meta.ops.xattrs import XATTR_CREATE
from loomfs.meta.service import ConflictRetrying
from loomfs.meta.store.base import MetaStore
from loomfs.meta.store.postgres import PostgresStore

TASKS_PER_SERVER = 4
ROUNDS = 6


def test_two_meta_servers_race_on_one_files_attributes(pg_url: str) -> None:
    async def go() -> None:
        stores = [MetaStore.open(pg_url) for _ in range(2)]
        spaces = [Namespace(s, clock=SYSTEM_CLOCK, rng=random.Random(i)) for i, s in enumerate(stores)]
        servers: list[Namespace] = [ConflictRetrying(ns) for ns in spaces]  # type: ignore[misc]
        await servers[0].init()
        try:
            await servers[0].mkdir("/f")  # directories hold attributes too (and need no routing)
            writers = [(m, k) for m in range(2) for k in range(TASKS_PER_SERVER)]

            async def create(m: int, k: int) -> str:
                try:
                    await servers[m].setxattr("/f", b"user.once", b"%d-%d" % (m, k), flags=XATTR_CREATE)
                except StatusError as exc:
                    return errno.errorcode[exc.errno or 0]
                return "ok"

            got = await asyncio.gather(*(create(m, k) for m, k in writers))
            assert sorted(got) == ["EEXIST"] * (len(writers) - 1) + ["ok"], got
            winner = writers[got.index("ok")]
            assert await servers[1].getxattr("/f", b"user.once") == b"%d-%d" % winner

            await asyncio.gather(*(servers[m].setxattr("/f", b"user.n%d-%d" % (m, k), b"v") for m, k in writers))
            names = await servers[0].listxattr("/f")
            assert names == sorted([b"user.once", *(b"user.n%d-%d" % w for w in writers)])

            for r in range(ROUNDS):  # a set against the removal, from the other server
                path = f"/g{r}"
                await servers[0].mkdir(path)
                ino = (await servers[0].stat(path)).inode

                async def set_it(path: str = path) -> str:
                    try:
                        await servers[1].setxattr(path, b"user.k", b"v")
                    except StatusError as exc:
                        return errno.errorcode[exc.errno or 0]
                    return "ok"

                outcome, _ = await asyncio.gather(set_it(), servers[0].rmdir(path))
                assert outcome in ("ok", "ENOENT"), outcome
                async with stores[0].read() as txn:
                    assert await txn.get_inode(ino) is None
                    assert await txn.list_xattrs(ino) == []  # nothing left without its inode
        finally:
            for s in stores:
                if isinstance(s, PostgresStore):
                    await s.release()
                await s.close()

    asyncio.run(go())
