"""CPU and wall time per file of the batch calls, per process: ``python -m loomfs.bench.batchcost``.

What ``opcost`` does for single operations, for ``read_many`` and ``stat_many`` (a fresh
client each round, batches of ``--batch`` paths in a seeded random order, as the bench's
``sf_read_many``/``sf_stat_many`` rows; ``--passes`` times over the same client) and for creates from ``--threads`` threads (``pipe`` of
``--size`` bytes): wall microseconds per file, the client's CPU microseconds per file (all its
threads) and meta's (``/proc/PID/schedstat``), meta's context switches per file. Rounds
alternate the phases; medians are printed.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from loomfs.bench.opcost import cluster_for, measure

PHASES = ("read_many", "stat_many", "create")


def one_round(where: str, meta_pid: int, files: int, size_bytes: int, batch: int, threads: int,
              rnd: int, passes: int = 1) -> dict[str, dict[str, float]]:
    import loomfs

    data = os.urandom(size_bytes)
    base = f"/batchcost/r{rnd}"
    paths = [f"{base}/d{i % 10}/f{i:06d}" for i in range(files)]
    order = paths[:]
    random.Random(rnd).shuffle(order)
    batches = [order[i : i + batch] for i in range(0, files, batch)]
    out: dict[str, dict[str, float]] = {}
    with loomfs.connect(where) as fs:
        for d in range(10):
            fs.makedirs(f"{base}/d{d}", exist_ok=True)
        fs.stat(base)
        parts = [paths[k::threads] for k in range(threads)]

        def create() -> None:
            if threads == 1:
                for p in paths:
                    fs.pipe(p, data)
                return
            def put_all(part: list[str]) -> None:
                for p in part:
                    fs.pipe(p, data)

            with ThreadPoolExecutor(threads) as ex:
                list(ex.map(put_all, parts))

        out["create"] = measure(files, create, meta_pid)
    for kind in ("read_many", "stat_many"):
        with loomfs.connect(where) as cold:
            cold.stat("/")

            def loop(c: Any = cold, k: str = kind) -> None:
                for b in batches * passes:
                    got = c.read_many(b) if k == "read_many" else c.stat_many(b)
                    bad = [r for r in got if isinstance(r, OSError)]
                    if bad:
                        raise bad[0]

            out[kind] = measure(files * passes, loop, meta_pid)
    with loomfs.connect(where) as fs:
        fs.rmtree(base)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m loomfs.bench.batchcost", description=__doc__.split("\n")[0])
    ap.add_argument("--dir", help="a running local cluster's directory (default: start a throwaway one)")
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--size", type=int, default=4096, help="bytes per file")
    ap.add_argument("--batch", type=int, default=100, help="paths per read_many/stat_many call")
    ap.add_argument("--threads", type=int, default=1, help="threads creating")
    ap.add_argument("--passes", type=int, default=3, help="times each batch is read/statted per round (one client)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--label", default="", help="printed in front of each line")
    args = ap.parse_args(argv)
    with cluster_for(args.dir, "loomfs-batchcost-") as cluster:
        meta_pid = cluster.services["meta1"].pid
        where = str(cluster.root)
        rounds = [one_round(where, meta_pid, args.files, args.size, args.batch, args.threads, r, args.passes)
                  for r in range(args.rounds)]
        for ph in PHASES:
            walls = ", ".join(f"{r[ph]['wall_us']:.0f}" for r in rounds)
            med = {k: statistics.median(r[ph][k] for r in rounds) for k in rounds[0][ph]}
            print(f"{args.label}{ph:9s} wall {med['wall_us']:7.1f} us/file  client cpu {med['client_cpu_us']:6.1f}"
                  f"  meta cpu {med['meta_cpu_us']:6.1f}  meta switches {med['meta_switches']:.2f}/file"
                  f"   (rounds wall: {walls})")


if __name__ == "__main__":
    main()
