"""Reads of recently read chunks (whole, or whole blocks of one: a 2 MiB KV value of a 4 MiB
chunk) come from the storage page cache (``os.sendfile`` of the chunk file,
``storage.hotchunks``): the bytes are right every time, a range read again is left in the page
cache (reads before it used O_DIRECT), and a replica whose cached copy went bad is caught by the
client's end-to-end CRC check (the chunk's stored CRC, or the range's blocks' stored CRCs
joined), reported and read from another replica."""

from __future__ import annotations

import os
from pathlib import Path

import crc32c
import pytest

import loomfs
from loomfs.storage.hotchunks import resident
from loomfs.testing import LocalCluster
from loomfs.testing.certs import openssl_available

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

READS_MAX = 40


def _chunk_files(root: Path, inode: int, index: int) -> list[Path]:
    return sorted(root.glob(f"storage*/target*/chunks/*/{inode:x}.{index:x}.*"))


def _resident(p: Path, length: int, offset: int = 0) -> bool:
    fd = os.open(p, os.O_RDONLY)
    try:
        return resident(fd, length, offset)
    finally:
        os.close(fd)


def test_hot_whole_chunk_reads_from_page_cache_and_checked(own_cluster) -> None:  # type: ignore[no-untyped-def]
    _hot_reads(own_cluster)


def test_hot_aligned_part_reads_from_page_cache_and_checked(own_cluster) -> None:  # type: ignore[no-untyped-def]
    _hot_reads(own_cluster, offset=2 << 20, length=2 << 20, path="/hot/half.bin")


@pytest.mark.skipif(not openssl_available(), reason="needs the openssl command for certificates")
def test_hot_reads_over_tls_read_the_region_into_memory(tmp_path: Path) -> None:
    """Under TLS the bytes must go through the SSL layer: the region is read into memory and
    sent as usual, with the same end-to-end check."""
    c = LocalCluster(tmp_path / "tls", storage_nodes=2, targets_per_node=1, replicas=2, tls=True)
    try:
        c.start(timeout_s=60)
        _hot_reads(c)
    finally:
        c.stop()


def _hot_reads(cluster: LocalCluster, offset: int = 0, length: int = 0, path: str = "/hot/one_chunk.bin") -> None:
    fs = loomfs.connect(str(cluster.root))
    try:
        fs.makedirs("/hot", exist_ok=True)
        data = os.urandom(4 << 20)
        with fs.open(path, "wb") as f:
            f.write(data)
        layout = fs.get_layout(path)
        cs = layout.chunk_size
        assert cs == len(data)
        length = length or cs
        want = data[offset : offset + length]
        inode = fs.stat(path).st_ino
        files = _chunk_files(Path(cluster.root), inode, 0)
        assert len(files) == cluster.replicas, files
        for p in files:  # written with O_DIRECT; make sure nothing of it is cached
            fd = os.open(p, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        assert not any(_resident(p, cs) for p in files)
        storage = fs.client.storage
        buf = bytearray(length)

        def read() -> int | None:
            n, crc = fs.run(storage.read_chunk_crc(layout, inode, 0, offset, length, memoryview(buf)))
            assert n == length and bytes(buf) == want
            return crc

        want_crc = crc32c.crc32c(want)
        for _ in range(6):  # one replica serves a chunk: O_DIRECT (twice), fill, then the page cache
            assert read() == want_crc
        hot = [p for p in files if _resident(p, length, offset)]
        assert hot, "no replica kept a range it served twice in its page cache"
        # rot in one replica's cached copy: the client's CRC check catches it, reports it and
        # reads another replica; it never returns the bad bytes
        with open(hot[0], "r+b") as f:
            f.seek(offset + length // 2)
            flipped = bytes(b ^ 0xFF for b in f.read(16))
            f.seek(offset + length // 2)
            f.write(flipped)
        assert hot[0].read_bytes() != data
        before = storage.corrupt_reports_total
        for _ in range(READS_MAX):
            assert read() == want_crc
            if storage.corrupt_reports_total > before:
                break
        assert storage.corrupt_reports_total > before, "the bad replica was never read (or not caught)"
    finally:
        fs.close()
