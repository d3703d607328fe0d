"""Benchmark workloads against a running cluster, through the public client API."""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

import crc32c


@dataclass
class Result:
    name: str
    value: float
    unit: str
    limit_name: str = ""
    limit_value: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        return self.value / self.limit_value if self.limit_value else None


def seq_write(fs: Any, path: str, total_bytes: int, block_bytes: int = 16 << 20) -> tuple[float, int]:
    buf = memoryview(bytearray(os.urandom(block_bytes)))
    t0 = time.perf_counter()
    with fs.open(path, "wb") as f:
        done = 0
        while done < total_bytes:
            n = min(block_bytes, total_bytes - done)
            f.write(buf[:n])
            done += n
    dt = time.perf_counter() - t0
    return total_bytes / dt, crc32c.crc32c(buf)


def seq_read(fs: Any, path: str, block_bytes: int = 16 << 20) -> float:
    buf = memoryview(bytearray(block_bytes))
    t0 = time.perf_counter()
    total = 0
    with fs.open(path, "rb") as f:
        while n := f.readinto(buf):
            total += n
    return total / (time.perf_counter() - t0)


def random_reads(fs: Any, path: str, size_bytes: int, io_bytes: int, count: int, seed: int = 7) -> dict[str, float]:
    """Random aligned reads of io_bytes, one at a time; returns IOPS and latency percentiles."""
    rng = random.Random(seed)
    slots = max(1, size_bytes // io_bytes)
    buf = bytearray(io_bytes)
    lat: list[float] = []
    with fs.open(path, "rb") as f:
        t0 = time.perf_counter()
        for _ in range(count):
            off = rng.randrange(slots) * io_bytes
            t = time.perf_counter()
            f.seek(off)
            f.readinto(buf)
            lat.append(time.perf_counter() - t)
        dt = time.perf_counter() - t0
    lat.sort()
    return {"iops": count / dt, "p50_ms": lat[len(lat) // 2] * 1e3, "p99_ms": lat[int(len(lat) * 0.99)] * 1e3}


def creates_and_stats(fs: Any, dir_path: str, count: int) -> tuple[float, float]:
    fs.makedirs(dir_path, exist_ok=True)
    t0 = time.perf_counter()
    for i in range(count):
        fs.open(f"{dir_path}/f{i:07d}", "wb").close()
    create = count / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for i in range(count):
        fs.stat(f"{dir_path}/f{i:07d}")
    stat = count / (time.perf_counter() - t0)
    return create, stat


def pipelined_stats(fs: Any, dir_path: str, count: int, inflight: int = 64) -> float:
    """Stats issued ``inflight`` at a time from one client (how a loader warms its cache)."""
    client = fs.client
    paths = [f"{dir_path}/f{i:07d}" for i in range(count)]

    async def run() -> float:
        sem = asyncio.Semaphore(inflight)

        async def one(p: str) -> None:
            async with sem:
                await client.stat(p)

        t0 = time.perf_counter()
        await asyncio.gather(*(one(p) for p in paths))
        return count / (time.perf_counter() - t0)

    return float(fs.run(run()))
