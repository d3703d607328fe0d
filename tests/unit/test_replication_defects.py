"""Regression tests for the replication defects of issue 8, each on three real StorageService
instances chained over the simulated network on virtual time (no sockets, no sleeps).

Every test here failed on the code before the fix (see the issue for each defect)."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

import crc32c
import pytest

from loomfs.common.clock import ManualClock
from loomfs.errors import LoomError
from loomfs.net.rpc import RetryPolicy, RpcClient, RpcServer
from loomfs.net.sim import SimNetwork
from loomfs.net.transport import Address
from loomfs.storage import planted
from loomfs.storage.dedupe import TagCache
from loomfs.storage.engine.memory import MemoryEngine
from loomfs.storage.engine.types import ChunkKey
from loomfs.storage.service import StorageService
from loomfs.storage.target import StorageTarget, target_id_for
from loomfs.testing.routing import StaticRouting
from loomfs.testing.simloop import run_virtual
from loomfs.wire.status import Status
from loomfs.wire.storage import (
    READ,
    REMOVE_CHUNKS,
    TRUNCATE,
    WRITE,
    ChunkId,
    ReadReq,
    RemoveChunksReq,
    RequestTag,
    TruncateReq,
    WriteReq,
)
from loomfs.wire.types import ChainInfo, NodeInfo, NodeKind, RoutingInfo, TargetInfo, TargetState

CHUNK_SIZE = 1 << 17  # two 64 KiB blocks (an append checks only the last one)
CHUNK = ChunkId(inode=7, index=0)
KEY = ChunkKey(7, 0)


class FlakyEngine(MemoryEngine):
    """Fails the next ``fail_stages`` stages with EIO (a disk error at the head)."""

    fail_stages = 0

    def stage_write(self, *args, **kw):  # type: ignore[no-untyped-def,override]
        if self.fail_stages:
            self.fail_stages -= 1
            raise OSError(errno.EIO, "injected EIO")
        return super().stage_write(*args, **kw)


@dataclass
class Node:
    node_id: int
    service: StorageService
    target: StorageTarget
    address: Address


class Chain3:
    def __init__(self) -> None:
        self.net = SimNetwork(seed=8)
        self.routing = StaticRouting(RoutingInfo())
        self.nodes: list[Node] = []
        self.client = RpcClient(self.net.transport("client"), call_timeout_s=5.0,
                                retry=RetryPolicy(attempts_max=1))
        self.servers: list[RpcServer] = []

    async def start(self) -> Chain3:
        for node_id in (1, 2, 3):
            host = f"n{node_id}"
            target = StorageTarget(target_id_for(node_id, 0), FlakyEngine())
            fwd = RpcClient(self.net.transport(host), call_timeout_s=2.0, retry=RetryPolicy(attempts_max=1))
            svc = StorageService([target], self.routing, fwd, reconfig_wait_s=0.05, forward_timeout_s=2.0)
            server = RpcServer(host, self.net.transport(host))
            server.add_service(svc)
            addr = await server.start(Address(host, 9000))
            self.servers.append(server)
            self.nodes.append(Node(node_id, svc, target, addr))
        self.set_chain([1, 2, 3], version=1)
        return self

    def tid(self, node_id: int) -> int:
        return target_id_for(node_id, 0)

    def set_chain(self, members: list[int], version: int, syncing: tuple[int, ...] = (),
                  waiting: tuple[int, ...] = ()) -> None:
        self.version = version
        self.routing.set(RoutingInfo(
            version=version,
            nodes=[NodeInfo(node_id=n.node_id, kind=NodeKind.STORAGE, host=n.address.host, port=n.address.port)
                   for n in self.nodes],
            targets=[TargetInfo(target_id=n.target.target_id, node_id=n.node_id, chain_id=1,
                                state=TargetState.SYNCING if n.node_id in syncing else
                                TargetState.WAITING if n.node_id in waiting else
                                TargetState.SERVING if n.node_id in members else TargetState.OFFLINE)
                     for n in self.nodes],
            chains=[ChainInfo(chain_id=1, version=version,
                              targets=[self.tid(m) for m in (*members, *syncing, *waiting)])],
        ))

    def engine(self, node_id: int) -> FlakyEngine:
        e = self.nodes[node_id - 1].target.engine
        assert isinstance(e, FlakyEngine)
        return e

    def content(self, node_id: int) -> bytes:
        e = self.engine(node_id)
        st = e.get(KEY)
        if st is None or not st.commit_ver:
            return b""
        buf = bytearray(st.length)
        e.read(KEY, 0, memoryview(buf))
        return bytes(buf)

    async def write(self, head: int, offset: int, data: bytes, tag: tuple[int, int] = (0, 0)) -> None:
        req = WriteReq(chain_id=1, chain_version=self.version, chunk=CHUNK, offset=offset, length=len(data),
                       chunk_size=CHUNK_SIZE, data_crc=crc32c.crc32c(data),
                       tag=RequestTag(client_id=tag[0], request_id=tag[1]))
        await self.client.call(self.nodes[head - 1].address, WRITE, req, payload=memoryview(data),
                               payload_crc=crc32c.crc32c(data))

    async def truncate(self, head: int, length: int, tag: tuple[int, int]) -> None:
        req = TruncateReq(chain_id=1, chain_version=self.version, chunk=CHUNK, length=length,
                          chunk_size=CHUNK_SIZE, tag=RequestTag(client_id=tag[0], request_id=tag[1]))
        await self.client.call(self.nodes[head - 1].address, TRUNCATE, req)

    async def read(self, node_id: int) -> bytes:
        req = ReadReq(chain_id=1, chain_version=self.version, chunk=CHUNK, offset=0, length=CHUNK_SIZE,
                      target_id=self.tid(node_id))
        rsp = await self.client.call(self.nodes[node_id - 1].address, READ, req)
        return bytes(rsp.payload)

    async def stop(self) -> None:
        await self.client.close()
        for n, s in zip(self.nodes, self.servers, strict=True):
            await n.service.rpc.close()
            await s.close()


def run(body: Callable[[Chain3], Awaitable[None]]) -> None:
    async def main() -> None:
        c = await Chain3().start()
        try:
            await asyncio.wait_for(body(c), 30)
        finally:
            await c.stop()

    run_virtual(main())


@pytest.fixture(autouse=True)
def _planted_bugs_restored() -> Iterator[None]:
    saved = set(planted.PLANTED)  # $LOOMFS_PLANTED_BUGS shows which test each planted bug fails
    yield
    planted.clear()
    planted.PLANTED.update(saved)


def test_head_stage_failure_forwards_nothing_and_reuses_no_version() -> None:
    """Defect 1: the head forwarded before staging; a failed local stage left v1 committed on
    the successors only, and the next write reused v1 for other bytes (acked as a duplicate)."""

    async def body(c: Chain3) -> None:
        c.engine(1).fail_stages = 1
        with pytest.raises(LoomError):
            await c.write(1, 0, b"A" * 100)
        await c.write(1, 0, b"B" * 50)
        contents = {n: c.content(n) for n in (1, 2, 3)}
        assert contents == {1: b"B" * 50, 2: b"B" * 50, 3: b"B" * 50}
        assert {c.engine(n).get(KEY).commit_ver for n in (1, 2, 3)} == {1}  # type: ignore[union-attr]

    run(body)


def test_diverged_successor_is_repaired_by_whole_chunk_replace() -> None:
    """Defect 1: a forwarded update applied to a diverged base was committed without
    comparing content; now the result's CRC travels and a mismatch gets the whole chunk."""

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"A" * 100)
        tail = c.engine(3)  # the tail's v1 silently holds other bytes
        await tail.remove_range(KEY.inode, 0, 1)
        tail.stage_write(KEY, 1, 0, b"X" * 100)
        await tail.commit(KEY, 1)
        await c.write(1, 10, b"B" * 10)
        want = b"A" * 10 + b"B" * 10 + b"A" * 80
        assert [c.content(n) for n in (1, 2, 3)] == [want] * 3
        # a "duplicate" of the committed version with other bytes is not acked blindly
        await tail.remove_range(KEY.inode, 0, 1)
        tail.stage_write(KEY, 2, 0, b"Y" * 100)
        await tail.commit(KEY, 2)
        mid = c.nodes[1].service
        st = c.engine(2).get(KEY)
        assert st is not None
        dup = WriteReq(chain_id=1, chain_version=1, chunk=CHUNK, offset=0, length=0, chunk_size=CHUNK_SIZE,
                       forwarded=True, update_ver=2, expect_length=st.length, expect_crc=st.crc)
        with pytest.raises(LoomError) as err:
            await c.client.call(c.nodes[2].address, WRITE, dup, payload=memoryview(b""), payload_crc=0)
        assert err.value.status is Status.VERSION_MISMATCH
        assert mid is not None

    run(body)


