"""Regression tests for replication findings of the simulator after the issue-8 defects were
fixed (docs/fault-tolerance.md listed them as open), on three real StorageService instances
over the simulated network on virtual time. Each failed on the code before its fix."""

from __future__ import annotations

import asyncio

import pytest
from test_replication_defects import CHUNK, KEY, Chain3, run

from loomfs.errors import LoomError
from loomfs.storage.resync import Resyncer, SyncJob
from loomfs.storage.scrub import Scrubber
from loomfs.wire.status import Status
from loomfs.wire.storage import REMOVE_CHUNKS, RemoveChunksReq


async def _no_report(req: object) -> bool:
    return True


def test_only_serving_replica_rotten_is_repaired_from_a_waiting_members_pending_copy() -> None:
    """Seed 70133: the tail committed v2 and its ack was lost (v2 pending upstream); mgmtd then
    lost every node for a moment and the tail came back as the only serving member; its v2
    rotted. The scrubber asked serving replicas only, the resync kept sending the rotten bytes
    (refused by their CRC), and the chain never got back to three replicas."""

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"x" * 300)
        for n in (1, 2):
            c.engine(n).stage_write(KEY, 2, 0, b"y" * 100)  # pending upstream
        c.engine(3).stage_write(KEY, 2, 0, b"y" * 100)
        await c.engine(3).commit(KEY, 2)
        want = c.content(3)
        c.set_chain([3], version=2, waiting=(1, 2))
        c.engine(3).corrupt(KEY, 150)
        scrub = Scrubber(c.nodes[2].service, bytes_per_s=0, interval_s=3600)
        good, _ = await scrub.check_chunk(c.nodes[2].target, KEY)
        assert not good and scrub.repaired == 1
        st = c.engine(3).get(KEY)
        assert st is not None and st.commit_ver == 2 and c.content(3) == want and c.engine(3).verify(KEY) == []

    run(body)


def test_exact_read_serves_only_the_version_asked_for() -> None:
    async def body(c: Chain3) -> None:
        from loomfs.wire.storage import READ, ReadReq

        await c.write(1, 0, b"a" * 10)
        c.set_chain([1], version=2, waiting=(2, 3))  # node 2 is not serving: normal reads refused
        req = ReadReq(chain_id=1, chain_version=2, chunk=CHUNK, offset=0, length=10, target_id=c.tid(2),
                      exact_ver=1)
        rsp = await c.client.call(c.nodes[1].address, READ, req)
        assert bytes(rsp.payload) == b"a" * 10 and rsp.body.commit_ver == 1
        with pytest.raises(LoomError) as err:
            await c.client.call(c.nodes[1].address, READ, ReadReq(
                chain_id=1, chain_version=2, chunk=CHUNK, offset=0, length=10, target_id=c.tid(2), exact_ver=2))
        assert err.value.status is Status.VERSION_MISMATCH

    run(body)


def test_resync_never_sends_a_rotten_source_chunk_and_gets_it_repaired() -> None:
    """Seed 70133 too: the resync source's copy rotted; the copy is refused (its CRC), the
    source asks the scrubber to repair it (here from the syncing target's own pending copy),
    and the next attempt finishes."""

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"x" * 300)
        c.engine(2).stage_write(KEY, 2, 0, b"y" * 100)
        c.engine(1).stage_write(KEY, 2, 0, b"y" * 100)
        await c.engine(1).commit(KEY, 2)
        want = c.content(1)
        c.set_chain([1], version=3, syncing=(2,))
        c.engine(1).corrupt(KEY, 20)
        svc = c.nodes[0].service
        scrub = Scrubber(svc, bytes_per_s=0, interval_s=3600)
        svc.on_corrupt = scrub.check_soon
        resync = Resyncer(svc, _no_report)
        job = SyncJob(1, 3, c.tid(1), c.tid(2))
        routing = await svc.routing.get()
        with pytest.raises(LoomError) as err:
            await resync._sync(job, routing)
        assert err.value.status is Status.CHECKSUM_MISMATCH
        for _ in range(100):  # the repair runs once the resync let go of the chunk
            if scrub.repaired:
                break
            await asyncio.sleep(0.01)
        assert scrub.repaired == 1 and c.content(1) == want
        await resync._sync(job, routing)
        assert c.content(2) == want

    run(body)


