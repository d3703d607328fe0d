"""Simulator seed 151227 without the simulator: a tail's torn commit whose only intact copy is
the pending version of a member that comes back as syncing. Three real StorageService
instances over the simulated network on virtual time (no sockets, no sleeps)."""

from __future__ import annotations

import asyncio

from test_replication_defects import KEY, Chain3, run

from loomfs.errors import LoomError
from loomfs.storage import planted
from loomfs.storage.resync import Resyncer, SyncJob
from loomfs.storage.scrub import Scrubber
from loomfs.wire.status import Status


async def _no_report(req: object) -> bool:
    return True


async def _torn_tail_then_head_back_as_syncing(c: Chain3) -> tuple[bytes, Scrubber, Resyncer, SyncJob]:
    """Chain [1, 2] (3 offline). The head stages v2 and forwards it; the tail commits v2 and
    crashes before its ack gets back (v2 stays the head's leftover), and its v2 comes back torn
    (fsync off: the index row persisted, part of the data did not). mgmtd lost both nodes for a
    moment, kept the tail as last serving, and takes the head back as syncing."""
    c.set_chain([1, 2], version=2)
    await c.write(1, 0, b"x" * 300)  # v1 on both
    c.engine(1).stage_write(KEY, 2, 100, b"y" * 100)  # the head's v2, forwarded ...
    c.nodes[0].service._leftovers.setdefault(c.tid(1), set()).add(KEY)  # ... its ack never came
    c.engine(2).stage_write(KEY, 2, 100, b"y" * 100)
    await c.engine(2).commit(KEY, 2)  # the tail committed (and may have served) v2
    want = c.content(2)
    c.engine(2).corrupt(KEY, 250)  # torn at the tail's crash; its recorded CRC is the good one
    c.set_chain([2], version=6, syncing=(1,), waiting=(3,))
    svc = c.nodes[1].service
    scrub = Scrubber(svc, bytes_per_s=0, interval_s=3600)
    svc.on_corrupt = scrub.check_soon
    return want, scrub, Resyncer(svc, _no_report), SyncJob(1, 6, c.tid(2), c.tid(1))


async def _resync_until_done(c: Chain3, resync: Resyncer, job: SyncJob, tries: int) -> bool:
    """The resync worker's retries: each failed attempt (a rotten source chunk) waits while the
    scrubber repairs it, as the node's next routing check would."""
    routing = await c.nodes[1].service.routing.get()
    for _ in range(tries):
        try:
            await resync._sync(job, routing)
            return True
        except LoomError as exc:
            assert exc.status is Status.CHECKSUM_MISMATCH  # refused to send the rotten copy
            await asyncio.sleep(0.5)
    return False


def test_torn_tail_is_repaired_from_the_syncing_heads_pending_copy() -> None:
    """Seed 151227: the syncing head dropped its pending v2 ("from before the resync") before
    the resync found the tail's v2 torn; nobody else had v2, the resync refused the rotten copy
    forever and the chain never got back to R replicas. The pending version is now kept
    (never committed, never pushed, never served to clients) and the scrubber repairs the
    tail from it by exact version and recorded CRC."""

    async def body(c: Chain3) -> None:
        want, scrub, resync, job = await _torn_tail_then_head_back_as_syncing(c)
        assert await c.nodes[0].service.settle_leftovers() == 0  # neither committed nor pushed
        st = c.engine(1).get(KEY)
        assert st is not None and (st.commit_ver, st.pending_ver) == (1, 2)  # kept, not committed
        assert await _resync_until_done(c, resync, job, tries=5)
        assert scrub.repaired == 1
        for n in (1, 2):
            st = c.engine(n).get(KEY)
            assert st is not None and (st.commit_ver, st.pending_ver) == (2, 0) and c.content(n) == want
            assert c.engine(n).verify(KEY) == []
        c.set_chain([2, 1], version=7, waiting=(3,))
        await c.write(2, 0, b"z" * 10)  # the chain goes on at v3
        assert c.content(1) == c.content(2) == b"z" * 10 + want[10:]
        assert c.engine(1).get(KEY).commit_ver == 3  # type: ignore[union-attr]

    run(body)


def test_torn_tail_is_lost_when_the_syncing_head_drops_its_pending_copy() -> None:
    """The same schedule with the old rule planted back: the resync never finishes."""

    async def body(c: Chain3) -> None:
        _, scrub, resync, job = await _torn_tail_then_head_back_as_syncing(c)
        await c.nodes[0].service.settle_leftovers()
        assert not await _resync_until_done(c, resync, job, tries=3)
        assert scrub.repaired == 0

    saved = set(planted.PLANTED)
    planted.plant("syncing_drops_leftover")
    try:
        run(body)
    finally:
        planted.clear()
        planted.PLANTED.update(saved)


