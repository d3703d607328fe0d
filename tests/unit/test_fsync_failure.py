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
