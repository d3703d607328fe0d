"""Batch reads through the engine's batch lookup (``SqliteStore.entries_in``: the names of one
directory in one statement) answer exactly what the single calls answer, for every caller."""

from __future__ import annotations

import asyncio
import errno
import os
import random
from pathlib import Path
from typing import Any, cast

import pytest

from loomfs.common.identity import Identity
from loomfs.errors import StatusError
from loomfs.meta.caller import acting_as
from loomfs.meta.ops.batch import BatchOps, Content, Failed, Inline
from loomfs.meta.ops.namespace import Namespace
from loomfs.meta.perm_cost import _OneChain
from loomfs.meta.store.sqlite import SqliteStore
from loomfs.wire.types import Layout

PUT = os.O_CREAT | os.O_WRONLY | os.O_TRUNC
USERS = [None, Identity(uid=1000, gid=1000), Identity(uid=1001, gid=2000), Identity(uid=1003, gid=3000, groups=(2000,))]


async def _single(ns: Namespace, p: str, follow: bool, kind: str) -> object:
    try:
        if kind == "stat":
            return await ns.stat(p, follow_symlinks=follow)
        attr, data = await ns.read(p, follow_symlinks=follow)
        if attr.type != 1:  # FILE: READ of anything else is the batch's EISDIR/ELOOP
            return "not a file"
        return (attr, data)
    except StatusError as exc:
        return int(exc.status)


def _batch(r: object, kind: str) -> object:
    if isinstance(r, Failed):
        return r.status
    if kind == "stat":
        return r
    assert isinstance(r, Content)
    return (r.attr, r.data)


async def _tree(ns: Namespace) -> list[str]:
    await ns.mkdir("/a/b/c", parents=True)
    await ns.mkdir("/many")
    await ns.open("/a/b/c/small", PUT, data=b"inline bytes")
    await ns.open("/a/b/c/big", PUT, data=b"x" * 100)  # over the 64-byte limit: chunked
    await ns.open("/a/b/c/empty", PUT, data=b"")
    await ns.symlink("/a/b", "/a/dirlink")
    await ns.symlink("/a/b/c/small", "/a/filelink")
    await ns.symlink("/nowhere", "/a/dangling")
    await ns.symlink("small", "/a/b/c/rel")
    await ns.symlink("../b/c/", "/a/b/slash")
    await ns.link("/a/b/c/small", "/a/hard")
    await ns.mkdir("/p/closed/inner", parents=True, mode=0o755)
    await ns.open("/p/closed/inner/f", PUT, mode=0o640, data=b"secret", uid=1000, gid=2000)
    await ns.open("/p/closed/inner/g", PUT, mode=0o600, data=b"other's")
    await ns.open("/p/closed/inner/w", PUT, mode=0o604, data=b"world")
    await ns.setattr("/p/closed", mode=0o711)
    await ns.setattr("/p/closed/inner", mode=0o710, gid=2000)
    for i in range(40):
        await ns.open(f"/many/f{i:03d}", PUT, mode=0o644 if i % 3 else 0o600, data=bytes([i]) * (i % 50))
    return ["/a", "/a/b", "/a/b/c", "/a/b/c/small", "/a/b/c/big", "/a/b/c/empty", "/a/dirlink",
            "/a/dirlink/c/small", "/a/filelink", "/a/dangling", "/a/b/c/rel", "/a/hard", "/missing",
            "/a/missing/x", "/a/b/c/small/x", "/a/filelink/x", "/a/dangling/x", "/", "/a/b/c/small/",
            "/a/b/slash/small", "/a/b/slash", "/a//b", "/a/./b", "/a/\x00", "rel", "", "/" + "x" * 300,
            "//a", "//many/f001", "/./a", "/a/..", "/a/.", "a/b", "/many/f001/", "/many/\x00x/f001",
            "/p/closed/inner/f", "/p/closed/inner/g", "/p/closed/inner/w", "/p/closed/inner/missing",
            "/p/closed", "/p/closed/inner", *(f"/many/f{i:03d}" for i in range(0, 45, 2))]


@pytest.mark.parametrize("url", ["file", ":memory:"])
def test_batches_answer_what_the_single_calls_answer(tmp_path: Path, url: str) -> None:
    async def go() -> None:
        store = SqliteStore(str(tmp_path / "m.db") if url == "file" else ":memory:")
        ns = Namespace(store, routing=cast(Any, _OneChain()), rng=random.Random(1),
                       default_layout=Layout(table_id=1, inline_max_bytes=64))
        try:
            await ns.init()
            paths = await _tree(ns)
            rng = random.Random(3)
            paths += [rng.choice(paths) for _ in range(60)]  # repeats, in any order
            ops = BatchOps(ns)
            for who in USERS:
                for follow in (True, False):
                    for kind in ("stat", "read"):
                        async def batch(k: str = kind, f: bool = follow) -> list[Any]:
                            if k == "stat":
                                return cast(list[Any], await ops.stat_many(paths, follow_symlinks=f))
                            return cast(list[Any], await ops.read_many(paths, follow_symlinks=f))

                        if who is None:
                            got = await batch()
                            want = [await _single(ns, p, follow, kind) for p in paths]
                        else:
                            with acting_as(who):
                                got = await batch()
                                want = [await _single(ns, p, follow, kind) for p in paths]
                        assert len(got) == len(paths)
                        for p, g, w in zip(paths, got, want, strict=True):
                            b = _batch(g, kind)
                            if w == "not a file":
                                assert isinstance(b, int), (who, follow, kind, p, b)
                            else:
                                assert b == w, (who, follow, kind, p)
        finally:
            await store.close()

    asyncio.run(go())


