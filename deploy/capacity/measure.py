"""The measurements behind docs/capacity-plan.md, with the real code (no cluster needed).

    python deploy/capacity/measure.py routing --nodes 1000 --targets 16
        RoutingInfo bytes (wire codec), per part, encode/decode time, chain-table build time
    python deploy/capacity/measure.py placement --nodes 1000 --targets 15 --racks 25
        plan_chains' spread: chains inside one rack (ids in rack order / round-robin), peers per
        node, heads per node, distinct node triples
    python deploy/capacity/measure.py pg-bytes --url postgresql://... --files 500000
        bytes per file of the real metastore schema on a PostgreSQL (a scratch database: it
        creates the schema "capacity_probe" and drops it)

The chain-table build is the real ``ClusterState.create_chain_table``/``plan_chains``: at
1,000 nodes it takes minutes until ``max(left)`` is hoisted out of its sort key.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import time

import msgpack

from loomfs.mgmtd.state import ClusterState, plan_chains
from loomfs.wire.types import Layout, NodeKind, RoutingInfo, ScrubStats, TargetInfo


def routing(nodes: int, targets: int, replicas: int, metas: int) -> None:
    s = ClusterState(lease_s=5.0, replace_after_s=600.0)
    for n in range(1, nodes + 1):
        ts = [TargetInfo(target_id=n * 1000 + i + 1, node_id=n, path=f"/data/target{i}",
                         used_bytes=12_345_678_901_234, capacity_bytes=15_360_000_000_000,
                         chunk_count=3_000_000, disk_id=str(2049 + i),
                         scrub=ScrubStats(interval_s=86400.0, passes=3)) for i in range(targets)]
        s.register(node_id=n, kind=NodeKind.STORAGE, host=f"10.{n // 250}.{n % 250}.1", port=8200,
                   targets=ts, now_s=0.0, metrics_port=8201)
    for m in range(metas):
        s.register(node_id=0, kind=NodeKind.META, host=f"10.9.{m}.1", port=8100, targets=[], now_s=0.0,
                   metrics_port=8101)
    t0 = time.perf_counter()
    s.create_chain_table(replicas=replicas)
    t1 = time.perf_counter()
    r = s.routing()
    wire = r.to_wire()
    data = msgpack.packb(wire)
    t3 = time.perf_counter()
    RoutingInfo.from_wire(msgpack.unpackb(data))
    t4 = time.perf_counter()
    print(f"{nodes} nodes x {targets} targets, {metas} meta: {len(r.chains)} chains; "
          f"chain table built in {t1 - t0:.2f} s")
    print(f"routing {len(data):,} bytes (encode {t3 - t1:.3f} s incl. view, decode {t4 - t3:.3f} s)")
    for part in ("nodes", "targets", "chains", "tables"):
        size = len(msgpack.packb(wire[part]))
        count = max(1, len(wire[part]))
        print(f"  {part}: {size:,} bytes ({size / count:.0f} per entry, {size / len(data):.0%})")


def placement(nodes: int, targets: int, replicas: int, racks: int) -> None:
    free = {n: [n * 1000 + i + 1 for i in range(targets)] for n in range(1, nodes + 1)}
    t0 = time.perf_counter()
    chains = plan_chains(free, replicas)
    print(f"{len(chains)} chains in {time.perf_counter() - t0:.2f} s")
    per_rack = nodes // racks
    schemes = {"ids in rack order": lambda node: (node - 1) // per_rack,
               "ids round-robin over racks": lambda node: (node - 1) % racks}
    for name, rack in schemes.items():
        spans = collections.Counter(len({rack(t // 1000) for t in c}) for c in chains)
        print(f"  {name}: chains by number of racks they span {dict(sorted(spans.items()))}")
    peers: dict[int, set[int]] = collections.defaultdict(set)
    for c in chains:
        members = {t // 1000 for t in c}
        for node in members:
            peers[node] |= members - {node}
    counts = [len(v) for v in peers.values()]
    heads = collections.Counter(c[0] // 1000 for c in chains)
    triples = {tuple(sorted(t // 1000 for t in c)) for c in chains}
    print(f"  peers per node min/avg/max {min(counts)}/{sum(counts) / len(counts):.1f}/{max(counts)}; "
          f"heads per node {min(heads.values())}-{max(heads.values())}; distinct node triples {len(triples)}")


async def pg_bytes(url: str, files: int) -> None:
    import asyncpg

    from loomfs.meta.store.base import MetaStore, encode_layout

    schema = "capacity_probe"
    sep = "&" if "?" in url else "?"
    store = MetaStore.open(f"{url}{sep}schema={schema}")
    async with store.write():  # the real engine creates and migrates its schema
        pass
    await store.close()
    conn = await asyncpg.connect(url)
    try:
        layout = encode_layout(Layout(chunk_size=4 << 20, stripe=16, table_id=1,
                                      chains=[random.randrange(1, 5334) for _ in range(16)]))
        assert layout is not None
        ns = 1_764_700_000_000_000_000
        await conn.execute(f"INSERT INTO {schema}.inodes SELECT 1000000 + i, 1, 33188, 1, 1000, 1000, "
                           f"1048576 + i, {ns} + i, {ns} + i, {ns} + i, $1, '', false "
                           "FROM generate_series(1, $2) i", layout, files)
        await conn.execute(f"INSERT INTO {schema}.dentries SELECT 10 + i / 1000, "
                           "'img_' || lpad(i::text, 9, '0') || '.jpg', 1000000 + i, 1 "
                           "FROM generate_series(1, $1) i", files)
        total = 0.0
        print(f"layout {len(layout)} bytes; {files:,} files")
        for table in ("inodes", "dentries"):
            await conn.execute(f"VACUUM ANALYZE {schema}.{table}")
            heap = await conn.fetchval(f"SELECT pg_relation_size('{schema}.{table}')")
            index = await conn.fetchval(f"SELECT pg_indexes_size('{schema}.{table}')")
            total += (heap + index) / files
            print(f"  {table}: heap {heap / files:.1f} B/row, indexes {index / files:.1f} B/row")
        print(f"  per file {total:.1f} B -> 10^9 files {total * 1e9 / 1e9:.0f} GB")
    finally:
        await conn.execute(f"DROP SCHEMA {schema} CASCADE")
        await conn.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("routing")
    r.add_argument("--nodes", type=int, default=200)
    r.add_argument("--targets", type=int, default=16)
    r.add_argument("--replicas", type=int, default=3)
    r.add_argument("--metas", type=int, default=64)
    pl = sub.add_parser("placement")
    pl.add_argument("--nodes", type=int, default=200)
    pl.add_argument("--targets", type=int, default=15)
    pl.add_argument("--replicas", type=int, default=3)
    pl.add_argument("--racks", type=int, default=5)
    pg = sub.add_parser("pg-bytes")
    pg.add_argument("--url", required=True)
    pg.add_argument("--files", type=int, default=500_000)
    a = p.parse_args()
    if a.what == "routing":
        routing(a.nodes, a.targets, a.replicas, a.metas)
    elif a.what == "placement":
        placement(a.nodes, a.targets, a.replicas, a.racks)
    else:
        asyncio.run(pg_bytes(a.url, a.files))


if __name__ == "__main__":
    main()
