"""GC worker: delay, session blocking and leases, late length reports, remover failures (ManualClock)."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator

import pytest
from test_meta_namespace import CREAT, Env

from loomfs.meta.gc import GcWorker, remover_client_id
from loomfs.wire.meta import RENEW_SESSIONS_MAX
from loomfs.wire.types import Layout


@pytest.fixture
def env() -> Iterator[Env]:
    e = Env()
    yield e
    e.close()


class FakeRemover:
    def __init__(self) -> None:
        self.calls: list[tuple[int, Layout]] = []
        self.batches: list[int] = []  # files per remover call
        self.fail = False

    async def remove_files_chunks(self, files: list[tuple[int, Layout]]) -> None:
        if self.fail:
            raise OSError(5, "storage down")
        self.calls.extend(files)
        self.batches.append(len(files))


def _worker(env: Env, remover: FakeRemover, batch_max: int = 64) -> GcWorker:
    return GcWorker(env.store, remover, delay_s=60.0, interval_s=1.0, batch_max=batch_max, clock=env.clock)


def test_gc_waits_for_delay(env: Env) -> None:
    rm = FakeRemover()
    gc = _worker(env, rm)
    o = env.run(env.ns.open("/f", CREAT))
    env.run(env.ns.close(o.attr.inode, o.session_id, 3000))
    ino, queued = env.run(env.ns.unlink("/f"))
    assert queued and ino == o.attr.inode
    env.clock.advance(59)
    assert env.run(gc.run_once()) == 0 and rm.calls == []
    env.clock.advance(1)
    assert env.run(gc.run_once()) == 1
    assert rm.calls == [(ino, o.attr.layout)]
    assert env.run(env.ns.statfs()).gc_pending == 0
    assert env.run(gc.run_once()) == 0 and len(rm.calls) == 1
    assert "removed=1" in repr(gc)


def test_gc_keeps_files_open_for_write(env: Env) -> None:
    rm = FakeRemover()
    gc = _worker(env, rm)
    o = env.run(env.ns.open("/f", CREAT))
    env.run(env.ns.unlink("/f"))
    env.clock.advance(120)
    assert env.run(gc.run_once()) == 0  # still open for write
    env.run(env.ns.sync(o.attr.inode, 8192))  # writer keeps writing after the unlink
    env.run(env.ns.close(o.attr.inode, o.session_id, 10000))
    assert env.run(gc.run_once()) == 1
    assert rm.calls[0][0] == o.attr.inode  # once the writer closed (all its chunks go)


def test_gc_read_sessions_do_not_block(env: Env) -> None:
    rm = FakeRemover()
    gc = _worker(env, rm)
    env.create("/f")
    env.run(env.ns.open("/f", 0))  # read open: no session
    env.run(env.ns.unlink("/f"))
    env.clock.advance(60)
    assert env.run(gc.run_once()) == 1


def test_gc_failure_backs_off_and_retries(env: Env) -> None:
    rm = FakeRemover()
    gc = _worker(env, rm)
    env.create("/f")
    env.run(env.ns.unlink("/f"))
    env.clock.advance(60)
    rm.fail = True
    assert env.run(gc.run_once()) == 0 and gc.failures_total == 1
    rm.fail = False
    env.clock.advance(30)
    assert env.run(gc.run_once()) == 0  # backed off one delay
    env.clock.advance(30)
    assert env.run(gc.run_once()) == 1


def test_gc_batches_are_bounded(env: Env) -> None:
    rm = FakeRemover()
    gc = _worker(env, rm, batch_max=3)
    for i in range(7):
        env.create(f"/f{i}")
        env.run(env.ns.unlink(f"/f{i}"))
    env.clock.advance(60)
    assert [env.run(gc.run_once()) for _ in range(4)] == [3, 3, 1, 0]
    assert len({c[0] for c in rm.calls}) == 7
    assert max(rm.batches) > 1  # one remover call for many files


def test_rename_replace_and_truncate_paths(env: Env) -> None:
    rm = FakeRemover()
    gc = _worker(env, rm)
    env.create("/a")
    env.create("/b")
    env.run(env.ns.rename("/a", "/b"))
    env.run(env.ns.symlink("/b", "/l"))
    env.run(env.ns.unlink("/l"))  # symlinks have no data: nothing queued
    env.run(env.ns.mkdir("/d"))
    env.run(env.ns.rmdir("/d"))
    env.clock.advance(60)
    assert env.run(gc.run_once()) == 1



def _lease_worker(env: Env, remover: FakeRemover, lease_s: float = 30.0) -> GcWorker:
    return GcWorker(env.store, remover, delay_s=60.0, session_lease_s=lease_s, clock=env.clock)


def test_remover_client_id_is_fresh_for_every_process() -> None:
    # storage dedupes (client id, request id); request ids restart with every meta process,
    # so a client id that survived a restart made the first removals no-ops (orphan chunks)
    ids = {remover_client_id(101) for _ in range(50)}
    assert len(ids) == 50
    assert all(i >> 62 == 1 and i & 0xFFFF == 101 for i in ids)
    assert remover_client_id(5, random.Random(1)) == remover_client_id(5, random.Random(1))


def test_gc_expires_write_sessions_not_renewed(env: Env) -> None:
    # an OPEN committed whose reply was lost (meta killed), a CLOSE that never arrived, a
    # crashed client: the session must not keep the unlinked file's chunks forever
    rm = FakeRemover()
    gc = _lease_worker(env, rm)
    o = env.run(env.ns.open("/f", CREAT, client_id=42))
    env.run(env.ns.unlink("/f"))
    env.clock.advance(59)
    assert env.run(gc.run_once()) == 0 and gc.sessions_expired_total == 1  # gone; entry not due yet
    env.clock.advance(1)
    assert env.run(gc.run_once()) == 1
    assert rm.calls[0][0] == o.attr.inode
    assert env.run(env.ns.close(o.attr.inode, o.session_id, 5)) is None  # a late CLOSE is harmless
    assert "sessions_expired=1" in repr(gc)


def test_gc_keeps_renewed_write_sessions(env: Env) -> None:
    rm = FakeRemover()
    gc = _lease_worker(env, rm)
    o = env.run(env.ns.open("/f", CREAT, client_id=42))
    env.run(env.ns.unlink("/f"))
    for _ in range(12):  # a writer that renews every 10 s keeps its unlinked file for 2 min
        env.clock.advance(10)
        assert env.run(env.ns.renew_sessions(7, [o.session_id])) == 0  # not client 7's session
        assert env.run(env.ns.renew_sessions(42, [o.session_id])) == 1
        assert env.run(gc.run_once()) == 0
    assert rm.calls == [] and gc.sessions_expired_total == 0
    env.clock.advance(31)  # the writer is gone
    assert env.run(gc.run_once()) == 1 and gc.sessions_expired_total == 1


def test_retried_open_after_lost_reply_gets_the_same_inode(env: Env) -> None:
    # meta committed the first OPEN(O_CREAT|O_TRUNC) but its reply was lost; the client's
    # retry must find the same file (not a second inode), and the first attempt's session,
    # which nobody renews, expires so the file is collected once unlinked
    rm = FakeRemover()
    gc = _lease_worker(env, rm)
    lost = env.run(env.ns.open("/f", CREAT | os.O_TRUNC, client_id=42))
    o = env.run(env.ns.open("/f", CREAT | os.O_TRUNC, client_id=42))
    assert o.attr.inode == lost.attr.inode and o.session_id != lost.session_id
    env.run(env.ns.close(o.attr.inode, o.session_id, 100, trunc_epoch=o.trunc_epoch))
    env.run(env.ns.unlink("/f"))
    env.clock.advance(20)
    assert env.run(env.ns.renew_sessions(42, [o.session_id])) == 0  # the client holds nothing open
    env.clock.advance(45)
    assert env.run(gc.run_once()) == 1 and rm.calls == [(o.attr.inode, o.attr.layout)]


def test_sessions_get_a_lease_after_gc_start(env: Env) -> None:
    # meta was down longer than a lease: its clients get one lease to renew before expiry
    rm = FakeRemover()
    o = env.run(env.ns.open("/f", CREAT, client_id=42))
    env.run(env.ns.unlink("/f"))
    env.clock.advance(300)
    gc = _lease_worker(env, rm)  # the restarted meta
    assert env.run(gc.run_once()) == 0 and gc.sessions_expired_total == 0
    env.clock.advance(20)
    env.run(env.ns.renew_sessions(42, [o.session_id]))
    env.clock.advance(20)
    assert env.run(gc.run_once()) == 0 and gc.sessions_expired_total == 0
    env.clock.advance(31)
    assert env.run(gc.run_once()) == 1


def test_no_lease_means_sessions_never_expire(env: Env) -> None:
    rm = FakeRemover()
    gc = _lease_worker(env, rm, lease_s=0)
    env.run(env.ns.open("/f", CREAT, client_id=42))
    env.run(env.ns.unlink("/f"))
    env.clock.advance(10_000)
    assert env.run(gc.run_once()) == 0 and gc.sessions_expired_total == 0


def test_renewal_is_bounded(env: Env) -> None:
    with pytest.raises(OSError):
        env.run(env.ns.renew_sessions(42, list(range(RENEW_SESSIONS_MAX + 1))))
    assert env.run(env.ns.renew_sessions(42, [])) == 0


def test_store_session_renew_and_expire(env: Env) -> None:
    async def go() -> None:
        async with env.store.write() as t:
            await t.add_session(7, 1, 100, 10)
            await t.add_session(7, 2, 101, 10)
            await t.add_session(8, 3, 100, 10)
            assert await t.renew_sessions(100, [1, 2, 3, 99], 50) == 2  # session 2 is client 101's
        async with env.store.write() as t:
            assert await t.expire_sessions(20, 10) == [(7, 2, 101)]
            assert await t.expire_sessions(20, 10) == []
            assert sorted(await t.expire_sessions(51, 1) + await t.expire_sessions(51, 1)) == [(7, 1, 100), (8, 3, 100)]
            assert not await t.has_session(7) and not await t.has_session(8)

    env.run(go())