def test_resync_copies_are_fenced() -> None:
    """Defect 2: a resync copy was accepted from anyone, for any chain version, and could roll
    a chunk back."""

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"new" * 10)
        await c.write(1, 0, b"NEW" * 10)  # v2 everywhere
        old = b"old" * 10

        def copy(chain_version: int, sender: int, ver: int) -> WriteReq:
            return WriteReq(chain_id=1, chain_version=chain_version, chunk=CHUNK, offset=0, length=len(old),
                            chunk_size=CHUNK_SIZE, data_crc=crc32c.crc32c(old), forwarded=True, update_ver=ver,
                            full_replace=True, sync=True, from_target=c.tid(sender))

        async def send(req: WriteReq) -> Status:
            try:
                await c.client.call(c.nodes[2].address, WRITE, req, payload=memoryview(old),
                                    payload_crc=crc32c.crc32c(old))
            except LoomError as exc:
                assert exc.status is not None
                return exc.status
            return Status.OK

        # the target is serving, not syncing: refused
        assert await send(copy(1, 2, 1)) is Status.TARGET_NOT_SERVING
        c.set_chain([1, 2], version=2, syncing=(3,))
        assert await send(copy(1, 2, 1)) is Status.STALE_CHAIN_VERSION  # a replaced worker's copy
        assert await send(copy(2, 1, 1)) is Status.TARGET_NOT_SERVING  # not from its predecessor
        assert await send(copy(2, 2, 1)) is Status.VERSION_MISMATCH  # never backwards
        assert c.content(3) == b"NEW" * 10

    run(body)


