"""Workloads in N client processes at once (spawned, each with its own client), phases
aligned by a barrier; a phase's rate is all work done / (last end - first start)."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from typing import Any

from loomfs.bench.targets import Spec, open_target
from loomfs.bench.workloads import seq_read, seq_write

BARRIER_TIMEOUT_S = 300.0

Span = tuple[float, float, float]  # start, end, work units


def _bigfile_worker(spec: Spec, base: str, idx: int, size_bytes: int, barrier: Any, q: Any) -> None:
    try:
        t = open_target(spec)
        path = f"{base}/p{idx}"
        barrier.wait(BARRIER_TIMEOUT_S)
        t0 = time.monotonic()
        seq_write(t, path, size_bytes)
        w: Span = (t0, time.monotonic(), float(size_bytes))
        t.drop_cache(path)
        barrier.wait(BARRIER_TIMEOUT_S)
        t0 = time.monotonic()
        seq_read(t, path)
        r: Span = (t0, time.monotonic(), float(size_bytes))
        t.close()
        q.put((idx, {"write": w, "read": r}))
    except BaseException:
        q.put((idx, {"error": traceback.format_exc()}))
        barrier.abort()


def _mdtest_worker(spec: Spec, base: str, idx: int, files: int, shared: bool, barrier: Any, q: Any) -> None:
    try:
        t = open_target(spec)
        d = f"{base}/shared" if shared else f"{base}/p{idx}"
        t.makedirs(d)
        paths = [f"{d}/p{idx}-f{i:07d}" for i in range(files)]
        spans: dict[str, Span] = {}
        barrier.wait(BARRIER_TIMEOUT_S)
        t0 = time.monotonic()
        for p in paths:
            t.open(p, "wb").close()
        spans["create"] = (t0, time.monotonic(), float(files))
        barrier.wait(BARRIER_TIMEOUT_S)
        t0 = time.monotonic()
        for p in paths:
            t.stat(p)
        spans["stat"] = (t0, time.monotonic(), float(files))
        barrier.wait(BARRIER_TIMEOUT_S)
        t0 = time.monotonic()
        entries = len(t.listdir(d))
        spans["readdir"] = (t0, time.monotonic(), float(entries))
        barrier.wait(BARRIER_TIMEOUT_S)
        t0 = time.monotonic()
        for p in paths:
            t.unlink(p)
        spans["unlink"] = (t0, time.monotonic(), float(files))
        t.close()
        q.put((idx, spans))
    except BaseException:
        q.put((idx, {"error": traceback.format_exc()}))
        barrier.abort()


def _run(target: Any, args_of: Any, nproc: int, timeout_s: float) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(nproc)
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_of(i), barrier, q), daemon=True) for i in range(nproc)]
    for p in procs:
        p.start()
    results: list[dict[str, Any]] = []
    try:
        for _ in range(nproc):
            _, res = q.get(timeout=timeout_s)
            if "error" in res:
                raise OSError(f"bench worker failed:\n{res['error']}")
            results.append(res)
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    return aggregate(results)


def aggregate(results: list[dict[str, Span]]) -> dict[str, float]:
    """Per phase: total units / (last end - first start) over all processes."""
    out: dict[str, float] = {}
    for phase in results[0]:
        spans = [r[phase] for r in results]
        dt = max(e for _, e, _ in spans) - min(s for s, _, _ in spans)
        out[phase] = sum(u for _, _, u in spans) / dt if dt > 0 else 0.0
    return out


def parallel_bigfile(spec: Spec, base: str, nproc: int, size_bytes: int,
                     timeout_s: float = 1800.0) -> dict[str, float]:
    """``nproc`` processes each write then read their own ``size_bytes`` file: B/s totals."""
    return _run(_bigfile_worker, lambda i: (spec, base, i, size_bytes), nproc, timeout_s)


def parallel_mdtest(spec: Spec, base: str, nproc: int, files: int, *, shared: bool,
                    timeout_s: float = 1800.0) -> dict[str, float]:
    """mdtest-like create/stat/readdir/unlink of ``files`` empty files per process, in one
    shared directory or one directory per process: ops/s totals (readdir: entries/s)."""
    return _run(_mdtest_worker, lambda i: (spec, base, i, files, shared), nproc, timeout_s)


def cpu_count() -> int:
    return os.cpu_count() or 1
