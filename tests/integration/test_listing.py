"""Listing big directories: ``iterdir`` streams READDIR pages (names in order, attributes
with ``detail``), ``ls``/``walk`` agree with it."""

from __future__ import annotations

import asyncio

import pytest

import loomfs

pytestmark = pytest.mark.integration


def test_iterdir_streams_pages_in_order(fs: loomfs.LoomFS, base: str) -> None:
    d = f"{base}/big"
    fs.makedirs(d)
    names = [f"f{i:05d}" for i in range(2500)]  # more than two READDIR pages
    client = fs.client

    async def fill() -> None:
        sem = asyncio.Semaphore(64)

        async def one(n: str) -> None:
            async with sem:
                await client.pipe(f"{d}/{n}", n.encode())

        await asyncio.gather(*(one(n) for n in names))

    fs.run(fill())
    it = fs.iterdir(d)
    assert next(it) == f"{d}/f00000"  # the first page arrives before the rest is read
    assert [f"{d}/f00000", *it] == [f"{d}/{n}" for n in names]
    infos = list(fs.iterdir(d, detail=True))
    assert [i["name"] for i in infos] == [f"{d}/{n}" for n in names]
    assert all(i["size"] == 6 and i["type"] == "file" for i in infos)
    assert fs.ls(d) == [f"{d}/{n}" for n in names]
    assert sorted(next(fs.walk(d))[2]) == names
    with pytest.raises(NotADirectoryError):
        list(fs.iterdir(f"{d}/f00001"))