def test_new_tail_commits_leftover_pending_the_old_tail_served() -> None:
    """Defect 3: the old tail committed (and served) v2, its ack was lost; the new tail held
    v2 pending and served v1 — data a reader had seen disappeared."""

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"one")
        for n in (1, 2):  # v2 reached every replica; only the old tail (3) committed it
            c.engine(n).stage_write(KEY, 2, 0, b"two")
            c.nodes[n - 1].service._leftovers.setdefault(c.tid(n), set()).add(KEY)
        c.engine(3).stage_write(KEY, 2, 0, b"two")
        await c.engine(3).commit(KEY, 2)
        assert await c.read(3) == b"two"  # served
        c.set_chain([1, 2], version=2)  # the old tail dies
        assert await c.read(2) == b"two"
        # the head's leftover goes down proactively on the chain change, without a new write
        assert await c.nodes[0].service.settle_leftovers() == 1
        assert c.engine(1).get(KEY).commit_ver == 2  # type: ignore[union-attr]
        assert not c.nodes[0].service.has_leftovers

    run(body)


def test_only_member_commits_leftover_before_next_write() -> None:
    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"one")
        c.engine(1).stage_write(KEY, 2, 0, b"two")  # pending; the others may have committed it
        c.set_chain([1], version=2)
        await c.write(1, 3, b"+")
        assert c.content(1) == b"two+"
        assert c.engine(1).get(KEY).commit_ver == 3  # type: ignore[union-attr]

    run(body)


