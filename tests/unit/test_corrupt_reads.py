"""Issue 15 items 7 and 8: a client that reads a rotten whole chunk reports it and the replica
is repaired at once; a chunk rotten on every replica fails promptly with EIO naming it. Three
real StorageServices and a real StorageClient over the simulated network, on virtual time."""

from __future__ import annotations

import asyncio
import errno

import pytest
from test_replication_defects import KEY, Chain3, run

from loomfs.client.storage_client import StorageClient, replica_pick
from loomfs.errors import LoomError
from loomfs.net.rpc import RetryPolicy, RpcClient
from loomfs.storage.scrub import Scrubber
from loomfs.wire.types import Layout

LAYOUT = Layout(chunk_size=1 << 16, chains=[1])


def _client(c: Chain3) -> StorageClient:
    rpc = RpcClient(c.net.transport("reader"), call_timeout_s=5.0, retry=RetryPolicy(attempts_max=1))
    return StorageClient(rpc, c.routing, client_id=5, call_timeout_s=20.0)  # type: ignore[arg-type]


def _scrubbers(c: Chain3) -> list[Scrubber]:
    out = []
    for n in c.nodes:
        s = Scrubber(n.service, bytes_per_s=0, interval_s=3600)  # no passes: only urgent checks
        n.service.on_corrupt = s.check_soon
        out.append(s)
    return out


def test_a_whole_chunk_read_that_fails_its_crc_gets_the_replica_repaired() -> None:
    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"x" * 1000)
        scrubs = _scrubbers(c)
        first = replica_pick(KEY.inode, KEY.index, 1) % 3 + 1  # the node a read of KEY goes to first
        rotten = (first, first % 3 + 1)
        for n in rotten:
            c.engine(n).corrupt(KEY, 10)  # two of three replicas rotten, the one read first among them
        sc = _client(c)
        buf = bytearray(1000)
        for _ in range(6):  # whichever replicas the reads pick, they all return good bytes
            assert await sc.read_chunk(LAYOUT, KEY.inode, KEY.index, 0, 1000, memoryview(buf)) == 1000
            assert bytes(buf) == b"x" * 1000
        for _ in range(200):
            if all(c.engine(n).verify(KEY) == [] for n in rotten):
                break
            await asyncio.sleep(0.01)
        repaired = [n for n in rotten if c.engine(n).verify(KEY) == []]
        reported = sum(s.repaired for s in scrubs)
        assert sc.corrupt_reports_total == reported == len(repaired) >= 1
        await sc.rpc.close()

    run(body)


def test_a_chunk_rotten_on_every_replica_fails_at_once_with_eio_naming_it() -> None:
    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"x" * 1000)
        _scrubbers(c)
        for n in (1, 2, 3):
            c.engine(n).corrupt(KEY, 10)
        sc = _client(c)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(LoomError) as err:
            await sc.read_chunk(LAYOUT, KEY.inode, KEY.index, 0, 1000, memoryview(bytearray(1000)))
        assert err.value.errno == errno.EIO and f"{KEY.inode}:{KEY.index}" in str(err.value)
        assert loop.time() - t0 < 2.0  # not the 20 s deadline
        await sc.rpc.close()

    run(body)


def test_scrub_stats_per_target_reach_the_routing() -> None:
    """Item 7: the scrubber's schedule and findings show in ``admin targets`` (via routing)."""
    from loomfs.mgmtd.state import ClusterState
    from loomfs.wire.types import NodeKind

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"x" * 1000)
        from loomfs.common.clock import LOOP_CLOCK

        svc = c.nodes[0].service
        svc.clock = LOOP_CLOCK  # the loop's virtual time
        scrub = Scrubber(svc, bytes_per_s=1 << 30, interval_s=600, first_pass_after_s=5)
        svc.scrub_stats = scrub.target_stats
        c.engine(1).corrupt(KEY, 3)
        runner = asyncio.ensure_future(scrub.run())
        await asyncio.sleep(1)
        st = scrub.target_stats(c.tid(1))
        wall_s = LOOP_CLOCK.now_ns() / 1e9
        assert (st.interval_s, st.passes, st.last_pass_end_unix_s) == (600, 0, 0.0)
        assert abs(st.next_pass_unix_s - (wall_s + 4)) <= 1.5
        await asyncio.sleep(5)
        st = scrub.target_stats(c.tid(1))
        wall_s = LOOP_CLOCK.now_ns() / 1e9
        assert (st.passes, st.checked, st.bad, st.repaired) == (1, 1, 1, 1)
        assert abs(st.next_pass_unix_s - (wall_s + 600)) <= 1.5 and abs(st.last_pass_end_unix_s - wall_s) <= 1.5
        runner.cancel()
        mgmtd = ClusterState(lease_s=5.0)
        infos = svc.target_infos(1)
        mgmtd.register(node_id=1, kind=NodeKind.STORAGE, host="h", port=1, now_s=0.0, targets=infos)
        mgmtd.heartbeat(1, infos, 0.5)
        (t,) = mgmtd.routing().targets
        assert t.scrub is not None and t.scrub.bad == 1 and t.scrub.interval_s == 600

    run(body)


def test_the_only_serving_copy_rotten_is_read_after_its_repair_not_eio() -> None:
    """Review: with one serving replica whose copy rotted (the good one on a waiting member),
    the read failed with EIO at once although the repair its report set off finished
    milliseconds later."""

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"x" * 1000)
        c.set_chain([1], version=2, waiting=(2, 3))
        _scrubbers(c)
        c.engine(1).corrupt(KEY, 10)
        sc = _client(c)
        buf = bytearray(1000)
        assert await sc.read_chunk(LAYOUT, KEY.inode, KEY.index, 0, 1000, memoryview(buf)) == 1000
        assert bytes(buf) == b"x" * 1000
        await sc.rpc.close()

    run(body)
