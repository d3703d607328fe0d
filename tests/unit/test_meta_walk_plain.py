"""The walk's plain-path shortcut (one ``lookup_path``, no component loop) resolves every path
exactly as the component loop does: the same ``Resolved``, the same directories noted for the
search check, the same errors."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path
from typing import Any, cast

from loomfs.errors import StatusError
from loomfs.meta.ops import walk as walk_mod
from loomfs.meta.ops.namespace import Namespace
from loomfs.meta.perm_cost import _OneChain
from loomfs.meta.store.base import DentryRow
from loomfs.meta.store.sqlite import SqliteStore
from loomfs.wire.types import ROOT_INODE, Layout


class _LoopOnly:
    """The transaction's lookups, but not a ``MetaTxn``: the walk takes its component loop."""

    def __init__(self, txn: Any):
        self._txn = txn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._txn, name)


def _outcome(fn: Any) -> Any:
    async def run() -> Any:
        searched: list[int] = []
        try:
            r = await fn(searched)
        except StatusError as exc:
            return ("error", exc.status, searched)
        return (r.parent, r.name, r.inode, r.type, r.stack, r.must_be_dir, searched)

    return run()


def test_plain_shortcut_matches_the_component_loop(tmp_path: Path) -> None:
    async def go() -> None:
        store = SqliteStore(str(tmp_path / "m.db"))
        ns = Namespace(store, routing=cast(Any, _OneChain()), rng=random.Random(1),
                       default_layout=Layout(table_id=1, inline_max_bytes=65536))
        try:
            await ns.init()
            await ns.mkdir("/a/b/c", parents=True)
            await ns.open("/a/b/c/f", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, data=b"x")
            await ns.symlink("/a/b", "/a/l")
            await ns.symlink("/a/b/c/f", "/a/b/fl")
            await ns.symlink("nowhere", "/a/dangling")
            paths = [["a", "b", "c", "f"], ["a", "b", "c", "new"], ["a", "b", "c"], ["a", "b"],
                     ["a", "x", "c"], ["a", "b", "c", "f", "g"], ["a", "l", "c"], ["a", "l"], ["a", "b", "fl"],
                     ["a", "dangling"], ["a", "dangling", "x"], ["x", "y"], ["a", "new"], ["a", "b", "c", "f", "g", "h"]]
            shortcut = 0
            async with store.read() as txn:
                for parts in paths:
                    for follow in (True, False):
                        got = await _outcome(lambda s, p=parts, f=follow: walk_mod._walk(txn, p, f, s))
                        want = await _outcome(lambda s, p=parts, f=follow: walk_mod._walk(_LoopOnly(txn), p, f, s))
                        assert got == want, (parts, follow)
                        rows: list[DentryRow] = await txn.lookup_path(ROOT_INODE, parts)
                        if walk_mod._plain(parts, rows, follow, None, ROOT_INODE) is not None:
                            shortcut += 1
            assert shortcut >= 12  # the shortcut answered most of them
        finally:
            await store.close()

    asyncio.run(go())