def test_retry_after_failover_is_not_applied_twice() -> None:
    """Defect 4: the retry cache lived in the head's memory only; a client retrying its
    truncate at the new head after failover cut off another writer's data."""

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"x" * 100, tag=(5, 1))
        await c.truncate(1, 10, tag=(5, 2))  # acked, but say the ack was lost
        await c.write(1, 10, b"y" * 90, tag=(6, 1))  # another client extends the chunk
        c.set_chain([2, 3], version=2)  # the head fails over
        await c.truncate(2, 10, tag=(5, 2))  # the retry at the new head
        assert [c.content(n) for n in (2, 3)] == [b"x" * 10 + b"y" * 90] * 2
        assert c.nodes[1].service.dedupes_total == 1

    run(body)


def test_reads_fenced_by_lease_and_registration() -> None:
    """Defect 5: reads were served after the lease lapsed and before registration."""

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"data")
        svc = c.nodes[2].service
        clock = ManualClock()
        svc.clock = clock
        svc.lease_granted(clock.monotonic(), 2.0)
        assert await c.read(3) == b"data"
        clock.advance(1.7)
        with pytest.raises(LoomError) as err:
            await c.read(3)
        assert err.value.status is Status.TARGET_NOT_SERVING
        svc.lease_granted(clock.monotonic(), 2.0)
        svc.revoked = {c.tid(3)}  # mgmtd is taking the target out of its chain
        with pytest.raises(LoomError):
            await c.read(3)
        svc.revoked = set()
        assert await c.read(3) == b"data"
        svc.ready = False  # a restarted process that has not registered yet
        with pytest.raises(LoomError):
            await c.read(3)

    run(body)


def test_remove_chunks_checks_writable_and_takes_chunk_locks() -> None:
    """Defect 8: REMOVE_CHUNKS skipped the writable check and took no chunk lock."""

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"data")
        head = c.nodes[0].service
        head.writable_until_s = 0.0
        rm = RemoveChunksReq(chain_id=1, chain_version=1, inode=KEY.inode, index_begin=0, index_end=1)
        with pytest.raises(LoomError) as err:
            await c.client.call(c.nodes[0].address, REMOVE_CHUNKS, rm)
        assert err.value.status is Status.TARGET_NOT_SERVING
        head.writable_until_s = float("inf")
        async with c.nodes[2].target.locks.hold(KEY):  # an update holds the tail's chunk
            task = asyncio.ensure_future(c.client.call(c.nodes[0].address, REMOVE_CHUNKS, rm))
            await asyncio.sleep(0.2)
            assert not task.done() and c.content(3) == b"data"
        await task
        assert [c.content(n) for n in (1, 2, 3)] == [b""] * 3

    run(body)


def test_trimmed_chunk_keeps_its_version_numbers() -> None:
    """Found by the rewrite/truncate fault workload: REMOVE_CHUNKS dropped a trimmed chunk's
    state, so the chunk came back at v1 when the file grew again while a replica that missed
    the trim still held other bytes at a higher version (acked as a "duplicate", or refused
    forever as "older"). A trim now makes each chunk an empty new version."""

    async def body(c: Chain3) -> None:
        for i in range(3):
            await c.write(1, 0, bytes([65 + i]) * 100)  # v3 everywhere
        c.set_chain([1, 2], version=2)  # node 3 misses the trim
        rm = RemoveChunksReq(chain_id=1, chain_version=2, inode=KEY.inode, index_begin=0, keep_versions=True)
        rsp = await c.client.call(c.nodes[0].address, REMOVE_CHUNKS, rm)
        assert rsp.body.removed == 1
        assert [(c.engine(n).get(KEY).commit_ver, c.content(n)) for n in (1, 2)] == [(4, b"")] * 2  # type: ignore[union-attr]
        assert c.engine(3).get(KEY).commit_ver == 3  # type: ignore[union-attr]
        await c.write(1, 10, b"new")  # the file grows back: v5, not v1
        assert c.engine(1).get(KEY).commit_ver == 5  # type: ignore[union-attr]
        c.set_chain([1, 2, 3], version=3)  # the stale replica is back in the write path
        await c.write(1, 0, b"z")
        want = b"z" + bytes(9) + b"new"
        assert [c.content(n) for n in (1, 2, 3)] == [want] * 3
        assert {c.engine(n).get(KEY).commit_ver for n in (1, 2, 3)} == {6}  # type: ignore[union-attr]
        # a trim again: idempotent for empty chunks, and only the head takes it
        rm = RemoveChunksReq(chain_id=1, chain_version=3, inode=KEY.inode, index_begin=1, keep_versions=True)
        assert (await c.client.call(c.nodes[0].address, REMOVE_CHUNKS, rm)).body.removed == 0

    run(body)


