"""fsspec's caching layers over ``loom://`` (hunt 15b): ``blockcache::`` opens the file and
reads through an MMapCache over the file's ``_fetch_range`` (it failed: no such method), and
the blocks it fetched are read from the local cache next time."""

from __future__ import annotations

import os
from typing import Any

import fsspec
from test_fsspec import _close_shared_clients, lfs  # noqa: F401

from loomfs.fsspec import LoomFileSystem

DATA = bytes(range(256)) * 20000  # 5 MB


def test_blockcache_reads_through_its_cache(lfs: LoomFileSystem, base: str, tmp_path: Any) -> None:  # noqa: F811
    lfs.pipe(f"{base}/f", DATA)
    url = f"blockcache::loom://{lfs.mgmtd}{base}/f"
    opts = {"blockcache": {"cache_storage": str(tmp_path / "bc")}}
    with fsspec.open(url, "rb", **opts) as f:
        f.seek(1000)
        assert f.read(10) == DATA[1000:1010]
        assert f.tell() == 1010
        buf = bytearray(6)
        assert f.readinto(buf) == 6 and bytes(buf) == DATA[1010:1016]
        f.seek(-5, os.SEEK_END)
        assert f.read() == DATA[-5:]
        assert f.read() == b""
    fetched = []
    orig = LoomFileSystem.cat_file

    def counting(self: LoomFileSystem, path: str, start: Any = None, end: Any = None, **kw: Any) -> bytes:
        fetched.append((start, end))
        return orig(self, path, start, end, **kw)

    LoomFileSystem.cat_file = counting  # type: ignore[method-assign]
    try:
        with fsspec.open(url, "rb", **opts) as f:
            f.seek(1000)
            assert f.read(10) == DATA[1000:1010]  # a block fetched before: from the local cache
    finally:
        LoomFileSystem.cat_file = orig  # type: ignore[method-assign]
    assert fetched == []


def test_simple_and_file_cache(lfs: LoomFileSystem, base: str, tmp_path: Any) -> None:  # noqa: F811
    lfs.pipe(f"{base}/f", DATA)
    for chain in ("simplecache", "filecache"):
        with fsspec.open(f"{chain}::loom://{lfs.mgmtd}{base}/f", "rb",
                         **{chain: {"cache_storage": str(tmp_path / chain)}}) as f:
            f.seek(1000)
            assert f.read(10) == DATA[1000:1010], chain
