"""The small-file benchmark (issue 16 item 7), through any ``BenchTarget``.

``files`` files of ``size_bytes`` spread over ``dirs`` directories, for each thread count:
create (whole-file writes), stat, cold read, unlink; then, once, batch read and batch stat of
the same files (``read_many``/``stat_many`` in batches of ``batch_files``). Threads split the
file list into contiguous slices; create and unlink go in directory order (each thread mostly
in its own directories), stat and reads in a seeded random order (as a data loader reads).
Stat, cold reads and the batch calls go through ``target.cold(paths)``: a fresh LoomFS client
(caches empty) or, for a local directory, the files dropped from the page cache.

Each timed phase first makes one call that touches none of its files (a stat of, or a batch
call on, the directory above them: EISDIR for the reads), from every thread, before the common
start: that sets up the connections and per-thread sockets (TCP, the auth handshake) and
everything a process does on its first call of a kind (imports, generated message codecs),
which cost 10-75 ms here, as much as the whole 400-file quick batch phase. No file's
attributes or bytes are cached by it.

Every figure is files/s held against one limit: 64-byte round trips between two processes
pinned to one CPU (``limits.loopback_round_trips_pinned_per_s``), measured in the same run.
"""

from __future__ import annotations

import functools
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from loomfs.bench.targets import BenchTarget
from loomfs.bench.workloads import Result

PHASES = ("create", "stat", "read_cold", "unlink")
BATCHES = ("read_many", "stat_many")
BARRIER_TIMEOUT_S = 120.0

# Issue 16's targets, as fractions of the pinned round-trip limit (information, not asserts).
TARGET_RATIOS: dict[str, float] = {
    "sf_create_1t": 0.08, "sf_read_cold_1t": 0.1, "sf_stat_1t": 0.2, "sf_read_many": 0.5,
}
SCALING_TARGET = 2.0  # N threads at least this many times one thread


def row_names(threads: tuple[int, ...]) -> list[str]:
    """The rows ``run_smallfiles`` returns, in order."""
    names = []
    for k in threads:
        names += [f"sf_{ph}_{k}t" for ph in PHASES]
        if k == threads[0]:
            names += [f"sf_{b}" for b in BATCHES]
    return names


def steps(threads: tuple[int, ...]) -> int:
    return len(row_names(threads))


def file_paths(base: str, files: int, dirs: int) -> list[str]:
    """``files`` paths in directory order: file i lives in directory i * dirs // files."""
    return [f"{base}/d{i * dirs // files:03d}/f{i:07d}" for i in range(files)]