def test_late_duplicate_after_many_updates_is_not_applied() -> None:
    """Found by the simulator (seed 24 before the fix): a write retried (or duplicated by the
    network) arrived after more than TAGS_MAX other updates had pushed its tag out of the
    chunk's list, and was applied a second time. The chunk now keeps the last request per
    client; a client updates a chunk one request at a time, so an id at or below it is old."""

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"a" * 10, tag=(5, 1))
        for i in range(20):  # another client overwrites it, and more
            await c.write(1, i, b"b", tag=(6, i + 1))
        before = c.content(1)
        c.nodes[0].service.tags = TagCache()  # as at a new head: only the chunk's tags know
        await c.write(1, 0, b"a" * 10, tag=(5, 1))  # the late duplicate: acked, not applied
        assert [c.content(n) for n in (1, 2, 3)] == [before] * 3
        await c.write(1, 0, b"c", tag=(5, 2))  # the client's next request is applied
        assert c.content(3)[:1] == b"c"
        await c.truncate(1, 3, tag=(5, 1))  # an even older id of it: not applied either
        assert len(c.content(3)) == 20

    run(body)


def test_target_back_as_syncing_never_commits_its_old_pending_version() -> None:
    """Found by the simulator (seeds 40, 50, 132, 164, 173 before the fix): a head paused past
    its lease came back as the syncing write tail and committed the pending version it had
    staged before, "as the tail" — a number the chain had meanwhile given to other bytes. The
    pending version is kept unserved (seed 151227: it may be the only intact copy of a version
    the old tail committed; tests/unit/test_replication_torn_tail.py) until the resync
    replaces it."""

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"one")
        c.engine(1).stage_write(KEY, 2, 0, b"stale")  # staged as head, then paused past the lease
        c.nodes[0].service._leftovers.setdefault(c.tid(1), set()).add(KEY)
        c.set_chain([2, 3], version=2)
        await c.write(2, 0, b"TWO")  # the chain gives v2 to other bytes
        c.set_chain([2, 3], version=3, syncing=(1,))
        assert await c.nodes[0].service.settle_leftovers() == 0
        st = c.engine(1).get(KEY)
        assert st is not None and st.commit_ver == 1 and c.content(1) == b"one"
        assert not c.nodes[0].service.has_leftovers  # never pushed down either

    run(body)


def test_head_that_left_the_chain_while_forwarding_commits_nothing() -> None:
    """Found by the simulator (seeds 313, 321): a head paused mid-forward came back to a chain
    that had moved on with it as the syncing write tail; its forward loop took that for
    "became the tail" and committed its version — a number the chain had given to other bytes."""

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"one")
        c.net.partition("n1", "n2")  # the forward hangs
        task = asyncio.ensure_future(c.write(1, 0, b"two"))
        await asyncio.sleep(0.3)
        assert c.engine(1).get(KEY).pending_ver == 2  # type: ignore[union-attr]
        c.set_chain([2, 3], version=2, syncing=(1,))  # the chain moved on; the head comes back last
        with pytest.raises(LoomError):
            await task
        st = c.engine(1).get(KEY)
        assert st is not None and st.commit_ver == 1 and c.content(1) == b"one"
        c.net.heal()

    run(body)


