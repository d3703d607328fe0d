"""STAT_MANY's compact reply (attribute rows and shared layouts, ``wire.meta_batch.attr_row``):
the same attributes as the map form, a malformed row refused, and the client's stat_many on it."""

from __future__ import annotations

import errno

import pytest
from test_meta_batch import CREAT, Cluster, run_cluster

from loomfs.wire import meta_batch as wb
from loomfs.wire.types import Attr, FileType, Layout


def test_compact_rows_carry_what_the_attrs_carry() -> None:
    async def body(c: Cluster) -> None:
        await c.ns.mkdir("/d")
        for i in range(20):
            await c.put(f"/d/f{i}", bytes(i))
        o = await c.ns.open("/d/big", CREAT, chunked=True)
        await c.ns.close(o.attr.inode, o.session_id, 10)
        await c.ns.symlink("/d/f1", "/d/link")
        paths = [*(f"/d/f{i}" for i in range(20)), "/d/big", "/d", "/d/link", "/nope", "/d/f1/x", "/"]
        for follow in (True, False):
            full: wb.StatManyRsp = (await c.call(wb.STAT_MANY, wb.PathsReq(paths=paths, follow_symlinks=follow))).body
            rsp = await c.call(wb.STAT_MANY, wb.PathsReq(paths=paths, follow_symlinks=follow, compact=True))
            compact: wb.StatManyRsp = rsp.body
            assert compact.count == full.count == len(paths) and not compact.attrs
            got = [None if r is None else wb.attr_of_row(r, compact.layouts) for r in compact.rows]
            assert got == full.attrs
            assert compact.errors == full.errors
            assert [(e.index, e.status) for e in compact.errors] == [(23, errno.ENOENT), (24, errno.ENOTDIR)]
            # shared: one per distinct layout (files start on 8 chains round-robin, plus the
            # directory's), not one per file
            assert len(compact.layouts) <= 9 < len(paths)
        # the client's stat_many asks for rows and answers Attr objects, errors per item
        res = await c.client.stat_many(["/d/f3", "/nope", "/d/big", "/d/link"], follow_symlinks=False)
        assert res[0] == await c.ns.stat("/d/f3") and res[2] == await c.ns.stat("/d/big")
        assert isinstance(res[1], FileNotFoundError)
        assert isinstance(res[3], Attr) and res[3].type == FileType.SYMLINK

    run_cluster(body)


def test_malformed_rows_are_refused() -> None:
    lay = Layout(chains=[1, 2])
    good = wb.attr_row(Attr(inode=5, size=3, layout=lay, symlink_target="", inline=True), layouts := [], {})
    assert layouts == [lay] and wb.attr_of_row(good, layouts).layout is lay
    bad_rows = [good[:-1], [*good, 0], [True, *good[1:]], good[:6] + ["7"] + good[7:], good[:10] + [1] + good[11:],
                good[:10] + [-2] + good[11:], good[:11] + [b"x"] + good[12:], good[:12] + [1] + good[13:], tuple(good),
                None, "row"]
    for row in bad_rows:
        with pytest.raises(ValueError):
            wb.attr_of_row(row, layouts)


def test_layouts_are_shared_by_object() -> None:
    a, b = Layout(chains=[1]), Layout(chains=[1])
    layouts: list[Layout] = []
    index: dict[int, int] = {}
    rows = [wb.attr_row(Attr(inode=i, layout=lay), layouts, index) for i, lay in enumerate([a, a, b, None, a])]
    assert layouts == [a, b] and layouts[0] is a and layouts[1] is b
    assert [r[10] for r in rows] == [0, 0, 1, -1, 0]
