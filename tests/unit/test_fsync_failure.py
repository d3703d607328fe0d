"""A failed fsync takes the target out of service (issue 10, reviewer's D2; engine.diskfail):
the replica that failed acks nothing and serves nothing from then on, its node reports it
OFFLINE, and the chain goes on without it; retries are acked by the healthy replicas."""

from __future__ import annotations

import crc32c
import pytest
from test_replication_defects import CHUNK, CHUNK_SIZE, KEY, Chain3, FlakyEngine, run

from loomfs.errors import LoomError
from loomfs.wire.status import Status
from loomfs.wire.storage import SYNC_FLUSH, WRITE, RequestTag, SyncFlushReq, WriteReq
from loomfs.wire.types import TargetState


def _req(c: Chain3, data: bytes, request_id: int) -> WriteReq:
    return WriteReq(chain_id=1, chain_version=c.version, chunk=CHUNK, offset=0, length=len(data),
                    chunk_size=CHUNK_SIZE, data_crc=crc32c.crc32c(data),
                    tag=RequestTag(client_id=9, request_id=request_id), durable=True)


@pytest.mark.parametrize("failing", [1, 2, 3])
def test_failed_fsync_takes_the_replica_out_and_the_retry_is_acked_without_it(failing: int) -> None:
    async def body(c: Chain3) -> None:
        reported: list[tuple[int, str]] = []
        for n in c.nodes:
            n.service.on_target_failed = lambda tid, why: reported.append((tid, why))
        await c.client.call(c.nodes[0].address, WRITE, _req(c, b"one" * 100, 1), payload=memoryview(b"one" * 100),
                            payload_crc=crc32c.crc32c(b"one" * 100))
        data = b"two" * 200
        c.engine(failing).fail_fsyncs = 1
        with pytest.raises(LoomError) as err:  # not acked: one replica could not make it durable
            await c.client.call(c.nodes[0].address, WRITE, _req(c, data, 2), payload=memoryview(data),
                                payload_crc=crc32c.crc32c(data))
        assert err.value.status in (Status.TARGET_NOT_SERVING, Status.CHAIN_UNAVAILABLE), err.value
        assert c.engine(failing).failed and reported == [(c.tid(failing), c.engine(failing).failed)]
        svc = c.nodes[failing - 1].service
        infos = {t.target_id: t.state for t in svc.target_infos(failing)}
        assert infos == {c.tid(failing): TargetState.OFFLINE}  # the heartbeat says so
        with pytest.raises(LoomError) as err:  # it serves nothing any more
            await c.read(failing)
        assert err.value.status is Status.TARGET_NOT_SERVING
        # mgmtd takes it out (v2); the client's retry (same tag) is acked by the others
        rest = [n for n in (1, 2, 3) if n != failing]
        c.set_chain(rest, version=2)
        await c.client.call(c.nodes[rest[0] - 1].address, WRITE, _req(c, data, 2), payload=memoryview(data),
                            payload_crc=crc32c.crc32c(data))
        for n in rest:
            assert c.content(n) == data and await c.read(n) == data
        versions = {c.engine(n).get(KEY).commit_ver for n in rest}  # type: ignore[union-attr]
        assert len(versions) == 1
        with pytest.raises(LoomError) as err:  # not even as a chain member again (mgmtd never would)
            await c.read(failing)
        assert err.value.status is Status.TARGET_NOT_SERVING

    run(body)


def test_resync_copies_are_made_durable_before_the_target_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    """Resync copies commit without fsync; before the predecessor reports the resync done it
    asks the syncing target (SYNC_FLUSH) to make every copy durable. Fenced like the copies:
    only from its predecessor, for the current chain version, while it is syncing."""
    flushed: list[tuple[int, object]] = []

    async def make_durable(self, key):  # type: ignore[no-untyped-def]
        flushed.append((id(self), key))

    monkeypatch.setattr(FlakyEngine, "make_durable", make_durable)

    async def body(c: Chain3) -> None:
        data = b"sync" * 50
        c.set_chain([1, 2], version=2, syncing=(3,))
        copy = WriteReq(chain_id=1, chain_version=2, chunk=CHUNK, offset=0, length=len(data), chunk_size=CHUNK_SIZE,
                        data_crc=crc32c.crc32c(data), forwarded=True, update_ver=4, full_replace=True, sync=True,
                        from_target=c.tid(2))
        await c.client.call(c.nodes[2].address, WRITE, copy, payload=memoryview(data), payload_crc=crc32c.crc32c(data))
        assert c.content(3) == data and flushed == []  # committed, not flushed

        async def flush(chain_version: int, sender: int) -> Status:
            try:
                await c.client.call(c.nodes[2].address, SYNC_FLUSH, SyncFlushReq(
                    chain_id=1, chain_version=chain_version, from_target=c.tid(sender)))
            except LoomError as exc:
                assert exc.status is not None
                return exc.status
            return Status.OK

        assert await flush(1, 2) is Status.STALE_CHAIN_VERSION
        assert await flush(2, 1) is Status.TARGET_NOT_SERVING  # not its predecessor
        assert flushed == []
        assert await flush(2, 2) is Status.OK
        assert flushed == [(id(c.engine(3)), KEY)]
        assert await flush(2, 2) is Status.OK and len(flushed) == 1  # nothing new to flush
        c.set_chain([1, 2, 3], version=3)
        assert await flush(3, 2) is Status.TARGET_NOT_SERVING  # serving now: no resync to flush

    run(body)