def test_leftover_committed_for_a_read_reaches_the_syncing_target_too() -> None:
    """Found by the simulator (seed 991): the only serving member committed its leftover
    version for a read, but a syncing target followed it on the write path and the resync had
    already passed the chunk: the replicas differed for good."""

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"one")
        c.engine(1).stage_write(KEY, 2, 0, b"two")  # a leftover of a failed forward
        c.set_chain([1], version=2, syncing=(2,))  # node 2 resyncs (chunk already copied at v1)
        assert await c.read(1) == b"two"
        assert [(c.engine(n).get(KEY).commit_ver, c.content(n)) for n in (1, 2)] == [(2, b"two")] * 2  # type: ignore[union-attr]

    run(body)


def test_scrub_repair_survives_a_failing_disk() -> None:
    """Found by the simulator (seed 2090): the scrubber removed a rotten chunk to install the
    good copy, the install failed on a disk error, and the head was left without the chunk:
    its next write started again at v1 and was refused by its successors forever."""
    from loomfs.storage.scrub import Scrubber

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"x" * 200)
        await c.write(1, 0, b"y" * 10)  # v2 everywhere
        head = c.engine(1)
        head.corrupt(KEY, 50)
        head.fail_stages = 2  # the disk fails the first two installs
        scrub = Scrubber(c.nodes[0].service, bytes_per_s=0, interval_s=3600)
        good, _ = await scrub.check_chunk(c.nodes[0].target, KEY)
        assert not good and scrub.repaired == 1
        assert head.get(KEY).commit_ver == 2 and c.content(1) == c.content(3)  # type: ignore[union-attr]
        assert head.verify(KEY) == []

    run(body)


def test_scrub_brings_a_rotten_head_that_is_behind_to_the_tails_version() -> None:
    """Found by the simulator (seed 108): a head's committed version rotted, an append carried
    the rot into its pending version (good CRCs, bad bytes), so pushing that version down was
    refused (CRC mismatch) forever, while the scrubber only accepted a copy of the same
    version and the tail had already committed the next one."""
    from loomfs.storage.engine.blocks import BLOCK_BYTES
    from loomfs.storage.scrub import Scrubber

    n0 = BLOCK_BYTES + 100  # the rot in the first, whole block: an append checks only the last

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"x" * n0)
        head = c.engine(1)
        head.corrupt(KEY, 5)
        head.stage_write(KEY, 2, n0, b"tail")  # v2 pending at the head, rot carried along
        for n in (2, 3):  # the successors committed v2
            c.engine(n).stage_write(KEY, 2, n0, b"tail")
            await c.engine(n).commit(KEY, 2)
        scrub = Scrubber(c.nodes[0].service, bytes_per_s=0, interval_s=3600)
        good, _ = await scrub.check_chunk(c.nodes[0].target, KEY)
        assert not good and scrub.repaired == 1
        st = head.get(KEY)
        assert st is not None and (st.commit_ver, st.pending_ver) == (2, 0)
        assert c.content(1) == c.content(3) == b"x" * n0 + b"tail" and head.verify(KEY) == []

    run(body)


def test_chunk_being_replaced_is_not_served_as_missing() -> None:
    """Found by the simulator (seed 3763): while the scrubber retried installing the good copy
    (the rotten one already removed, the disk full for a while), a read at that replica found
    no chunk and returned no bytes."""
    from loomfs.storage.scrub import Scrubber

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"x" * 100)
        head = c.engine(1)
        head.corrupt(KEY, 50)
        head.fail_stages = 3
        scrub = Scrubber(c.nodes[0].service, bytes_per_s=0, interval_s=3600)
        task = asyncio.ensure_future(scrub.check_chunk(c.nodes[0].target, KEY))
        await asyncio.sleep(0.06)  # the install is between retries: no chunk on the disk
        assert head.get(KEY) is None
        with pytest.raises(LoomError):
            await c.read(1)
        await task
        assert await c.read(1) == b"x" * 100

    run(body)


