"""``StorageClient.read_chunk_crc``: the reply's checked payload CRC is the CRC of the bytes
read (whole chunk and a range), and no CRC is claimed where part of the buffer was zero-filled."""

from __future__ import annotations

import os

import crc32c
import pytest

import loomfs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_read_chunk_crc_is_the_crc_of_the_bytes(fs: loomfs.LoomFS, base: str) -> None:
    path = f"{base}/f.bin"
    data = os.urandom((4 << 20) + 300_000)
    with fs.open(path, "wb") as f:
        f.write(data)
    layout = fs.get_layout(path)
    inode = fs.stat(path).st_ino
    cs = layout.chunk_size
    storage = fs.client.storage

    def read(index: int, offset: int, length: int) -> tuple[int, int | None, bytes]:
        buf = bytearray(length)
        n, crc = fs.run(storage.read_chunk_crc(layout, inode, index, offset, length, memoryview(buf)))
        return n, crc, bytes(buf)

    n, crc, got = read(0, 0, cs)  # a whole chunk: the stored chunk CRC, checked on arrival
    assert n == cs and got == data[:cs] and crc == crc32c.crc32c(got)
    n, crc, got = read(0, 12345, 2 << 20)  # a range: the CRC the server computed of what it sent
    assert got == data[12345 : 12345 + (2 << 20)] and crc == crc32c.crc32c(got)
    n, crc, got = read(1, 0, 400_000)  # past the chunk's end: zero-filled, no CRC claimed
    assert n == 300_000 and got == data[cs:] + bytes(100_000) and crc is None
    assert fs.run(storage.read_chunk(layout, inode, 1, 0, 400_000, memoryview(bytearray(400_000)))) == 300_000
