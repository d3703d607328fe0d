"""What permission checks cost meta per operation: ``python -m loomfs.meta.perm_cost``.

Runs stat, read, put (O_TRUNC, inline) and stat_many (per file) of files at depth 4 through a ``Namespace`` over an
in-memory SQLite store, as root (no checks) and as uid 1000 (search on every directory, the
file's own bits), and prints CPU microseconds per operation (best of ``--rounds``). No sockets:
this is the meta-side CPU the checks add, the part of issue 16's per-request budget they take.
Pin it (``taskset -c 1``) on a busy machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from loomfs.common.identity import TRUSTED, Identity
from loomfs.common.routing import Routing
from loomfs.meta.caller import acting_as
from loomfs.meta.ops.batch import BatchOps
from loomfs.meta.ops.namespace import Namespace
from loomfs.meta.store.sqlite import SqliteStore
from loomfs.wire.types import ChainInfo, ChainTable, Layout, RoutingInfo


class _OneChain:
    def __init__(self) -> None:
        self.routing = Routing(RoutingInfo(version=1, chains=[ChainInfo(chain_id=1, targets=[1], table_id=1)],
                                           tables=[ChainTable(table_id=1, replicas=1, chain_ids=[1])]))

    async def get(self) -> Routing:
        return self.routing

    async def refresh(self, min_version: int = 0) -> Routing:
        return self.routing


async def measure(files: int, rounds: int) -> dict[tuple[str, str], float]:
    store = SqliteStore(":memory:")
    ns = Namespace(store, routing=_OneChain(), rng=random.Random(1),
                   default_layout=Layout(table_id=1, inline_max_bytes=65536))
    await ns.init()
    await ns.mkdir("/d1/d2/d3", parents=True, mode=0o777)
    paths = [f"/d1/d2/d3/f{i}" for i in range(files)]
    put = os.O_CREAT | os.O_WRONLY | os.O_TRUNC
    for p in paths:
        await ns.open(p, put, mode=0o666, data=b"x" * 64)
    batch = BatchOps(ns)
    ops: list[tuple[str, Callable[[str], Awaitable[Any]]]] = [
        ("stat", ns.stat), ("read", ns.read), ("put", lambda p: ns.open(p, put, data=b"y" * 64)),
    ]
    best: dict[tuple[str, str], float] = {}
    try:
        for _ in range(rounds):
            for who_name, who in (("root", TRUSTED), ("uid1000", Identity(uid=1000, gid=1000))):
                with acting_as(who):
                    for name, fn in ops:
                        t0 = time.process_time()
                        for p in paths:
                            await fn(p)
                        us = (time.process_time() - t0) / files * 1e6
                        best[(name, who_name)] = min(best.get((name, who_name), us), us)
                    t0 = time.process_time()
                    for i in range(0, files, 256):  # 256 paths per call, as the client batches
                        await batch.stat_many(paths[i : i + 256])
                    us = (time.process_time() - t0) / files * 1e6
                    best[("stat_many", who_name)] = min(best.get(("stat_many", who_name), us), us)
    finally:
        await store.close()
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    best = asyncio.run(measure(args.files, args.rounds))
    for name in ("stat", "read", "put", "stat_many"):
        r, u = best[(name, "root")], best[(name, "uid1000")]
        print(f"{name:5s} root {r:6.1f} us/op   uid 1000 {u:6.1f} us/op   checks +{u - r:.1f} us (x{u / r:.2f})")


if __name__ == "__main__":
    main()
