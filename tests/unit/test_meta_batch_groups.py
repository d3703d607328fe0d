"""PUT_MANY and UNLINK_MANY of distinct paths run their items together: the store's group
commit covers many items with one COMMIT (counted), the results are the single calls', and a
batch naming a path twice still runs in order."""

from __future__ import annotations

import asyncio
import errno
import os
import random
from pathlib import Path
from typing import Any, cast

import crc32c

from loomfs.meta.ops.batch import BatchOps, Failed, Put, PutItem
from loomfs.meta.ops.namespace import Namespace
from loomfs.meta.perm_cost import _OneChain
from loomfs.meta.store.sqlite import SqliteStore
from loomfs.wire.types import Layout


def _item(path: str, data: bytes) -> PutItem:
    return PutItem(path, data, crc32c.crc32c(data))


def test_distinct_puts_and_unlinks_share_commits(tmp_path: Path) -> None:
    async def go() -> None:
        store = SqliteStore(str(tmp_path / "m.db"), synchronous="FULL")
        ns = Namespace(store, routing=cast(Any, _OneChain()), rng=random.Random(1),
                       default_layout=Layout(table_id=1, inline_max_bytes=4096))
        try:
            await ns.init()
            await ns.mkdir("/d")
            ops = BatchOps(ns)
            items = [_item(f"/d/f{i:03d}", f"content {i}".encode()) for i in range(200)]
            items.append(_item("/nodir/x", b"x"))  # an item's own error
            items.append(_item("/d/big", b"b" * 5000))  # over the limit: the client writes it
            commits0, groups0 = store.commits, store.groups
            got = await ops.put_many(items)
            assert got[:200] == [Put.DONE] * 200
            assert isinstance(got[200], Failed) and got[200].status == errno.ENOENT
            assert got[201] is Put.FALLBACK
            commits, groups = store.commits - commits0, store.groups - groups0
            assert commits == 200 and groups <= 10, (commits, groups)
            for i in (0, 77, 199):
                assert (await ns.read(f"/d/f{i:03d}"))[1] == f"content {i}".encode()

            commits0, groups0 = store.commits, store.groups
            gone = await ops.unlink_many([f"/d/f{i:03d}" for i in range(0, 200, 2)] + ["/d/missing"])
            assert all(isinstance(g, tuple) for g in gone[:100])
            assert isinstance(gone[100], Failed) and gone[100].status == errno.ENOENT
            assert store.groups - groups0 <= 10 and store.commits - commits0 == 100
            names = {e.name for e in (await ns.readdir("/d"))[0]}
            assert names == {f"f{i:03d}" for i in range(1, 200, 2)}

            # a path named twice: one after another, in order (the last content wins)
            again = await ops.put_many([_item("/d/same", b"first"), _item("/d/other", b"o"),
                                        _item("/d/same", b"second")])
            assert again == [Put.DONE] * 3 and (await ns.read("/d/same"))[1] == b"second"
            twice = await ops.unlink_many(["/d/other", "/d/other"])
            assert isinstance(twice[0], tuple) and isinstance(twice[1], Failed) and twice[1].status == errno.ENOENT
        finally:
            await store.close()

    asyncio.run(go())


def test_items_run_in_request_order(tmp_path: Path) -> None:
    """Distinct paths, one of them a symlink to another's file: the later item's content wins,
    as it would one after another."""
    async def go() -> None:
        store = SqliteStore(str(tmp_path / "m.db"))
        ns = Namespace(store, routing=cast(Any, _OneChain()), rng=random.Random(1),
                       default_layout=Layout(table_id=1, inline_max_bytes=4096))
        try:
            await ns.init()
            await ns.open("/target", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, data=b"0")
            await ns.symlink("/target", "/alias")
            got = await BatchOps(ns).put_many([_item("/target", b"one"), _item("/alias", b"two"),
                                               _item("/x", b"x")])
            assert got == [Put.DONE] * 3
            assert (await ns.read("/target"))[1] == b"two"
        finally:
            await store.close()

    asyncio.run(go())