def test_resync_flushes_the_target_in_bounded_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """A big resync does not end in one huge SYNC_FLUSH (reviewer's R15): the source flushes the
    target every SYNC_FLUSH_EVERY copies and once at the end, before its done report; every copy
    is made durable exactly once."""
    from loomfs.storage import resync
    from loomfs.storage.resync import Resyncer, SyncJob
    from loomfs.wire.mgmtd import SyncReportReq

    monkeypatch.setattr(resync, "SYNC_FLUSH_EVERY", 2)
    flushed: list[object] = []

    async def make_durable(self, key):  # type: ignore[no-untyped-def]
        flushed.append(key)

    monkeypatch.setattr(FlakyEngine, "make_durable", make_durable)
    calls: list[int] = []
    real_flush = Resyncer._flush_dest

    async def counting(self, job, routing):  # type: ignore[no-untyped-def]
        calls.append(len(flushed))
        await real_flush(self, job, routing)

    monkeypatch.setattr(Resyncer, "_flush_dest", counting)

    async def body(c: Chain3) -> None:
        c.set_chain([1, 2], version=2)  # target 3 is out: it misses these writes
        for i in range(5):
            data = bytes([65 + i]) * 100
            req = WriteReq(chain_id=1, chain_version=2, chunk=CHUNK.__class__(inode=50, index=i), offset=0,
                           length=len(data), chunk_size=CHUNK_SIZE, data_crc=crc32c.crc32c(data),
                           tag=RequestTag(client_id=3, request_id=i + 1))
            await c.client.call(c.nodes[0].address, WRITE, req, payload=memoryview(data),
                                payload_crc=crc32c.crc32c(data))
        c.set_chain([1, 2], version=3, syncing=(3,))
        reports: list[SyncReportReq] = []

        async def report(req: SyncReportReq) -> bool:
            reports.append(req)
            return True

        r = Resyncer(c.nodes[1].service, report)
        job = SyncJob(chain_id=1, chain_version=3, source=c.tid(2), dest=c.tid(3))
        assert await r._sync(job, await c.routing.get()) == 5
        assert calls == [0, 2, 4]  # after 2 and 4 copies, and the last one before the done report
        assert len(flushed) == 5 and len(set(flushed)) == 5
        assert reports[-1].done

    run(body)


def test_repair_installs_durably_and_gives_up_on_a_failed_target(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Reviewer's R13: a scrub repair (or resync pull) installs the good copy with a durable
    commit (it replaces bytes the disk lost), and stops retrying once the target failed."""
    import asyncio
    import errno

    from loomfs.storage.engine.file import FileEngine
    from loomfs.storage.engine.types import ChunkKey
    from loomfs.storage.install import install_copy
    from loomfs.storage.target import StorageTarget

    class Svc:
        replacing: set = set()  # type: ignore[type-arg]

    e = FileEngine(tmp_path / "t")
    t = StorageTarget(7001, e)
    key = ChunkKey(8, 0)

    async def go() -> None:
        e.stage_write(key, 1, 0, b"bad" * 100)
        await e.commit(key, 1)
        before = e.durable_commits_total
        await install_copy(Svc(), t, key, 1, memoryview(b"good" * 75), ())
        assert e.durable_commits_total == before + 1 and not Svc.replacing
        e._fail(OSError(errno.EIO, "injected"))
        with pytest.raises(OSError):
            await asyncio.wait_for(install_copy(Svc(), t, key, 1, memoryview(b"good" * 75), ()), 10)
        assert not Svc.replacing

    try:
        asyncio.run(go())
    finally:
        e.close()
