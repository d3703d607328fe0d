"""``fs.open(path, "rb", cache_type=..., block_size=...)`` as fsspec's buffered files honour
them (session 16): they were ignored (every read went to the client's file whatever the
caller asked). Without a cache_type reads stay on the client's own read path."""

from __future__ import annotations

import os
from typing import Any

import pytest
from test_fsspec import _close_shared_clients, lfs  # noqa: F401

from loomfs.fsspec import LoomFileSystem

DATA = bytes(range(256)) * 4096  # 1 MiB
LINES = b"".join(b"line %05d\n" % i for i in range(20000))


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, Any]]:
    fetched: list[tuple[Any, Any]] = []
    orig = LoomFileSystem.cat_file

    def counting(self: LoomFileSystem, path: str, start: Any = None, end: Any = None, **kw: Any) -> bytes:
        fetched.append((start, end))
        return orig(self, path, start, end, **kw)

    monkeypatch.setattr(LoomFileSystem, "cat_file", counting)
    return fetched


@pytest.mark.parametrize("cache_type", ["readahead", "bytes", "first", "all", "blockcache", "mmap", "background"])
def test_reads_through_the_asked_cache(lfs: LoomFileSystem, base: str, cache_type: str,  # noqa: F811
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    lfs.pipe(f"{base}/f", DATA)
    fetched = _counting(monkeypatch)
    with lfs.open(f"{base}/f", "rb", cache_type=cache_type, block_size=64 << 10) as f:
        assert f.blocksize == 64 << 10
        assert type(f.cache).name == cache_type
        assert f.read(10) == DATA[:10]
        f.seek(300_000)
        assert f.read(1000) == DATA[300_000:301_000]
        buf = bytearray(6)
        assert f.readinto(buf) == 6 and bytes(buf) == DATA[301_000:301_006]
        f.seek(-5, os.SEEK_END)
        assert f.read() == DATA[-5:]
        assert f.read() == b""
    assert fetched, "nothing went through the cache's fetcher"


def test_first_caches_the_head(lfs: LoomFileSystem, base: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    lfs.pipe(f"{base}/f", DATA)
    fetched = _counting(monkeypatch)
    with lfs.open(f"{base}/f", "rb", cache_type="first", block_size=4096) as f:
        for _ in range(3):
            f.seek(0)
            assert f.read(100) == DATA[:100]
    assert len(fetched) == 1  # the head once, then from the cache


def test_readline_through_a_cache(lfs: LoomFileSystem, base: str) -> None:  # noqa: F811
    lfs.pipe(f"{base}/lines", LINES)
    with lfs.open(f"{base}/lines", "rb", cache_type="readahead", block_size=1000) as f:
        assert f.readline() == b"line 00000\n"
        assert f.readline(4) == b"line"
        assert f.readline() == b" 00001\n"
        assert sum(1 for _ in iter(f.readline, b"")) == 19998


def test_no_cache_type_keeps_the_clients_path(lfs: LoomFileSystem, base: str,  # noqa: F811
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    lfs.pipe(f"{base}/f", DATA)
    fetched = _counting(monkeypatch)
    for kw in ({}, {"cache_type": "none"}, {"block_size": 1 << 20}):
        with lfs.open(f"{base}/f", "rb", **kw) as f:
            assert "cache" not in f.__dict__
            assert f.read() == DATA
    assert fetched == []


def test_bad_cache_type_or_block_size(lfs: LoomFileSystem, base: str) -> None:  # noqa: F811
    lfs.pipe(f"{base}/f", b"x")
    with pytest.raises(ValueError, match="cache_type"):
        lfs.open(f"{base}/f", "rb", cache_type="nope")
    with pytest.raises(ValueError, match="block_size"):
        lfs.open(f"{base}/f", "rb", block_size=0)


def test_a_write_file_ignores_the_cache_type(lfs: LoomFileSystem, base: str) -> None:  # noqa: F811
    with lfs.open(f"{base}/w", "wb", cache_type="readahead") as f:
        f.write(b"written")
    assert lfs.cat_file(f"{base}/w") == b"written"
