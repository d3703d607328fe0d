"""fsspec file modes against a real cluster: appends and exclusive creates inside a
transaction, where an append starts, ``rm`` with ``maxdepth`` (found by the fsspec bug hunt;
each test failed on the code before its fix)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from loomfs.fsspec import LoomFileSystem, close_clients
from loomfs.testing import LocalCluster


@pytest.fixture(scope="module", autouse=True)
def _close_shared_clients() -> Iterator[None]:
    yield
    close_clients()


@pytest.fixture()
def lfs(cluster: LocalCluster) -> LoomFileSystem:
    return LoomFileSystem(cluster.mgmtd_address)


def _temps(lfs: LoomFileSystem, d: str) -> list[str]:
    return [p for p in lfs.ls(d, detail=False) if ".loomfs-" in p]  # transaction temporaries


def test_transaction_append_keeps_the_file(lfs: LoomFileSystem, base: str) -> None:
    p = f"{base}/log"
    lfs.pipe(p, b"ORIGINAL")
    with lfs.transaction:
        with lfs.open(p, "ab") as f:
            f.write(b"+APP")
    assert lfs.cat(p) == b"ORIGINAL+APP"  # was b"+APP": the temp file replaced the file
    assert _temps(lfs, base) == []


def test_transaction_exclusive_create(lfs: LoomFileSystem, base: str) -> None:
    p = f"{base}/x"
    lfs.pipe(p, b"KEEP")
    with pytest.raises(FileExistsError):
        with lfs.transaction:
            lfs.open(p, "xb")
    assert lfs.cat(p) == b"KEEP"
    q = f"{base}/y"  # made by someone else between the open and the commit
    with pytest.raises(FileExistsError):
        with lfs.transaction:
            with lfs.open(q, "xb") as f:
                f.write(b"MINE")
            lfs.pipe(q, b"THEIRS")
    assert lfs.cat(q) == b"THEIRS"
    assert _temps(lfs, base) == []
    with lfs.transaction:  # a new file commits
        with lfs.open(f"{base}/z", "xb") as f:
            f.write(b"NEW")
        assert not lfs.exists(f"{base}/z")
    assert lfs.cat(f"{base}/z") == b"NEW"


def test_append_starts_at_the_end(lfs: LoomFileSystem, base: str) -> None:
    p = f"{base}/t"
    lfs.pipe(p, b"0123456789")
    with lfs.open(p, "ab") as f:
        assert f.tell() == 10  # as open(p, "ab") and fsspec's memory filesystem
        f.write(b"ab")
        assert f.tell() == 12
    assert lfs.cat(p) == b"0123456789ab"

    async def go() -> int:
        async with await lfs.open_async(p, "ab") as af:
            return af.tell()

    assert asyncio.run(go()) == 12
