"""Online resync pages through both chunk lists (a target with more chunks than one page):
two StorageService instances over real RPC on 127.0.0.1, a tiny page size."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import pytest
from test_storage_chain import Cluster

from loomfs.common.routing import Routing
from loomfs.storage.engine.base import ChunkEngine
from loomfs.storage.engine.types import ChunkKey
from loomfs.storage.resync import Resyncer, SyncJob, sync_jobs
from loomfs.wire.mgmtd import SyncReportReq
from loomfs.wire.types import ChainInfo, NodeInfo, NodeKind, RoutingInfo, TargetInfo, TargetState

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def _put(engine: ChunkEngine, key: ChunkKey, version: int, data: bytes) -> None:
    engine.stage_write(key, version, 0, data, full_replace=True)
    await engine.commit(key, version)


def _snapshot(engine: ChunkEngine) -> dict[ChunkKey, tuple[int, int, int, bytes]]:
    out = {}
    for st in engine.list_chunks(0, limit=1 << 30):
        buf = bytearray(st.length)
        engine.read(st.key, 0, memoryview(buf))
        out[st.key] = (st.commit_ver, st.length, st.crc, bytes(buf))
    return out


@pytest.mark.parametrize("page_chunks", [1, 4, 1000])
def test_resync_merge_walks_pages(tmp_path: Path, page_chunks: int) -> None:
    rng = random.Random(page_chunks)

    async def main() -> None:
        c = Cluster(tmp_path)
        await c.start(2)
        try:
            src, dst = c.nodes
            keys = [ChunkKey(ino, idx) for ino in (3, 7, 8, 1 << 40) for idx in range(rng.randrange(3, 9))]
            for k in keys:  # the source's chunks
                await _put(src.target.engine, k, 2, os.urandom(rng.randrange(1, 9000)))
            for k in keys[::3]:  # the target: some stale copies ...
                await _put(dst.target.engine, k, 1, b"old")
            for k in keys[1::5]:  # ... some already equal ...
                st = src.target.engine.get(k)
                assert st is not None
                buf = bytearray(st.length)
                src.target.engine.read(k, 0, memoryview(buf))
                if dst.target.engine.get(k) is None:
                    await _put(dst.target.engine, k, 2, bytes(buf))
            extra = [ChunkKey(5, 0), ChunkKey(7, 100), ChunkKey(1 << 41, 2)]
            for k in extra:  # ... and chunks the chain deleted meanwhile
                await _put(dst.target.engine, k, 1, b"gone")
            c.routing.set(RoutingInfo(
                version=5,
                nodes=[NodeInfo(node_id=n.node_id, kind=NodeKind.STORAGE, host=n.address.host, port=n.address.port)
                       for n in c.nodes],
                targets=[TargetInfo(target_id=src.target.target_id, node_id=src.node_id, chain_id=1,
                                    state=TargetState.SERVING),
                         TargetInfo(target_id=dst.target.target_id, node_id=dst.node_id, chain_id=1,
                                    state=TargetState.SYNCING)],
                chains=[ChainInfo(chain_id=1, version=5, targets=[src.target.target_id, dst.target.target_id])],
            ))
            reports: list[SyncReportReq] = []

            async def report(req: SyncReportReq) -> bool:
                reports.append(req)
                return True

            routing = Routing(c.routing.routing.info)
            jobs = sync_jobs(routing, {src.target.target_id})
            assert jobs == [SyncJob(1, 5, src.target.target_id, dst.target.target_id)]
            r = Resyncer(src.service, report, page_chunks=page_chunks, report_interval_s=0.0)
            await r._sync(jobs[0], routing)
            assert _snapshot(dst.target.engine) == _snapshot(src.target.engine)
            assert r.chunks_removed == len(extra)
            assert reports[-1].done and reports[-1].chunks_left == 0
            lefts = [x.chunks_left for x in reports[:-1]]
            assert lefts == sorted(lefts, reverse=True) and lefts[0] == len(keys)
        finally:
            await c.stop()

    asyncio.run(main())
