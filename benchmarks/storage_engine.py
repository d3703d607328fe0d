"""ChunkEngine throughput: 4 MiB full-chunk writes+commits, 4 MiB reads, 4 KiB partial writes.

    python benchmarks/storage_engine.py [--engine file|memory] [--fsync] [--dir /tmp/x] [--mib 256]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import crc32c

from loomfs.storage.engine.base import ChunkEngine, ChunkKey
from loomfs.storage.engine.file import FileEngine
from loomfs.storage.engine.memory import MemoryEngine

CHUNK = 4 << 20
SMALL = 4 << 10


def timed(label: str, nbytes: int, ops: int, fn: Callable[[], None]) -> None:
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    print(f"{label:<34} {nbytes / dt / 1e6:9.1f} MB/s  {ops / dt:9.0f} ops/s  {dt * 1e6 / ops:8.1f} us/op")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", choices=["file", "memory"], default="file")
    ap.add_argument("--fsync", action="store_true")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--mib", type=int, default=256, help="data per phase")
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="loomfs-bench-"))
    engine: ChunkEngine = (
        FileEngine(root / "target", fsync_on_commit=args.fsync) if args.engine == "file" else MemoryEngine()
    )
    loop = asyncio.new_event_loop()
    chunks = max(1, (args.mib << 20) // CHUNK)
    data = bytearray(os.urandom(CHUNK))
    data_crc = crc32c.crc32c(data)
    versions: dict[ChunkKey, int] = {}

    def commit_write(key: ChunkKey, offset: int, buf: memoryview | bytearray, crc: int | None = None) -> None:
        v = versions.get(key, 0) + 1
        engine.stage_write(key, v, offset, buf, data_crc=crc)
        loop.run_until_complete(engine.commit(key, v))
        versions[key] = v

    def full_writes() -> None:
        for i in range(chunks):
            commit_write(ChunkKey(1, i % 16), 0, data, data_crc)  # 16 keys reused: overwrite path

    def reads() -> None:
        into = memoryview(bytearray(CHUNK))
        for i in range(chunks):
            engine.read(ChunkKey(1, i % 16), 0, into)

    small_ops = max(1, (args.mib << 20) // CHUNK * 64)
    piece = memoryview(data)[:SMALL]

    def appends() -> None:
        for i in range(small_ops):
            key = ChunkKey(2, i // (CHUNK // SMALL))
            commit_write(key, (i % (CHUNK // SMALL)) * SMALL, piece)

    rng = random.Random(1)

    def overwrites() -> None:
        for _ in range(small_ops // 16):
            commit_write(ChunkKey(1, rng.randrange(16)), rng.randrange(CHUNK // SMALL) * SMALL, piece)

    def small_reads() -> None:
        into = memoryview(bytearray(SMALL))
        for _ in range(small_ops):
            engine.read(ChunkKey(1, rng.randrange(16)), rng.randrange(CHUNK // SMALL) * SMALL, into)

    print(f"engine={args.engine} fsync={args.fsync} dir={root}")
    full_writes()  # warm up: files and page cache exist
    timed("4 MiB full-chunk write+commit", chunks * CHUNK, chunks, full_writes)
    timed("4 MiB read", chunks * CHUNK, chunks, reads)
    timed("4 KiB append write+commit", small_ops * SMALL, small_ops, appends)
    timed("4 KiB overwrite (COW) write+commit", small_ops // 16 * SMALL, small_ops // 16, overwrites)
    timed("4 KiB random read", small_ops * SMALL, small_ops, small_reads)
    engine.close()
    loop.close()
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