def test_scrub_repair_does_not_hold_the_chunk_lock_while_fetching() -> None:
    """A hung peer held the rotten chunk's lock (and every write to it) for the repair read's
    whole 30 s timeout."""

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"x" * 300)
        c.set_chain([1], version=2, waiting=(2, 3))
        c.engine(1).corrupt(KEY, 20)
        for host in ("n2", "n3"):
            c.net.pause(host)
        svc = c.nodes[0].service
        scrub = Scrubber(svc, bytes_per_s=0, interval_s=3600)
        task = asyncio.ensure_future(scrub.check_chunk(c.nodes[0].target, KEY))
        await asyncio.sleep(0.5)
        assert not task.done()  # waiting for a hung peer
        async with asyncio.timeout(0.1):
            async with c.nodes[0].target.locks.hold(KEY):
                pass
        for host in ("n2", "n3"):
            c.net.resume(host)
        good, _ = await task
        assert not good and scrub.repaired == 1 and c.content(1) == b"x" * 300

    run(body)


def test_removal_racing_a_resync_copy_leaves_no_chunk_on_the_syncing_target() -> None:
    """A resync copy queued on the chunk lock ahead of a removal landed on the syncing target
    after the removal had already gone down the chain: an orphan chunk there."""

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"x" * 300)
        c.set_chain([1], version=2, syncing=(2,))
        await c.engine(2).remove_range(KEY.inode, 0, 1)  # a fresh syncing target
        svc = c.nodes[0].service
        resync = Resyncer(svc, _no_report)
        job = SyncJob(1, 2, c.tid(1), c.tid(2))
        routing = await svc.routing.get()
        target = c.nodes[0].target
        release = asyncio.Event()

        async def writer_in_flight() -> None:
            async with target.locks.hold(KEY):
                await release.wait()

        holder = asyncio.ensure_future(writer_in_flight())
        await asyncio.sleep(0)
        copy = asyncio.ensure_future(resync._sync_chunk(job, routing, target, KEY, None))
        await asyncio.sleep(0.01)
        rm = RemoveChunksReq(chain_id=1, chain_version=2, inode=KEY.inode, index_begin=0, index_end=1)
        removal = asyncio.ensure_future(c.client.call(c.nodes[0].address, REMOVE_CHUNKS, rm))
        await asyncio.sleep(0.2)
        release.set()
        await asyncio.gather(holder, copy, removal)
        assert c.engine(1).get(KEY) is None
        assert c.engine(2).get(KEY) is None

    run(body)


async def _commit(c: Chain3, node: int, ver: int, data: bytes) -> None:
    from loomfs.storage.engine.types import ChunkKey

    e = c.engine(node)
    await e.remove_range(KEY.inode, 0, 1)
    for v in range(1, ver + 1):  # versions 1..ver, the last one holding ``data``
        e.stage_write(ChunkKey(KEY.inode, KEY.index), v, 0, data if v == ver else b"old%d" % v, full_replace=True)
        await e.commit(KEY, v)


def test_lastsrv_behind_a_returning_member_converges_and_keeps_what_it_acked_since() -> None:
    """Every replica of a chain crashed (power loss, commits unsynced); mgmtd kept the one it
    detected last as last serving, and it came back without v3 and v4 that another member
    holds. It acked a write since (v3, a reused number). The resync refused to take the other
    member back (never backwards) and the chain stayed at R-1; a first fix that took the
    member's newer copy replaced the acked write (review)."""

    async def body(c: Chain3) -> None:
        await _commit(c, 1, 2, b"two")
        await _commit(c, 2, 4, b"four")
        c.set_chain([1], version=5, waiting=(2, 3))
        await c.write(1, 0, b"ACKED")
        assert await c.read(1) == b"ACKED"
        c.set_chain([1], version=6, syncing=(2,), waiting=(3,))
        svc = c.nodes[0].service
        await Resyncer(svc, _no_report)._sync(SyncJob(1, 6, c.tid(1), c.tid(2)), await svc.routing.get())
        assert [(c.engine(n).get(KEY).commit_ver, c.content(n)) for n in (1, 2)] == [(3, b"ACKED")] * 2  # type: ignore[union-attr]
        assert await c.read(1) == b"ACKED"

    run(body)


