"""A durable write whose first forward failed (the head keeps it as a leftover) and whose retry
is then acked: every replica's commit of it must be durable (reviewer's D1: the reforward and
its whole-chunk replace used to commit non-durably everywhere)."""

from __future__ import annotations

import crc32c
import pytest
import tests.unit.test_replication_defects as T

from loomfs.wire.storage import WRITE, RequestTag, WriteReq


def test_durable_retry_after_failed_forward_commits_durably_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[tuple[int, int, bool]] = []
    orig_commit = T.FlakyEngine.commit

    async def commit(self, key, version, *, durable=False):  # type: ignore[no-untyped-def]
        log.append((id(self), version, durable))
        return await orig_commit(self, key, version, durable=durable)

    monkeypatch.setattr(T.FlakyEngine, "commit", commit)

    async def body(c: T.Chain3) -> None:
        data = b"ckpt" * 100
        req = WriteReq(chain_id=1, chain_version=c.version, chunk=T.CHUNK, offset=0, length=len(data),
                       chunk_size=T.CHUNK_SIZE, data_crc=crc32c.crc32c(data),
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

    T.run(body)