def test_a_directorys_files_come_in_one_statement(tmp_path: Path) -> None:
    """200 files of one directory: a handful of statements, not three per file."""
    async def go() -> None:
        store = SqliteStore(str(tmp_path / "m.db"))
        ns = Namespace(store, routing=cast(Any, _OneChain()), rng=random.Random(1),
                       default_layout=Layout(table_id=1, inline_max_bytes=4096))
        try:
            await ns.init()
            await ns.mkdir("/d/e", parents=True)
            paths = [f"/d/e/f{i:04d}" for i in range(200)]
            for i, p in enumerate(paths):
                await ns.open(p, PUT, data=i.to_bytes(4, "big") * 100)
            random.Random(1).shuffle(paths)
            statements: list[str] = []
            store._conn.set_trace_callback(statements.append)  # noqa: SLF001
            got = await BatchOps(ns).read_many(paths)
            store._conn.set_trace_callback(None)  # noqa: SLF001
            for p, r in zip(paths, got, strict=True):
                assert isinstance(r, Content) and r.data == int(p[-4:]).to_bytes(4, "big") * 100
                assert r.crc >= 0
            assert len(statements) < 10, statements
        finally:
            await store.close()

    asyncio.run(go())


@pytest.mark.parametrize("url", ["file", ":memory:"])
def test_light_read_many_answers_what_the_full_one_answers(tmp_path: Path, url: str) -> None:
    """``read_many(attrs=False)`` (READ_MANY's: plain inline files through the light lookup,
    ``sqlite_inline``) gives each item the bytes, CRC and error the full answer gives, for every
    caller and follow mode; files in chunks keep their attributes."""
    async def go() -> None:
        store = SqliteStore(str(tmp_path / "m.db") if url == "file" else ":memory:")
        ns = Namespace(store, routing=cast(Any, _OneChain()), rng=random.Random(1),
                       default_layout=Layout(table_id=1, inline_max_bytes=64))
        try:
            await ns.init()
            paths = await _tree(ns)
            paths += [random.Random(5).choice(paths) for _ in range(60)]
            ops = BatchOps(ns)
            light_hits = 0
            for who in USERS:
                for follow in (True, False):
                    async def both(f: bool = follow) -> tuple[list[Any], list[Any]]:
                        return (cast(list[Any], await ops.read_many(paths, follow_symlinks=f)),
                                cast(list[Any], await ops.read_many(paths, follow_symlinks=f, attrs=False)))

                    if who is None:
                        full, light = await both()
                    else:
                        with acting_as(who):
                            full, light = await both()
                    assert len(full) == len(light) == len(paths)
                    for p, f, g in zip(paths, full, light, strict=True):
                        if isinstance(g, Inline):
                            light_hits += 1
                            assert isinstance(f, Content) and f.attr.inline, (who, follow, p)
                            assert (g.data, g.crc) == (f.data, f.crc), (who, follow, p)
                        else:
                            assert g == f, (who, follow, p)
            assert light_hits > 100  # the light lookup answered most inline files
        finally:
            await store.close()

    asyncio.run(go())


def test_light_read_many_leaves_a_rotten_inline_row_to_the_full_path(tmp_path: Path) -> None:
    """Inline bytes failing their stored CRC are not answered by the light lookup: the item
    gets the single call's EIO."""
    async def go() -> None:
        store = SqliteStore(str(tmp_path / "m.db"))
        ns = Namespace(store, routing=cast(Any, _OneChain()), rng=random.Random(1),
                       default_layout=Layout(table_id=1, inline_max_bytes=4096))
        try:
            await ns.init()
            await ns.mkdir("/d")
            await ns.open("/d/good", PUT, data=b"fine")
            await ns.open("/d/bad", PUT, data=b"rotten")
            attr = await ns.stat("/d/bad")
            store._conn.execute("UPDATE inline_data SET data = ? WHERE inode = ?",  # noqa: SLF001
                                (b"rottem", attr.inode))
            good, bad = await BatchOps(ns).read_many(["/d/good", "/d/bad"], attrs=False)
            assert isinstance(good, Inline) and good.data == b"fine"
            assert isinstance(bad, Failed) and bad.status == errno.EIO
        finally:
            await store.close()

    asyncio.run(go())