def test_a_leftover_on_the_source_does_not_wedge_a_lost_power_resync() -> None:
    """Review: the same state, and a client write before the resync reached the chunk: the
    syncing member (ahead) refused it, the head kept it pending, and with a pending version the
    resync neither pulled nor rolled back, so every resync and every retry failed."""

    async def body(c: Chain3) -> None:
        await _commit(c, 1, 2, b"two")
        await _commit(c, 2, 4, b"four")
        c.set_chain([1], version=5, syncing=(2,), waiting=(3,))
        with pytest.raises(LoomError):
            await c.write(1, 0, b"client")  # the syncing member refuses v3
        svc = c.nodes[0].service
        await Resyncer(svc, _no_report)._sync(SyncJob(1, 5, c.tid(1), c.tid(2)), await svc.routing.get())
        await c.write(1, 0, b"retry")
        # the failed write was kept as a leftover and took effect first (its outcome was unknown)
        assert c.content(1) == c.content(2) == b"retryt"
        st1, st2 = c.engine(1).get(KEY), c.engine(2).get(KEY)
        assert st1 is not None and st2 is not None and st1.commit_ver == st2.commit_ver

    run(body)


def test_syncing_member_ahead_of_a_chain_of_two_goes_back_to_the_chains_version() -> None:
    """The same with two serving members behind: taking the newer version on the last serving
    one only would leave the head behind its successor, so the syncing one goes back."""

    async def body(c: Chain3) -> None:
        await _commit(c, 1, 2, b"two")
        await _commit(c, 2, 2, b"two")
        await _commit(c, 3, 3, b"three")
        c.set_chain([1, 2], version=5, syncing=(3,))
        svc = c.nodes[1].service
        resync = Resyncer(svc, _no_report)
        await resync._sync(SyncJob(1, 5, c.tid(2), c.tid(3)), await svc.routing.get())
        assert [(c.engine(n).get(KEY).commit_ver, c.content(n)) for n in (1, 2, 3)] == [(2, b"two")] * 3  # type: ignore[union-attr]
        await c.write(1, 0, b"TWO")
        assert [c.content(n) for n in (1, 2, 3)] == [b"TWO"] * 3

    run(body)


def test_late_copy_of_a_trim_does_not_cut_a_write_that_followed_the_retried_trim() -> None:
    """A trim whose request was held up (a cut connection, a hung head) past its performer's
    claim: another meta cut the file, a client wrote it again, then the late copy emptied the
    new data. Trims are fenced by the versions the trimmer saw."""
    from loomfs.wire.storage import TRUNCATE, TruncateReq

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"x" * 300)
        seen = c.engine(1).get(KEY).commit_ver  # type: ignore[union-attr]  # what both trimmers saw
        trim = RemoveChunksReq(chain_id=1, chain_version=1, inode=KEY.inode, index_begin=KEY.index,
                               index_end=KEY.index + 1, keep_versions=True, fenced=True,
                               expect_vers=[KEY.index, seen])
        await c.client.call(c.nodes[0].address, REMOVE_CHUNKS, trim)  # the second meta's trim
        assert c.content(1) == b""
        await c.write(1, 0, b"new data")  # a write after the truncate
        with pytest.raises(LoomError) as err:  # the first meta's copy, late
            await c.client.call(c.nodes[0].address, REMOVE_CHUNKS, trim)
        assert err.value.status is Status.VERSION_MISMATCH
        cut = TruncateReq(chain_id=1, chain_version=1, chunk=CHUNK, length=2, chunk_size=1 << 16, if_ver_le=seen)
        with pytest.raises(LoomError) as err:
            await c.client.call(c.nodes[0].address, TRUNCATE, cut)
        assert err.value.status is Status.VERSION_MISMATCH
        assert [c.content(n) for n in (1, 2, 3)] == [b"new data"] * 3
        # an unlisted chunk (created after the trimmer looked) is not cut either
        unlisted = RemoveChunksReq(chain_id=1, chain_version=1, inode=KEY.inode, index_begin=0, index_end=1,
                                   keep_versions=True, fenced=True, expect_vers=[])
        with pytest.raises(LoomError):
            await c.client.call(c.nodes[0].address, REMOVE_CHUNKS, unlisted)
        assert c.content(1) == b"new data"

    run(body)