def test_a_leftover_pushed_again_is_not_lost_to_a_failing_restage() -> None:
    """Found in review: a leftover version pushed down again was staged again at a successor
    that already held it; the restage failed on a disk error and dropped the only pending copy
    there (which the old tail may have committed and served)."""

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"one")
        for n in (1, 2):
            c.engine(n).stage_write(KEY, 2, 0, b"two")
        c.nodes[0].service._leftovers.setdefault(c.tid(1), set()).add(KEY)
        c.set_chain([1, 2], version=2)  # the old tail is gone; node 2 is the tail now
        c.engine(2).fail_stages = 1  # its disk fails the next stage
        assert await c.nodes[0].service.settle_leftovers() == 1
        assert [(c.engine(n).get(KEY).commit_ver, c.content(n)) for n in (1, 2)] == [(2, b"two")] * 2  # type: ignore[union-attr]

    run(body)


def test_scrub_repairs_a_pending_version_that_carries_the_rot() -> None:
    """Found by the simulator (seed 895): a rotten head's leftover append carried the rot, could
    never be pushed down intact, and the scrubber would not install the good copy over it. The
    scrubber installs the good copy, and (since session 13) takes the leftover's rotten block
    from it too, where it matches the leftover's own stored block CRC, instead of dropping it:
    the leftover is intact again and settles down the chain."""
    from loomfs.storage.engine.blocks import BLOCK_BYTES
    from loomfs.storage.scrub import Scrubber

    n0 = BLOCK_BYTES + 100  # the rot in the first, whole block: an append checks only the last

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"x" * n0)
        head = c.engine(1)
        head.corrupt(KEY, 5)
        head.stage_write(KEY, 2, n0, b"more")  # the leftover: nobody else has v2
        c.nodes[0].service._leftovers.setdefault(c.tid(1), set()).add(KEY)
        scrub = Scrubber(c.nodes[0].service, bytes_per_s=0, interval_s=3600)
        good, _ = await scrub.check_chunk(c.nodes[0].target, KEY)
        assert not good and scrub.repaired == 1
        st = head.get(KEY)
        assert st is not None and (st.commit_ver, st.pending_ver) == (1, 2) and c.content(1) == b"x" * n0
        await c.nodes[0].service.settle_leftovers()
        for n in (1, 2, 3):
            assert c.content(n) == b"x" * n0 + b"more" and c.engine(n).verify(KEY) == []

    run(body)

# A durable write whose first forward failed (the head keeps it as a leftover) and whose retry
# is then acked: every replica's commit of it must be durable (reviewer's D1, session 7: the
# reforward and its whole-chunk replace used to commit non-durably everywhere).
def test_durable_retry_after_failed_forward_commits_durably_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[tuple[int, int, bool]] = []
    orig_commit = FlakyEngine.commit

    async def commit(self, key, version, *, durable=False):  # type: ignore[no-untyped-def]
        log.append((id(self), version, durable))
        return await orig_commit(self, key, version, durable=durable)

    monkeypatch.setattr(FlakyEngine, "commit", commit)

    async def body(c: Chain3) -> None:
        data = b"ckpt" * 100
        req = WriteReq(chain_id=1, chain_version=c.version, chunk=CHUNK, offset=0, length=len(data),
                       chunk_size=CHUNK_SIZE, data_crc=crc32c.crc32c(data),
                       tag=RequestTag(client_id=5, request_id=1), durable=True)
        c.engine(2).fail_stages = 1  # the successor's disk fails once: the head keeps v1 as a leftover
        with pytest.raises(Exception):  # noqa: B017 - CHAIN_UNAVAILABLE (or its retry's outcome)
            await c.client.call(c.nodes[0].address, WRITE, req, payload=memoryview(data),
                                payload_crc=crc32c.crc32c(data))
        await c.client.call(c.nodes[0].address, WRITE, req, payload=memoryview(data), payload_crc=crc32c.crc32c(data))
        engines = {id(c.engine(n)) for n in (1, 2, 3)}
        committed = {e for e, v, _ in log if v == 1}
        assert committed == engines  # every replica committed v1 ...
        assert all(d for _, _, d in log), log  # ... and every commit was durable

    run(body)
