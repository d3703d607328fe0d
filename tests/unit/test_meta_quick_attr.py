"""Root's one-statement stat/READ (``MetaStore.quick_attr``) answers exactly what the walk does."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path
from typing import Any, cast

import pytest

from loomfs.common.identity import Identity
from loomfs.errors import StatusError
from loomfs.meta.caller import acting_as
from loomfs.meta.ops.namespace import Namespace
from loomfs.meta.perm_cost import _OneChain
from loomfs.meta.store.sqlite import SqliteStore
from loomfs.wire.types import Layout

PUT = os.O_CREAT | os.O_WRONLY | os.O_TRUNC


async def _outcome(fn: Any, *args: Any, **kw: Any) -> object:
    try:
        return await fn(*args, **kw)
    except StatusError as exc:
        return ("error", exc.status)


@pytest.mark.parametrize("url", ["file", ":memory:"])
def test_quick_attr_agrees_with_the_walk(tmp_path: Path, url: str) -> None:
    async def go() -> None:
        store = SqliteStore(str(tmp_path / "m.db") if url == "file" else ":memory:")
        ns = Namespace(store, routing=cast(Any, _OneChain()), rng=random.Random(1),
                       default_layout=Layout(table_id=1, inline_max_bytes=64))
        try:
            await ns.init()
            await ns.mkdir("/a/b/c", parents=True)
            await ns.open("/a/b/c/small", PUT, data=b"inline bytes")
            await ns.open("/a/b/c/big", PUT, data=b"x" * 100)  # over the 64-byte limit: chunked
            await ns.open("/a/b/c/empty", PUT, data=b"")
            await ns.symlink("/a/b", "/a/dirlink")
            await ns.symlink("/a/b/c/small", "/a/filelink")
            await ns.symlink("/nowhere", "/a/dangling")
            await ns.symlink("small", "/a/b/c/rel")
            await ns.link("/a/b/c/small", "/a/hard")
            paths = ["/a", "/a/b", "/a/b/c", "/a/b/c/small", "/a/b/c/big", "/a/b/c/empty", "/a/dirlink",
                     "/a/dirlink/c/small", "/a/filelink", "/a/dangling", "/a/b/c/rel", "/a/hard", "/missing",
                     "/a/missing/x", "/a/b/c/small/x", "/a/filelink/x", "/a/dangling/x", "/", "/a/b/c/small/"]
            before = store.quick_reads
            for p in paths:
                for follow in (True, False):
                    fast_stat = await _outcome(ns.stat, p, follow_symlinks=follow)
                    fast_read = await _outcome(ns.read, p, follow_symlinks=follow)
                    quick = store.quick_attr
                    store.quick_attr = lambda *a, **k: None  # type: ignore[method-assign]
                    try:
                        walk_stat = await _outcome(ns.stat, p, follow_symlinks=follow)
                        walk_read = await _outcome(ns.read, p, follow_symlinks=follow)
                    finally:
                        store.quick_attr = quick  # type: ignore[method-assign]
                    assert fast_stat == walk_stat, (p, follow)
                    assert fast_read == walk_read, (p, follow)
            assert store.quick_reads > before  # the shortcut did answer
            small = await ns.read("/a/b/c/small")
            assert small[1] == b"inline bytes"
            # other callers: the search checks on every directory crossed and the file's read
            # bit, as the walk makes them (EACCES where it would be)
            await ns.mkdir("/p/closed/inner", parents=True, mode=0o755)
            await ns.open("/p/closed/inner/f", PUT, mode=0o640, data=b"secret", uid=1000, gid=2000)
            await ns.open("/p/closed/inner/g", PUT, mode=0o600, data=b"other's")
            await ns.setattr("/p/closed", mode=0o700)
            await ns.setattr("/p/closed/inner", mode=0o711)
            users = [Identity(uid=1000, gid=1000), Identity(uid=1001, gid=2000), Identity(uid=1002, gid=3000),
                     Identity(uid=1003, gid=3000, groups=(2000,))]
            targets = [*paths, "/p/closed/inner/f", "/p/closed/inner/g", "/p/closed", "/p/closed/inner",
                       "/p/closed/missing"]
            n = store.quick_reads
            for who in users:
                with acting_as(who):
                    for p in targets:
                        fast = (await _outcome(ns.stat, p), await _outcome(ns.read, p))
                        quick = store.quick_attr
                        store.quick_attr = lambda *a, **k: None  # type: ignore[method-assign]
                        try:
                            walk = (await _outcome(ns.stat, p), await _outcome(ns.read, p))
                        finally:
                            store.quick_attr = quick  # type: ignore[method-assign]
                        assert fast == walk, (who, p)
            assert store.quick_reads > n  # non-root callers take the shortcut too
            await ns.setattr("/p/closed", mode=0o755)
            with acting_as(Identity(uid=1001, gid=2000)):
                assert (await ns.read("/p/closed/inner/f"))[1] == b"secret"  # group read through 0o711
            if url == "file":
                async with store.write() as txn:  # uncommitted work on the write connection
                    await txn.add_counter("x", 1)
                    assert store.quick_attr(1, ["a"], follow_last=True) is None
        finally:
            await store.close()

    asyncio.run(go())