def test_a_fenced_write_applies_only_to_a_chunk_no_newer_than_seen() -> None:
    """An EC fragment repair writes the version it decoded only if the fragment was not
    written after it looked (WriteReq.if_ver_le, checked at the head, like a fenced trim):
    an overwrite that landed meanwhile is never replaced by the older bytes. A retry of an
    applied fenced write is answered as applied, not refused."""
    import crc32c

    from loomfs.wire.storage import WRITE, RequestTag, WriteReq

    def fenced(data: bytes, seen: int, request_id: int) -> WriteReq:
        return WriteReq(chain_id=1, chain_version=1, chunk=CHUNK, offset=0, length=len(data),
                        chunk_size=1 << 16, data_crc=crc32c.crc32c(data), if_ver_le=seen,
                        tag=RequestTag(client_id=77, request_id=request_id))

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"old version")
        seen = c.engine(1).get(KEY).commit_ver  # type: ignore[union-attr]  # what the repairer saw
        await c.write(1, 0, b"NEW VERSION")  # an overwrite lands meanwhile
        req = fenced(b"old version", seen, 1)
        with pytest.raises(LoomError) as err:
            await c.client.call(c.nodes[0].address, WRITE, req, payload=memoryview(b"old version"),
                                payload_crc=crc32c.crc32c(b"old version"))
        assert err.value.status is Status.VERSION_MISMATCH
        assert [c.content(n) for n in (1, 2, 3)] == [b"NEW VERSION"] * 3
        now = c.engine(1).get(KEY).commit_ver  # type: ignore[union-attr]
        ok = fenced(b"repaired!!!", now, 2)
        for _ in range(2):  # the second is a retry: deduplicated, not refused by the fence
            await c.client.call(c.nodes[0].address, WRITE, ok, payload=memoryview(b"repaired!!!"),
                                payload_crc=crc32c.crc32c(b"repaired!!!"))
        assert [c.content(n) for n in (1, 2, 3)] == [b"repaired!!!"] * 3
        bad = fenced(b"x", -5, 3)
        with pytest.raises(LoomError) as err:
            await c.client.call(c.nodes[0].address, WRITE, bad, payload=memoryview(b"x"), payload_crc=crc32c.crc32c(b"x"))
        assert err.value.status is Status.EINVAL

    run(body)


def test_a_retry_answered_from_the_tags_reports_the_version_it_made() -> None:
    """Review (session 14): a retried write answered from the chunk's tags (the head's reply
    cache lost in a restart) reported the chunk's current version, a later writer's; an EC
    repair fences its exact cut on that version, which then covered the later write."""
    import crc32c

    from loomfs.storage.dedupe import TagCache
    from loomfs.wire.storage import WRITE, RequestTag, WriteReq

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"o" * 100, tag=(5, 1))
        data = b"r" * 100
        req = WriteReq(chain_id=1, chain_version=1, chunk=CHUNK, offset=0, length=len(data), chunk_size=1 << 16,
                       data_crc=crc32c.crc32c(data), tag=RequestTag(client_id=77, request_id=1))
        first = await c.client.call(c.nodes[0].address, WRITE, req, payload=memoryview(data),
                                    payload_crc=crc32c.crc32c(data))
        await c.write(1, 0, b"N" * 300, tag=(88, 1))  # a later writer's version
        c.nodes[0].service.tags = TagCache()  # the head restarted: its reply cache is gone
        retry = await c.client.call(c.nodes[0].address, WRITE, req, payload=memoryview(data),
                                    payload_crc=crc32c.crc32c(data))
        assert retry.body.commit_ver == first.body.commit_ver < c.engine(1).get(KEY).commit_ver  # type: ignore[union-attr]
        assert c.content(1) == b"N" * 300  # not applied again

    run(body)


def test_exact_repair_keeps_an_intact_pending_version() -> None:
    """Review: the old tail committed and served v2 and went offline; the head, the only
    serving member, held v2 pending (its push to the syncing member failing), and its v1
    rotted. The exact-version repair installed v1 and dropped the pending v2, so the next
    write reused v2 for other bytes."""

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"x" * 300)
        c.engine(1).stage_write(KEY, 2, 0, b"y" * 100)
        c.engine(3).stage_write(KEY, 2, 0, b"y" * 100)
        await c.engine(3).commit(KEY, 2)
        c.set_chain([1], version=2, syncing=(2,))
        c.engine(2).fail_stages = 1000  # the push of the leftover to the syncing member fails
        c.engine(1).corrupt(KEY, 20)
        scrub = Scrubber(c.nodes[0].service, bytes_per_s=0, interval_s=3600)
        good, _ = await scrub.check_chunk(c.nodes[0].target, KEY)
        assert not good and scrub.repaired == 1
        st = c.engine(1).get(KEY)
        assert st is not None and (st.commit_ver, st.pending_ver, st.pending_length) == (1, 2, 300)
        c.engine(2).fail_stages = 0
        await c.write(1, 0, b"z" * 10)  # the leftover v2 goes first, the write is v3
        assert c.engine(1).get(KEY).commit_ver == 3  # type: ignore[union-attr]
        assert c.content(1) == c.content(2) == b"z" * 10 + b"y" * 90 + b"x" * 200

    run(body)


