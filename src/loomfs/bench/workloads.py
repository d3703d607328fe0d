"""Benchmark workloads, through the public client API or any ``BenchTarget``.

Each function does one workload in this process and returns rates; ``bench.parallel`` runs
them in several processes at once.
"""

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


DURABLE_REPLICAS = 2  # issue 15 item 21: durable (fsync) 2-replica writes, vs a goal-2 MooseFS


def durable_dir(t: Any, path: str, replicas: int = DURABLE_REPLICAS) -> int:
    """Make ``path`` a directory whose new files are written durably: on a LoomFS target its
    layout gets the ``durable`` flag (every replica fsyncs a write before the ack) and a chain
    table with ``replicas`` replicas where the cluster has one (else its default table). Returns
    the replicas its files get; 0 for a ``--compare`` directory, whose writes the bench fsyncs
    before close anyway."""
    t.makedirs(path)
    fs = getattr(t, "fs", None)
    if t.spec[0] != "loomfs" or fs is None:
        return 0
    tables = fs.client.routing.current.tables
    if any(tb.replicas == replicas and not tb.ec for tb in tables.values()):  # an EC group's is none
        lay = fs.set_layout(path, replicas=replicas, table_id=0, durable=True)
    else:
        lay = fs.set_layout(path, durable=True)
    if lay is None or not lay.durable:
        raise OSError(f"could not make {path} durable: layout {lay!r}")
    if lay.replicas:
        return int(lay.replicas)
    return int(fs.client.routing.current.table(lay.table_id).replicas)


THREAD_ROLES = (("loomfs-io", "loop"), ("loomfs-recv", "recv"), ("MainThread", "main"))


def thread_cpu_s() -> dict[int, tuple[str, float]]:
    """CPU seconds so far of each thread of this process (Linux ``/proc``; {} elsewhere), by
    native id, with its role: ``loop`` (the client's event loop), ``recv`` (receive threads,
    ``net.bulkrecv``), ``main`` or ``other``."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # the thread ended meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()
        name = names.get(int(tid), "")
        role = next((r for prefix, r in THREAD_ROLES if name.startswith(prefix)), "other")
        out[int(tid)] = (role, (int(fields[11]) + int(fields[12])) / tick)
    return out


def cpu_by_role(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds each role spent between two ``thread_cpu_s`` snapshots."""
    out: dict[str, float] = {}
    for tid, (role, cpu_s) in after.items():
        out[role] = out.get(role, 0.0) + cpu_s - before.get(tid, (role, 0.0))[1]
    return out


def seq_read_cpu(fs: Any, path: str, block_bytes: int = 16 << 20) -> tuple[float, dict[str, float]]:
    """``seq_read`` and what it cost this process: CPU-s per GiB in all (``total``, getrusage)
    and by thread role (``loop``, ``recv``, ``main``, ``other``)."""
    import resource

    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), thread_cpu_s()
    start = time.perf_counter()
    bps = seq_read(fs, path, block_bytes)
    gib = bps * (time.perf_counter() - start) / (1 << 30)
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), thread_cpu_s()
    total = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    per = {role: cpu_s / gib for role, cpu_s in cpu_by_role(t0, t1).items()} if gib else {}
    return bps, {"total": total / gib if gib else 0.0, **per}


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def cdf_points(sorted_values: list[float], points: int = 100) -> list[float]:
    """``points`` evenly spaced quantiles of a sorted sample (for latency CDF plots)."""
    if not sorted_values:
        return []
    n = len(sorted_values)
    return [sorted_values[min(n - 1, int(i * n / points))] for i in range(points)] + [sorted_values[-1]]


def random_reads(fs: Any, path: str, size_bytes: int, io_bytes: int, count: int, seed: int = 7) -> dict[str, Any]:
    """Random aligned reads of io_bytes, one at a time; returns IOPS, latency percentiles (ms)
    and a CDF sample (``cdf_ms``)."""
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
    return {"iops": count / dt, "bytes_per_s": count * io_bytes / dt,
            "p50_ms": percentile(lat, 0.5) * 1e3, "p95_ms": percentile(lat, 0.95) * 1e3,
            "p99_ms": percentile(lat, 0.99) * 1e3, "cdf_ms": [x * 1e3 for x in cdf_points(lat)]}


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


def small_files(t: Any, dir_path: str, count: int, size_bytes: int, seed: int = 3) -> dict[str, float]:
    """``count`` files of ``size_bytes``: create (write whole), stat, read back; files/s each."""
    t.makedirs(dir_path)
    data = memoryview(os.urandom(size_bytes))
    paths = [f"{dir_path}/s{i:07d}" for i in range(count)]
    t0 = time.perf_counter()
    for p in paths:
        t.write_file(p, data)
    create = count / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for p in paths:
        t.stat(p)
    stat = count / (time.perf_counter() - t0)
    order = paths[:]
    random.Random(seed).shuffle(order)
    t0 = time.perf_counter()
    got = 0
    for p in order:
        got += len(t.read_file(p))
    read = count / (time.perf_counter() - t0)
    if got != count * size_bytes:
        raise OSError(f"small-file read back {got} bytes, wrote {count * size_bytes}")
    return {"create": create, "stat": stat, "read": read}


LIST_ENTRIES = 20_000


def lookup_scaling(t: Any, dir_path: str, sizes: list[int], samples: int, seed: int = 5,
                   tick: Any = None) -> list[dict[str, float]]:
    """Grow one directory through ``sizes`` entries; at each size time the creates that grew
    it, ``samples`` stats of random existing names and one miss each, and a streamed listing
    of its first entries (up to ``LIST_ENTRIES``). Returns [{entries, stat_us, miss_us,
    create_per_s, list_per_s}]: the huge-directory curve (flat is the goal)."""
    rng = random.Random(seed)
    t.makedirs(dir_path)
    have = 0
    out: list[dict[str, float]] = []
    for n in sizes:
        t0 = time.perf_counter()
        t.create_many(f"{dir_path}/e{i:08d}" for i in range(have, n))
        create_per_s = (n - have) / max(1e-9, time.perf_counter() - t0)
        have = n
        t0 = time.perf_counter()
        listed = t.list_first(dir_path, LIST_ENTRIES)
        list_per_s = listed / max(1e-9, time.perf_counter() - t0)
        names = [f"{dir_path}/e{rng.randrange(n):08d}" for _ in range(samples)]
        t0 = time.perf_counter()
        for p in names:
            t.stat(p)
        hit_us = (time.perf_counter() - t0) / samples * 1e6
        misses = max(1, samples // 4)
        t0 = time.perf_counter()
        for i in range(misses):
            try:
                t.stat(f"{dir_path}/missing{i}")
            except FileNotFoundError:
                pass
        miss_us = (time.perf_counter() - t0) / misses * 1e6
        out.append({"entries": float(n), "stat_us": hit_us, "miss_us": miss_us, "create_per_s": create_per_s,
                    "list_per_s": list_per_s})
        if tick is not None:
            tick()
    return out