def split(items: list[str], parts: int) -> list[list[str]]:
    n = len(items)
    return [items[k * n // parts:(k + 1) * n // parts] for k in range(parts)]


def timed_threads(parts: list[list[str]], each: Callable[[str], object],
                  warm: Callable[[], object] | None = None) -> float:
    """Seconds from a common start until every thread has run ``each`` over its part;
    ``warm`` runs once in every thread before the start (untimed)."""
    if len(parts) == 1:
        if warm is not None:
            warm()
        t0 = time.perf_counter()
        for p in parts[0]:
            each(p)
        return time.perf_counter() - t0
    barrier = threading.Barrier(len(parts) + 1)

    def work(part: list[str]) -> None:
        if warm is not None:
            warm()
        barrier.wait(BARRIER_TIMEOUT_S)
        for p in part:
            each(p)

    with ThreadPoolExecutor(len(parts), thread_name_prefix="bench-sf") as ex:
        futures = [ex.submit(work, part) for part in parts]
        barrier.wait(BARRIER_TIMEOUT_S)
        t0 = time.perf_counter()
        for f in futures:
            f.result()
        return time.perf_counter() - t0


def _quietly(fn: Callable[[], object]) -> Callable[[], None]:
    """``fn`` for a warm-up call whose answer may be an error (EISDIR: a directory read)."""
    def run() -> None:
        try:
            fn()
        except OSError:
            pass
    return run


def _check_read(data: bytes | OSError, path: str, size_bytes: int) -> None:
    if isinstance(data, OSError):
        raise data
    if len(data) != size_bytes:
        raise OSError(f"small-file read of {path}: {len(data)} bytes, wrote {size_bytes}")


def _check_stat(st: os.stat_result | OSError, path: str, size_bytes: int) -> None:
    if isinstance(st, OSError):
        raise st
    if st.st_size != size_bytes:
        raise OSError(f"small-file stat of {path}: size {st.st_size}, wrote {size_bytes}")


def _cold_phase(t: BenchTarget, paths: list[str], parts: list[list[str]], kind: str,
                size_bytes: int, where: str) -> float:
    """Seconds to stat or read every file of ``parts`` through ``t.cold(paths)``; each thread
    first stats (or reads: EISDIR) ``where``, the directory above them, untimed."""
    c = t.cold(paths)
    try:
        if kind == "stat":
            return timed_threads(parts, lambda p: _check_stat(c.stat(p), p, size_bytes),
                                 _quietly(lambda: c.stat(where)))
        return timed_threads(parts, lambda p: _check_read(c.read_file(p), p, size_bytes),
                             _quietly(lambda: c.read_file(where)))
    finally:
        c.close()


def run_smallfiles(t: BenchTarget, base: str, *, files: int, dirs: int, size_bytes: int,
                   threads: tuple[int, ...], batch_files: int, limit: tuple[str, float],
                   step: Callable[[str], None], tag: str = "", seed: int = 11) -> list[Result]:
    """All small-file rows (``row_names(threads)``) for one target; leaves ``base`` removed."""
    lim_name, lim_value = limit
    dirs = max(1, min(dirs, files))
    data = memoryview(os.urandom(size_bytes))
    out: list[Result] = []
    shape = {"files": files, "dirs": dirs, "size_bytes": size_bytes}
    t.rmtree(base)

    def row(name: str, seconds: float, extra: dict[str, object]) -> None:
        out.append(Result(name, files / seconds, "files/s", lim_name, lim_value, {**shape, **extra}))

    for k in threads:
        where = f"{base}/t{k}"
        paths = file_paths(where, files, dirs)
        shuffled = paths[:]
        random.Random(seed + k).shuffle(shuffled)
        for d in sorted({p.rsplit("/", 1)[0] for p in paths}):
            t.makedirs(d)

        step(f"small files: create {files} x {size_bytes >> 10} KiB, {k} thread(s){tag}")
        row(f"sf_create_{k}t", timed_threads(split(paths, k), lambda p: t.write_file(p, data),
                                             _quietly(functools.partial(t.stat, where))), {"threads": k})

        step(f"small files: stat, {k} thread(s), cold{tag}")
        row(f"sf_stat_{k}t", _cold_phase(t, paths, split(shuffled, k), "stat", size_bytes, where), {"threads": k})
        step(f"small files: cold read, {k} thread(s){tag}")
        row(f"sf_read_cold_{k}t", _cold_phase(t, paths, split(shuffled, k), "read", size_bytes, where),
            {"threads": k})

        if k == threads[0]:
            batches = [shuffled[i:i + batch_files] for i in range(0, files, batch_files)]
            for kind in BATCHES:
                step(f"small files: {kind}, batches of {batch_files}{tag}")
                c = t.cold(paths)
                try:
                    try:  # untimed: connections up, first-call costs paid (EISDIR for read_many)
                        c.read_many([where]) if kind == "read_many" else c.stat_many([where])
                    except OSError:
                        pass
                    t0 = time.perf_counter()
                    for b in batches:
                        if kind == "read_many":
                            for p, got in zip(b, c.read_many(b), strict=True):
                                _check_read(got, p, size_bytes)
                        else:
                            for p, st in zip(b, c.stat_many(b), strict=True):
                                _check_stat(st, p, size_bytes)
                    row(f"sf_{kind}", time.perf_counter() - t0,
                        {"batch_files": batch_files, "batches": len(batches), "fresh_client": True,
                         "warm_up": "one call on the directory before the clock"})
                finally:
                    c.close()

        step(f"small files: unlink, {k} thread(s){tag}")
        row(f"sf_unlink_{k}t", timed_threads(split(paths, k), t.unlink, _quietly(functools.partial(t.stat, where))),
            {"threads": k})
        t.rmtree(where)
    t.rmtree(base)
    return out


def target_check(name: str, rows: Mapping[str, Mapping[str, Any]]) -> tuple[str, bool] | None:
    """Issue 16's target for row ``name`` as (text, met), or None where it sets none.
    ``rows``: one target's result rows as in the bench JSON (name -> {value, ratio, ...})."""
    if name in TARGET_RATIOS:
        want = TARGET_RATIOS[name]
        ratio = rows[name].get("ratio")
        return (f">= {want:g} of limit", ratio is not None and ratio >= want)
    if name.startswith("sf_") and name.endswith("t") and not name.endswith("_1t"):
        one = rows.get(name.rsplit("_", 1)[0] + "_1t")
        if one is None or not one["value"]:
            return None
        x = rows[name]["value"] / one["value"]
        return (f">= {SCALING_TARGET:g}x 1t (now {x:.2f}x)", x >= SCALING_TARGET)
    return None
