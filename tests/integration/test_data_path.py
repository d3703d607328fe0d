"""Data path against real processes: striping, overwrites, truncate/extend, verification."""

from __future__ import annotations

import hashlib
import os
import random

import pytest

import loomfs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def test_256mib_across_stripes_sha256(fs: loomfs.LoomFS, base: str) -> None:
    rng = random.Random(42)
    block = rng.randbytes(8 << 20)
    h = hashlib.sha256()
    path = f"{base}/big.bin"
    with fs.open(path, "wb") as f:
        for i in range(32):  # 256 MiB, every block different
            b = bytes([i]) + block[1:]
            h.update(b)
            f.write(b)
    assert fs.stat(path).st_size == 256 << 20
    layout = fs.get_layout(path)
    assert len(layout.chains) >= 2  # striped over several chains
    g = hashlib.sha256()
    with fs.open(path, "rb") as f:
        while chunk := f.read(7 << 20):  # not chunk-aligned on purpose
            g.update(chunk)
    assert g.hexdigest() == h.hexdigest()


def test_overwrite_middle_of_chunks(fs: loomfs.LoomFS, base: str) -> None:
    path = f"{base}/ow.bin"
    size = 13 << 20
    data = bytearray(os.urandom(size))
    with fs.open(path, "wb") as f:
        f.write(data)
    rng = random.Random(3)
    with fs.open(path, "r+b") as f:
        for _ in range(40):
            off = rng.randrange(size - 1)
            n = rng.randrange(1, min(3 << 20, size - off) + 1)
            patch = os.urandom(n)
            f.seek(off)
            f.write(patch)
            data[off:off + n] = patch
    with fs.open(path, "rb") as f:
        assert f.read() == bytes(data)
    with fs.open(path, "rb") as f:  # random reads of pieces
        for _ in range(50):
            off = rng.randrange(size)
            n = rng.randrange(1, 1 << 20)
            f.seek(off)
            assert f.read(n) == bytes(data[off:off + n])


def test_truncate_and_extend(fs: loomfs.LoomFS, base: str) -> None:
    path = f"{base}/tr.bin"
    data = os.urandom(9 << 20)
    with fs.open(path, "wb") as f:
        f.write(data)
    fs.truncate(path, 5 << 20 | 123)
    assert fs.stat(path).st_size == 5 << 20 | 123
    fs.truncate(path, 11 << 20)  # extend: the gap reads as zeros, old bytes do not come back
    with fs.open(path, "rb") as f:
        got = f.read()
    want = data[: 5 << 20 | 123] + bytes((11 << 20) - (5 << 20 | 123))
    assert len(got) == len(want) and got == want
    with fs.open(path, "r+b") as f:
        f.truncate(1000)
    assert fs.cat(path) == data[:1000]
    with fs.open(path, "wb") as f:  # O_TRUNC removes old chunks
        f.write(b"x")
    with fs.open(path, "r+b") as f:
        f.seek(4 << 20)
        f.write(b"y")
    got = fs.cat(path)
    assert got == b"x" + bytes((4 << 20) - 1) + b"y"


def test_append_and_sparse(fs: loomfs.LoomFS, base: str) -> None:
    path = f"{base}/ap.log"
    for i in range(5):
        with fs.open(path, "ab") as f:
            f.write(f"line {i}\n".encode())
    assert fs.cat(path) == b"".join(f"line {i}\n".encode() for i in range(5))
    sparse = f"{base}/sparse"
    with fs.open(sparse, "wb") as f:
        f.seek(10 << 20)
        f.write(b"end")
    with fs.open(sparse, "rb") as f:
        f.seek((10 << 20) - 2)
        assert f.read() == b"\0\0end"
    assert fs.stat(sparse).st_size == (10 << 20) + 3


def test_small_files_and_readline(fs: loomfs.LoomFS, base: str) -> None:
    for i in range(50):
        with fs.open(f"{base}/s{i}", "wb") as f:
            f.write(f"{i}\nsecond\n".encode() * (i + 1))
    for i in range(50):
        with fs.open(f"{base}/s{i}", "rb") as f:
            assert f.readline() == f"{i}\n".encode()
            assert f.read() == (f"{i}\nsecond\n".encode() * (i + 1))[len(f"{i}\n"):]
    assert len(fs.ls(base)) == 50


def test_layout_set_is_inherited(fs: loomfs.LoomFS, base: str) -> None:
    d = f"{base}/small-chunks"
    fs.mkdir(d)
    fs.set_layout(d, chunk_size=1 << 20, stripe=2)
    with fs.open(f"{d}/f", "wb") as f:
        f.write(os.urandom(5 << 20))
    lay = fs.get_layout(f"{d}/f")
    assert lay.chunk_size == 1 << 20 and len(lay.chains) == 2
    fs.mkdir(f"{d}/sub")
    with fs.open(f"{d}/sub/g", "wb") as f:
        f.write(b"abc")
    assert fs.get_layout(f"{d}/sub/g").chunk_size == 1 << 20


def test_deleted_data_is_garbage_collected(fs: loomfs.LoomFS, base: str, cluster) -> None:  # type: ignore[no-untyped-def]
    import time

    path = f"{base}/gc.bin"
    before = fs.statfs().gc_pending  # other tests may leave files GC waits on (sessions of killed clients)
    with fs.open(path, "wb") as f:
        f.write(os.urandom(16 << 20))
    inode = fs.stat(path).st_ino
    chunks = cluster.chunks_of(inode)
    assert len(chunks) == 4 * 3  # 4 chunks of 4 MiB, 3 replicas each
    assert len({t for t, _ in chunks}) >= 3
    fs.rm(path)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and cluster.chunks_of(inode):
        time.sleep(0.3)
    assert cluster.chunks_of(inode) == [], "chunks of the unlinked file were not removed"
    assert fs.statfs().gc_pending <= before  # its entry is gone too