def test_exact_reads_are_checked() -> None:
    """Review: an exact read answered anyone, for any chain, with a serving head's uncommitted
    bytes; a fenced trim with a negative expected version cut unfenced."""
    from loomfs.wire.storage import READ, ReadReq

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"committed")
        c.engine(1).stage_write(KEY, 2, 0, b"UNCOMMITTED", full_replace=True)
        for req, status in [
            (ReadReq(chain_id=99, chain_version=1, chunk=CHUNK, target_id=c.tid(1), exact_ver=1),
             Status.UNKNOWN_TARGET),
            (ReadReq(chain_id=1, chain_version=1, chunk=CHUNK, target_id=c.tid(1), exact_ver=2),
             Status.VERSION_MISMATCH),  # a serving member's pending is never handed out
            (ReadReq(chain_id=1, chain_version=1, chunk=CHUNK, target_id=c.tid(1), exact_ver=-1),
             Status.EINVAL),
        ]:
            with pytest.raises(LoomError) as err:
                await c.client.call(c.nodes[0].address, READ, req)
            assert err.value.status is status
        trim = RemoveChunksReq(chain_id=1, chain_version=1, inode=KEY.inode, index_begin=0, index_end=1,
                               keep_versions=True, fenced=True, expect_vers=[0, -7])
        with pytest.raises(LoomError) as err:
            await c.client.call(c.nodes[0].address, REMOVE_CHUNKS, trim)
        assert err.value.status is Status.EINVAL
        assert c.content(1) == b"committed"

    run(body)


def test_one_removal_takes_many_deleted_files_down_the_chain() -> None:
    from loomfs.storage.engine.types import ChunkKey

    async def body(c: Chain3) -> None:
        for inode in (7, 8, 9):
            for n in (1, 2, 3):
                c.engine(n).stage_write(ChunkKey(inode, 0), 1, 0, b"x" * 10)
                await c.engine(n).commit(ChunkKey(inode, 0), 1)
        rm = RemoveChunksReq(chain_id=1, chain_version=1, inode=7, more_inodes=[9])
        await c.client.call(c.nodes[0].address, REMOVE_CHUNKS, rm)
        for n in (1, 2, 3):
            assert [k.inode for k in (s.key for s in c.engine(n).list_chunks())] == [8]
        bad = RemoveChunksReq(chain_id=1, chain_version=1, inode=8, more_inodes=[1] * 5000)
        with pytest.raises(LoomError) as err:
            await c.client.call(c.nodes[0].address, REMOVE_CHUNKS, bad)
        assert err.value.status is Status.EINVAL

    run(body)


def test_a_head_that_restarted_and_kept_serving_reuses_no_version() -> None:
    """Simulator seed 400189: the tail committed v2 and crashed; the head crashed too, losing
    its pending v2, and came back as the only serving member (nobody to resync from). Its next
    write was numbered v2 again with other bytes. A target left serving after a restart now
    leaves one number unused on each chunk's first update."""

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"x" * 300)  # v1 everywhere
        c.engine(3).stage_write(KEY, 2, 0, b"y" * 100)
        await c.engine(3).commit(KEY, 2)  # the tail's v2; the head's pending v2 died with it
        c.set_chain([1], version=2, waiting=(2, 3))
        c.nodes[0].service._gapped[c.tid(1)] = set()  # what the node sets when left serving after a restart
        await c.write(1, 0, b"z" * 50)
        await c.write(1, 50, b"w" * 50)
        st = c.engine(1).get(KEY)
        assert st is not None and st.commit_ver == 4  # v3 and v4: v2 still names only the tail's bytes
        c.set_chain([1, 3], version=3)  # the old tail is back behind it: its v2 is replaced whole
        await c.write(1, 100, b"q" * 10)
        assert c.content(1) == c.content(3) == b"z" * 50 + b"w" * 50 + b"q" * 10 + b"x" * 190

    run(body)
