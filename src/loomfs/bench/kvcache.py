"""The KV cache benchmark (issue 14 item 5): ``KVCache`` put/get throughput and per-call
latency for 16 KiB, 256 KiB and 2 MiB values in batches of 1, 16 and 256, held against raw
loopback TCP measured in the same run.

Rows ``kv_{put,get}_{size}_b{batch}`` are values/s against "raw TCP / value size" (so the
ratio is the fraction of raw TCP bandwidth moved), with ``p50_us``/``p99_us`` of one call
(a batch) in ``extra``, and rows ``..._p50``/``..._p99`` in us per call against one raw round
trip. Puts go through 3-replica chains, so their bound is raw TCP / replicas (``extra``); gets
carry min(raw TCP, disk O_DIRECT read) in ``extra`` too: each value is read once or twice, so
from the disk (the storage page cache keeps only chunks read more often: ``storage.hotchunks``).
Gets read into buffers the caller reuses (``get_many(keys, into=...)``, the zero-copy path):
``kv_get_*`` asks meta for every batch's entries (values another process put), ``kv_getw_*``
finds them in this process's index cache (``index_cache_s``), so it is chunk reads only;
16 KiB values are also measured inline in meta (``..._inline``). A local (``--compare``)
target gets no rows: the cache needs LoomFS.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from loomfs.bench.targets import BenchTarget, LoomTarget
from loomfs.bench.workloads import Result

SIZES = (16 << 10, 256 << 10, 2 << 20)
BATCHES = (1, 16, 256)
DISTINCT_VALUES = 16
SINGLE_CALLS_MAX = 1000  # batch 1: at most this many calls per case


def steps(batch_bytes_max: int) -> int:
    return len(cases(SIZES, BATCHES, batch_bytes_max))


def _pct(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def _label(size: int) -> str:
    return f"{size >> 20}m" if size >= 1 << 20 else f"{size >> 10}k"


def _case(fs: Any, prefix: str, size: int, batch: int, count: int, inline: bool) -> dict[str, Any]:
    from loomfs.kvcache import KVCache

    values = [os.urandom(size) for _ in range(DISTINCT_VALUES)]
    keys = [os.urandom(16) for _ in range(count)]
    groups = [keys[i : i + batch] for i in range(0, count, batch)]
    out: dict[str, Any] = {}
    with KVCache(fs, prefix, background_interval_s=0, inline_value_max_bytes=size if inline else 0) as kv:
        lat: list[float] = []
        t0 = time.perf_counter()
        for g, group in enumerate(groups):
            items = [(k, values[(g + j) % DISTINCT_VALUES]) for j, k in enumerate(group)]
            s = time.perf_counter()
            kv.put_many(items)
            lat.append(time.perf_counter() - s)
        out["put"] = (count / (time.perf_counter() - t0), lat)
        bufs = [bytearray(size) for _ in range(batch)]  # reused: the caller's buffers
        # cold: every get asks meta for the entries (what another process's values cost);
        # the index cache, on from here, learns them for the warm pass (chunk reads only)
        kv.aio.icache.ttl_s = 3600.0
        for op in ("get", "getw") if not inline else ("get",):
            lat = []
            t0 = time.perf_counter()
            for group in groups:
                s = time.perf_counter()
                got = kv.get_many(group, into=bufs[: len(group)])
                lat.append(time.perf_counter() - s)
                if any(g is None for g in got):
                    raise AssertionError(f"kvcache bench: a get missed ({prefix})")
            out[op] = (count / (time.perf_counter() - t0), lat)
        if bytes(bufs[0]) != values[(len(groups) - 1) % DISTINCT_VALUES]:
            raise AssertionError("kvcache bench: a get returned the wrong bytes")
    return out


def cases(sizes: Sequence[int], batches: Sequence[int], batch_bytes_max: int) -> list[tuple[int, int, bool]]:
    """(value size, batch, inline) of every case run: a batch over ``batch_bytes_max`` is left
    out (``--quick``: 256 KiB and 2 MiB values in batches of 256)."""
    return [(size, batch, inline) for size in sizes for batch in batches if batch * size <= batch_bytes_max
            for inline in ((False, True) if size <= 16 << 10 else (False,))]


def run_kvcache(t: BenchTarget, base: str, *, lim: dict[str, float], replicas: int, bytes_per_case: int,
                batch_bytes_max: int, step: Callable[[str], None], tag: str = "", sizes: Sequence[int] = SIZES,
                batches: Sequence[int] = BATCHES) -> list[Result]:
    if not isinstance(t, LoomTarget):
        return []
    tcp = lim["loopback_tcp_Bps"]
    rtt_us = 1e6 / lim["round_trips_per_s"]
    out: list[Result] = []
    for size, batch, inline in cases(sizes, batches, batch_bytes_max):
        name = f"{_label(size)}_b{batch}" + ("_inline" if inline else "")
        step(f"kvcache {name}{tag}")
        count = max(2 * batch, bytes_per_case // size)
        count = min(count, SINGLE_CALLS_MAX) if batch == 1 else -(-count // batch) * batch
        prefix = f"{base}/kv_{name}"
        r = _case(t.fs, prefix, size, batch, count, inline)
        for op in ("put", "get", "getw"):
            if op not in r:
                continue
            rate, lat = r[op]
            p50, p99 = _pct(lat, 50) * 1e6, _pct(lat, 99) * 1e6
            extra = {"size_bytes": size, "batch": batch, "values": count, "inline": inline,
                     "p50_us": p50, "p99_us": p99, "bytes_per_s": rate * size}
            if op == "put":
                extra["replicated_bound_values_per_s"] = tcp / replicas / size
            elif "disk_read_Bps" in lim:
                # a value read the first times comes from the disk (O_DIRECT), so a get of values
                # no one read lately is bound by min(raw TCP, disk read); only values read again
                # and again are served from the storage page cache (storage.hotchunks)
                bound = min(tcp, lim["disk_read_Bps"])
                extra.update(cold_read_bound_values_per_s=bound / size, ratio_to_cold_read_bound=rate * size / bound)
            out.append(Result(f"kv_{op}_{name}", rate, "values/s", f"raw TCP / {_label(size)}", tcp / size, extra))
            for q, v in (("p50", p50), ("p99", p99)):
                out.append(Result(f"kv_{op}_{name}_{q}", v, "us/op", "raw round trip (us)", rtt_us, {"batch": batch}))
        t.rmtree(prefix)
    return out