def test_syncing_targets_old_pending_never_passes_for_the_chains_version() -> None:
    """The kept pending version may name other bytes than the chain's version of that number
    (the chain moved on while the head was away): a repair read of it is refused by its CRC,
    and the resync replaces it with the chain's version."""

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"one")
        c.engine(1).stage_write(KEY, 2, 0, b"stale")  # staged as head, then paused past the lease
        c.nodes[0].service._leftovers.setdefault(c.tid(1), set()).add(KEY)
        c.set_chain([2, 3], version=2)
        await c.write(2, 0, b"TWO")  # the chain gives v2 to other bytes
        c.set_chain([2, 3], version=3, syncing=(1,))
        assert await c.nodes[0].service.settle_leftovers() == 0
        c.engine(2).corrupt(KEY, 1)
        c.engine(3).corrupt(KEY, 1)
        scrub = Scrubber(c.nodes[2].service, bytes_per_s=0, interval_s=3600)
        good, _ = await scrub.check_chunk(c.nodes[2].target, KEY)  # node 2 rotten, node 1 stale
        assert not good and scrub.repaired == 0 and c.engine(3).verify(KEY) != []
        st = c.engine(1).get(KEY)
        assert st is not None and (st.commit_ver, st.pending_ver) == (1, 2)
        c.engine(2).corrupt(KEY, 1)  # flipped back: node 2's v2 is good again
        good, _ = await scrub.check_chunk(c.nodes[2].target, KEY)
        assert not good and scrub.repaired == 1 and c.content(3) == b"TWO"
        svc = c.nodes[2].service
        await Resyncer(svc, _no_report)._sync(SyncJob(1, 3, c.tid(3), c.tid(1)), await svc.routing.get())
        st = c.engine(1).get(KEY)
        assert st is not None and (st.commit_ver, st.pending_ver) == (2, 0) and c.content(1) == b"TWO"

    run(body)


def test_rotten_last_serving_copy_takes_the_old_tails_newer_version() -> None:
    """Sim seed 173070 (fsync profile): the last serving replica's failed disk lost the pages of
    its committed v1; nobody held v1 intact, and the old tail, back as syncing, had committed v2.
    The scrubber asked only for v1, the resync wanted to send the rotten v1 back over v2, and the
    chain never converged. A newer committed version of a member out of service is now the last
    resort (the syncing member first), unless an intact pending version of ours is newer still."""

    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"x" * 300)  # v1 everywhere
        c.engine(3).stage_write(KEY, 2, 0, b"y" * 100)
        await c.engine(3).commit(KEY, 2)  # the tail committed v2 (the head lost its pending v2)
        want = c.content(3)
        c.set_chain([1], version=5, syncing=(3,))  # node 2 (v1) is gone for good
        c.engine(1).corrupt(KEY, 150)  # the pages of v1 were lost
        scrub = Scrubber(c.nodes[0].service, bytes_per_s=0, interval_s=3600)
        good, _ = await scrub.check_chunk(c.nodes[0].target, KEY)
        assert not good and scrub.repaired == 1
        st = c.engine(1).get(KEY)
        assert st is not None and (st.commit_ver, st.pending_ver) == (2, 0) and c.content(1) == want
        svc = c.nodes[0].service
        await Resyncer(svc, _no_report)._sync(SyncJob(1, 5, c.tid(1), c.tid(3)), await svc.routing.get())
        assert c.content(3) == want and c.engine(3).get(KEY).commit_ver == 2  # type: ignore[union-attr]

    run(body)


def test_a_newer_intact_pending_version_is_not_dropped_for_an_older_newer_copy() -> None:
    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"x" * 300)
        c.engine(3).stage_write(KEY, 2, 0, b"y" * 100)
        await c.engine(3).commit(KEY, 2)
        c.engine(1).stage_write(KEY, 3, 0, b"z" * 300, full_replace=True)  # ours: pending v3, intact
        c.set_chain([1], version=5, syncing=(3,))
        c.engine(1).corrupt(KEY, 150)
        scrub = Scrubber(c.nodes[0].service, bytes_per_s=0, interval_s=3600)
        good, _ = await scrub.check_chunk(c.nodes[0].target, KEY)
        assert not good and scrub.repaired == 0
        st = c.engine(1).get(KEY)
        assert st is not None and (st.commit_ver, st.pending_ver) == (1, 3)  # the pending v3 pushes on

    run(body)
