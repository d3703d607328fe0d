"""What a KV cache get costs, per process: ``python -m loomfs.bench.kvgetcost --dir CLUSTER``.

Puts ``--values`` values of ``--size`` bytes (one batch put lays them out back to back), reads
each three times (storage keeps a range read a third time in its page cache: the rounds measure
hot gets, served with ``sendfile``), then per round: raw loopback TCP (one stream), then batched
gets (``get_many(keys, into=...)`` with the entries in the index cache: chunk reads only; with
``--from-meta`` every batch asks meta for its entries) for ``--gib`` GiB. Prints per round and
as medians: values/s, the ratio to that round's raw TCP, and CPU-s per GiB of this client (in
all and by thread role) and of the cluster's storage and meta processes together (``/proc``),
and CPU-us per value of each. The
figures docs/datapath.md and docs/kvcache.md quote for issue 14 item 5.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from loomfs.bench import limits
from loomfs.bench.procio import Meter, storage_pids
from loomfs.bench.workloads import cpu_by_role, thread_cpu_s

WARM_PASSES = 3  # passes over the values before the rounds: the rounds measure hot gets


def meta_pids(where: str) -> list[int]:
    """Pids of the running meta services of the local cluster in directory ``where``."""
    if not os.path.isdir(where):
        return []
    from loomfs.testing.cluster import LocalCluster

    cluster = LocalCluster.from_dir(where)
    return [s.pid for s in cluster.services.values() if s.kind == "meta" and s.alive()]


def run(where: str, *, size: int, batch: int, values: int, gib: float, rounds: int,
        tcp_bytes: int, segment_chunk_bytes: int | None = None, from_meta: bool = False) -> list[dict[str, float]]:
    import loomfs
    from loomfs.kvcache import KVCache

    fs = loomfs.connect(where)
    out: list[dict[str, float]] = []
    prefix = f"/.kvgetcost-{os.getpid()}"
    try:
        opts: dict[str, Any] = {} if segment_chunk_bytes is None else {"segment_chunk_bytes": segment_chunk_bytes}
        with KVCache(fs, prefix, background_interval_s=0, index_cache_s=3600.0, **opts) as kv:
            data = [os.urandom(size) for _ in range(min(values, 16))]
            keys = [os.urandom(16) for _ in range(values)]
            for i in range(0, values, 256):
                kv.put_many([(k, data[j % len(data)]) for j, k in enumerate(keys[i : i + 256], i)])
            bufs = [bytearray(size) for _ in range(batch)]
            groups = [keys[i : i + batch] for i in range(0, values, batch)]
            calls = max(1, int(gib * (1 << 30) / (size * batch)))
            for _ in range(WARM_PASSES):  # reads 1-3 of every value: the third leaves it in the page cache
                for g in groups:
                    kv.get_many(g, into=bufs[: len(g)])
            spids = storage_pids(where)
            mpids = meta_pids(where)
            if from_meta:  # every get asks meta for its batch's entries (values another process put)
                kv.aio.icache.ttl_s = 0.0
            for _ in range(rounds):
                tcp = limits.loopback_tcp_bytes_per_s(tcp_bytes)
                meter = Meter(list(spids))
                mmeter = Meter(list(mpids))
                mmeter.start()
                t0c = thread_cpu_s()
                c0 = os.times()
                meter.start()
                t0 = time.perf_counter()
                for c in range(calls):
                    g = groups[c % len(groups)]
                    got = kv.get_many(g, into=bufs[: len(g)])
                    if any(x is None for x in got):
                        raise AssertionError("kvgetcost: a get missed")
                wall = time.perf_counter() - t0
                st = meter.stop()
                mt = mmeter.stop()
                c1, t1c = os.times(), thread_cpu_s()
                n = calls * batch
                moved_gib = n * size / (1 << 30)
                client = (c1.user - c0.user) + (c1.system - c0.system)
                row = {"values_per_s": n / wall, "ratio_tcp": n * size / wall / tcp, "tcp_GBps": tcp / 1e9,
                       "client_cpu_s_per_gib": client / moved_gib, "storage_cpu_s_per_gib": st.cpu_s / moved_gib,
                       "meta_cpu_s_per_gib": mt.cpu_s / moved_gib,
                       "client_us_per_value": client / n * 1e6, "meta_us_per_value": mt.cpu_s / n * 1e6,
                       "storage_us_per_value": st.cpu_s / n * 1e6}
                row.update({f"client_{k}": v / moved_gib for k, v in cpu_by_role(t0c, t1c).items()})
                out.append(row)
                print("  " + "  ".join(f"{k}={v:.3f}" for k, v in row.items()), flush=True)
            if bytes(bufs[0][:64]) not in {bytes(d[:64]) for d in data}:
                raise AssertionError("kvgetcost: wrong bytes")
    finally:
        try:
            fs.rmtree(prefix)
        finally:
            fs.close()
    return out


def main(argv: list[str] | None = None) -> int:
    from loomfs.cli.common import parse_size

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True, help="a local cluster directory (its storage pids are measured)")
    ap.add_argument("--size", type=parse_size, default=2 << 20)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--values", type=int, default=64, help="distinct values put (cycled by the gets)")
    ap.add_argument("--gib", type=float, default=1.0, help="GiB read per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tcp-mib", type=int, default=512, help="raw TCP measured with this much per round")
    ap.add_argument("--segment-chunk", type=parse_size, default=None,
                    help="the cache's segment_chunk_bytes (default: KVConfig's; 0: the prefix's layout)")
    ap.add_argument("--from-meta", action="store_true",
                    help="the rounds ask meta for every batch's entries (index cache off), as kv_get_* does")
    args = ap.parse_args(argv)
    rows = run(args.dir, size=args.size, batch=args.batch, values=args.values, gib=args.gib, rounds=args.rounds,
               tcp_bytes=args.tcp_mib << 20, segment_chunk_bytes=args.segment_chunk,
               from_meta=args.from_meta)
    print("median: " + "  ".join(f"{k}={statistics.median(r.get(k, 0.0) for r in rows):.3f}" for k in rows[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
