"""Server-side cost of meta operations (ops layer + SQLite, no RPC).

    .venv/bin/python benchmarks/meta_ops.py [--n 5000] [--synchronous NORMAL] [--depth 3]

Prints microseconds per operation for stat, create (open O_CREAT|O_WRONLY + close with a
length), readdir pages, rename and unlink, on a WAL SQLite file in a temp directory.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time

from loomfs.common.routing import Routing
from loomfs.meta.ops.namespace import Namespace
from loomfs.meta.store.base import MetaStore
from loomfs.wire.types import ChainInfo, ChainTable, RoutingInfo


class _Routing:
    def __init__(self) -> None:
        ids = list(range(1, 17))
        self.r = Routing(RoutingInfo(
            version=1, chains=[ChainInfo(chain_id=c, targets=[c], table_id=1) for c in ids],
            tables=[ChainTable(table_id=1, replicas=1, chain_ids=ids)],
        ))

    async def get(self) -> Routing:
        return self.r

    async def refresh(self, min_version: int = 0) -> Routing:
        return self.r


async def bench(n: int, synchronous: str, depth: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = MetaStore.open(f"sqlite:///{tmp}/meta.db", synchronous=synchronous)
        ns = Namespace(store, routing=_Routing(), rng=random.Random(1))
        await ns.init()
        d = "/" + "/".join(f"d{i}" for i in range(depth))
        await ns.mkdir(d, parents=True)
        flags = os.O_WRONLY | os.O_CREAT

        async def timed(label: str, count: int, fn) -> None:  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            for i in range(count):
                await fn(i)
            dt = time.perf_counter() - t0
            print(f"{label:<28} {dt / count * 1e6:8.1f} us/op  {count / dt:10.0f} op/s")

        async def create(i: int) -> None:
            o = await ns.open(f"{d}/f{i}", flags)
            await ns.close(o.attr.inode, o.session_id, 4096)

        async def stat(i: int) -> None:
            await ns.stat(f"{d}/f{i % n}")

        async def open_create_only(i: int) -> None:
            await ns.open(f"{d}/g{i}", os.O_RDONLY | os.O_CREAT)

        async def readdir(i: int) -> None:
            await ns.readdir(d, limit=100, with_attrs=True)

        async def rename(i: int) -> None:
            await ns.rename(f"{d}/f{i}", f"{d}/r{i}")

        async def unlink(i: int) -> None:
            await ns.unlink(f"{d}/r{i}")

        print(f"n={n} depth={depth} synchronous={synchronous}")
        await timed("create (open+close)", n, create)
        await timed("create (open O_CREAT ro)", n, open_create_only)
        await timed(f"stat (depth {depth + 1})", n * 2, stat)
        await timed("stat /", n, lambda i: ns.stat("/"))
        await timed("readdir 100 + attrs", max(1, n // 20), readdir)
        await timed("rename", n, rename)
        await timed("unlink", n, unlink)
        await store.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=5000)
    p.add_argument("--synchronous", default="NORMAL")
    p.add_argument("--depth", type=int, default=3)
    a = p.parse_args()
    asyncio.run(bench(a.n, a.synchronous, a.depth))


if __name__ == "__main__":
    main()
