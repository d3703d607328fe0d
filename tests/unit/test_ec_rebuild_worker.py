"""meta's EC rebuild worker (``loomfs.meta.ec_rebuild``) on a real SQLite metastore: noticing a
new target in routing, which files it scrubs, resuming after a kill, retries, claims.

The scrub of one file is the worker's seam here (the real one, ``scrub_file`` over storage,
runs in tests/integration/test_ec_cluster.py::test_rebuild_onto_a_spare)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest

from loomfs.client.ec_rebuild import ScrubReport
from loomfs.common.clock import ManualClock
from loomfs.common.routing import Routing, RoutingClient
from loomfs.meta.ec_rebuild import (
    KEY_PREFIX,
    RebuildCollector,
    RebuildWorker,
    Record,
    progress_rows,
)
from loomfs.meta.store.base import MetaStore
from loomfs.wire.types import Attr, ChainInfo, ChainTable, FileType, Layout, RoutingInfo, TargetInfo

T = TypeVar("T")
EC_CHAINS = [11, 12, 13, 14, 15, 16]


class FixedRouting:
    """What the worker reads of a RoutingClient: the current snapshot."""

    has_routing = True

    def __init__(self) -> None:
        self.targets = {c: 100 + c for c in EC_CHAINS}
        self.versions = dict.fromkeys(EC_CHAINS, 1)
        self.current = self._build()

    def swap(self, chain: int, target: int) -> None:
        self.targets[chain] = target
        self.versions[chain] += 1
        self.current = self._build()

    def _build(self) -> Routing:
        chains = [ChainInfo(chain_id=c, version=self.versions[c], targets=[t], table_id=2)
                  for c, t in self.targets.items()]
        chains.append(ChainInfo(chain_id=1, version=1, targets=[1, 2, 3], table_id=1))
        targets = [TargetInfo(target_id=t, node_id=t, chain_id=c) for c, t in self.targets.items()]
        targets += [TargetInfo(target_id=t, node_id=t, chain_id=1) for t in (1, 2, 3)]
        return Routing(RoutingInfo(version=sum(self.versions.values()), targets=targets, chains=chains, tables=[
            ChainTable(table_id=1, replicas=3, chain_ids=[1]), ChainTable(table_id=2, replicas=1, chain_ids=EC_CHAINS, ec=True)]))


def _ec(inode: int, size: int, chains: list[int]) -> Attr:
    lay = Layout(chunk_size=1 << 20, stripe=len(chains), table_id=2, replicas=1, chains=chains, ec_k=4, ec_m=2)
    return Attr(inode=inode, type=FileType.FILE, mode=0o644, nlink=1, size=size, layout=lay)


class Scrubs:
    """Records the files scrubbed; ``fail`` makes a file's chain 13 stay unhealthy,
    ``kill_at`` raises CancelledError (the meta process killed mid-file)."""

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.fail: set[int] = set()
        self.kill_at: int | None = None

    async def __call__(self, a: Attr) -> ScrubReport:
        self.seen.append(a.inode)
        if a.inode == self.kill_at:
            raise asyncio.CancelledError
        rep = ScrubReport(f"inode {a.inode}", stripes=1)
        if a.inode in self.fail:
            rep.unreachable_fragments = 1
            rep.unhealthy_chains.add(13)
        return rep


@pytest.fixture
def store(tmp_path: Path) -> MetaStore:
    return MetaStore.open(f"sqlite:///{tmp_path / 'meta.db'}")


def run(store: MetaStore, body: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        try:
            return await body()
        finally:
            await store.close()

    return asyncio.run(main())


def _worker(store: MetaStore, routing: FixedRouting, scrubs: Scrubs, **kw: Any) -> RebuildWorker:
    kw.setdefault("bytes_per_s", 0.0)
    return RebuildWorker(store, None, cast(RoutingClient, routing), scrub=scrubs, page_inodes=2, **kw)


async def _fill(store: MetaStore) -> None:
    async with store.write() as t:
        for a in (_ec(2, 100, EC_CHAINS), _ec(3, 5000, EC_CHAINS[::-1]), _ec(5, 7, [11, 12, 14, 15, 16, 17]),
                  _ec(8, 1 << 20, EC_CHAINS), _ec(9, 0, EC_CHAINS)):
            await t.put_inode(a)
        await t.put_inode(Attr(inode=4, type=FileType.FILE, size=9, layout=Layout(chains=[13, 1])))  # replicated
        await t.put_inode(Attr(inode=6, type=FileType.DIRECTORY, layout=Layout(table_id=2, chains=[13])))


def test_new_target_rebuilds_the_files_on_that_chain(store: MetaStore) -> None:
    routing, scrubs = FixedRouting(), Scrubs()

    async def go() -> None:
        await _fill(store)
        w = _worker(store, routing, scrubs)
        assert await w.run_once() == 0 and scrubs.seen == []  # first sight: the baseline, nothing to do
        async with store.read() as t:
            assert len(await t.state_list(KEY_PREFIX)) == len(EC_CHAINS)
        assert await w.run_once() == 0 and progress_rows(w.records.values()) == []
        routing.swap(13, 777)
        assert await w.run_once() == 1
        assert scrubs.seen == [2, 3, 8, 9]  # the EC files with a fragment on chain 13, in inode order
        rec = w.records[13]
        assert rec.job is None and rec.complete_target == 777
        assert rec.last["files"] == 4 and rec.last["bytes"] == 100 + 5000 + (1 << 20)
        (row,) = progress_rows(w.records.values())
        assert row["phase"] == "done" and row["target"] == 777 and row["files_left"] == 0
        names = {m.name: m for m in RebuildCollector(w).collect()}
        assert names["loomfs_ec_rebuild_files_done"].samples[0].value == 4
        assert names["loomfs_ec_rebuilds_done"].samples[0].value == 1
        assert await w.run_once() == 0 and len(scrubs.seen) == 4  # nothing new

    run(store, go)


def test_a_killed_worker_resumes_and_redoes_only_the_file_in_progress(store: MetaStore) -> None:
    routing, scrubs = FixedRouting(), Scrubs()

    async def go() -> None:
        await _fill(store)
        await _worker(store, routing, scrubs).run_once()
        routing.swap(13, 777)
        scrubs.kill_at = 8
        first = _worker(store, routing, scrubs, save_every_s=0.0)
        with pytest.raises(asyncio.CancelledError):
            await first.run_once()
        assert scrubs.seen == [2, 3, 8]
        async with store.read() as t:
            blob = await t.state_get(f"{KEY_PREFIX}13")
        assert blob is not None
        saved = Record.unpack(blob)
        assert saved.job is not None and saved.job.phase == "repair" and saved.job.cursor == 6  # inode 8 not done
        assert (saved.job.files_done, saved.job.files_total) == (2, 4)
        scrubs.kill_at = None
        # the killed process's claim: another worker waits for it to run out
        clock = ManualClock(wall_ns=saved.claim_until_ns - 10**9)
        second = _worker(store, routing, scrubs, clock=clock)
        assert await second.run_once() == 0 and scrubs.seen == [2, 3, 8]
        clock.advance(2.0)
        assert await second.run_once() == 1
        assert scrubs.seen == [2, 3, 8, 8, 9]  # inode 8 (interrupted) again, then the rest
        assert second.records[13].last["files"] == 4

    run(store, go)


def test_open_and_failing_files_are_retried_then_given_up(store: MetaStore) -> None:
    routing, scrubs = FixedRouting(), Scrubs()
    clock = ManualClock()

    async def go() -> None:
        await _fill(store)
        async with store.write() as t:
            await t.add_session(2, 1, 99, 0)  # inode 2 is open for write
        w = _worker(store, routing, scrubs, clock=clock, attempts_max=3, retry_interval_s=5.0)
        await w.run_once()
        routing.swap(13, 777)
        scrubs.fail = {3}
        assert await w.run_once() == 0
        job = w.records[13].job
        assert job is not None and job.phase == "retry" and job.retry == {2: 0, 3: 2}  # 3: the pass and a retry
        assert 2 not in scrubs.seen
        (row,) = progress_rows(w.records.values())
        assert row["files_retry"] == 2 and row["files_left"] == 2 and row["phase"] == "retry"
        assert await w.run_once() == 0 and scrubs.seen.count(3) == 2  # not before retry_interval_s
        async with store.write() as t:
            assert await t.remove_session(2, 1)
        clock.advance(6.0)
        assert await w.run_once() == 1  # 2 rebuilt once closed; 3 given up after 3 attempts
        assert scrubs.seen.count(2) == 1 and scrubs.seen.count(3) == 3
        last = w.records[13].last
        assert last["files"] == 3 and last["failed"] == 1 and w.records[13].complete_target == 777

    run(store, go)


def test_a_target_swapped_again_mid_rebuild_starts_over(store: MetaStore) -> None:
    routing, scrubs = FixedRouting(), Scrubs()

    async def go() -> None:
        await _fill(store)
        w = _worker(store, routing, scrubs)
        await w.run_once()
        routing.swap(13, 777)
        scrubs.fail = {9}
        await w.run_once()
        assert w.records[13].job is not None
        routing.swap(13, 888)  # the spare died too
        scrubs.fail = set()
        scrubs.seen.clear()
        assert await w.run_once() == 1
        assert scrubs.seen == [2, 3, 8, 9] and w.records[13].complete_target == 888

    run(store, go)
