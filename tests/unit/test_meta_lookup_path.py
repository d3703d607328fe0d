"""SQLite's one-statement ``lookup_path`` gives exactly the rows of one ``lookup`` per name."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path
from typing import Any, cast

from loomfs.meta.ops.namespace import Namespace
from loomfs.meta.perm_cost import _OneChain
from loomfs.meta.store.base import MetaTxn
from loomfs.meta.store.sqlite import SqliteStore
from loomfs.wire.types import Layout


def test_lookup_path_matches_lookups(tmp_path: Path) -> None:
    async def go() -> None:
        store = SqliteStore(str(tmp_path / "m.db"))
        ns = Namespace(store, routing=cast(Any, _OneChain()), rng=random.Random(1),
                       default_layout=Layout(table_id=1, inline_max_bytes=65536))
        try:
            await ns.init()
            await ns.mkdir("/a/b/c", parents=True)
            await ns.open("/a/b/c/f", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, data=b"x")
            await ns.symlink("/a/b", "/a/l")
            await ns.mkdir("/" + "/".join(f"p{i}" for i in range(20)), parents=True)
            cases = [["a", "b", "c", "f"], ["a", "b", "c", "f", "g"], ["a", "x", "c"], ["a", "l", "c"],
                     ["a", "b"], ["x", "y"], ["a"], ["a", "b", "c", "f", "g", "h"], ["a", "b", "c"],
                     [f"p{i}" for i in range(20)], [f"p{i}" for i in range(16)], [f"p{i}" for i in range(15)] + ["q"]]
            async with store.read() as txn:
                for names in cases:
                    got = await txn.lookup_path(1, names)
                    want = await MetaTxn.lookup_path(txn, 1, names)
                    assert got == want, names
                assert [r.name for r in await txn.lookup_path(1, ["a", "b", "c", "f"])] == ["a", "b", "c", "f"]
        finally:
            await store.close()

    asyncio.run(go())
