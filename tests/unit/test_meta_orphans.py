"""Orphan inodes (loomfs.meta.orphans): a file whose last name goes while a client holds it open
(a write session, or a read hold) stays, nameless, usable by inode, until its last holder lets
go (CLOSE, lease expiry, GC's sweep); then it is dropped as an unlinked file is. ManualClock,
SQLite in memory, no sockets."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator

import pytest
from test_meta_gc import FakeRemover
from test_meta_namespace import CREAT, Env

from loomfs.common.identity import Identity
from loomfs.meta.caller import acting_as
from loomfs.meta.gc import GcWorker
from loomfs.meta.store.check import check_namespace

USER = Identity(uid=1000, gid=1000)
HOLD = 1 << 62 | 12345  # a client-chosen id, as the mount picks them
CLIENT = 0x77


@pytest.fixture
def env() -> Iterator[Env]:
    e = Env()
    yield e
    e.close()


def _gc(env: Env, remover: FakeRemover, lease_s: float = 0.0) -> GcWorker:
    return GcWorker(env.store, remover, delay_s=60.0, interval_s=1.0, batch_max=64, clock=env.clock,
                    session_lease_s=lease_s)


def _orphans(env: Env) -> list[tuple[int, int]]:
    async def go() -> list[tuple[int, int]]:
        async with env.store.read() as t:
            return await t.orphan_list(0, 100)
    return env.run(go())


def _clean(env: Env, orphans: int) -> None:
    report = env.run(check_namespace(env.store))
    assert report.clean, str(report)
    assert report.orphans == orphans


def test_unlinked_while_open_for_write_stays_usable_by_inode(env: Env) -> None:
    rm = FakeRemover()
    gc = _gc(env, rm)
    o = env.run(env.ns.open("/f", CREAT))
    ino = o.attr.inode
    assert env.run(env.ns.unlink("/f")) == (ino, False)  # kept: nothing for GC yet
    assert env.err(env.ns.stat("/f")) == errno.ENOENT and env.names("/") == []
    kept = env.run(env.ns.getattr_inode(ino))
    assert kept is not None and kept.nlink == 0
    assert _orphans(env)[0][0] == ino
    assert env.run(env.ns.statfs()).files == 1  # it still exists
    _clean(env, 1)
    # by inode: length reports, chmod, truncate
    assert env.run(env.ns.sync(ino, 5000)).size == 5000
    assert env.run(env.ns.setattr("/f", inode=ino, mode=0o600)).attr.mode == 0o600
    assert env.run(env.ns.setattr("/f", inode=ino, size=100)).attr.size == 100
    env.clock.advance(120)
    assert env.run(gc.run_once()) == 0 and rm.calls == []  # held: GC leaves it
    assert env.run(env.ns.close(ino, o.session_id, 8000)) is None  # the last holder: gone now
    assert env.run(env.ns.getattr_inode(ino)) is None and _orphans(env) == []
    assert env.run(env.ns.statfs()).files == 0
    _clean(env, 0)
    assert env.run(gc.run_once()) == 1  # queued as of the unlink: its delay has passed
    assert rm.calls[0][0] == ino


def test_read_holds_keep_a_file_until_the_last_one_ends(env: Env) -> None:
    env.create("/f")
    env.run(env.ns.sync(env.run(env.ns.stat("/f")).inode, 4096))
    plain = env.run(env.ns.open("/f", os.O_RDONLY))  # no id: no hold (native readers)
    assert not plain.held and plain.session_id == 0
    a = env.run(env.ns.open("/f", os.O_RDONLY, client_id=CLIENT, session_id=HOLD))
    b = env.run(env.ns.open("/f", os.O_RDONLY, client_id=CLIENT + 1, session_id=HOLD + 1))
    assert a.held and b.held and a.session_id == 0  # a hold is no write session
    ino = a.attr.inode
    env.run(env.ns.unlink("/f"))
    assert env.run(env.ns.getattr_inode(ino)) is not None
    assert env.run(env.ns.close(ino, HOLD)) is not None  # one holder left
    assert env.run(env.ns.getattr_inode(ino)) is not None
    assert env.run(env.ns.close(ino, HOLD + 1)) is None
    assert env.run(env.ns.getattr_inode(ino)) is None
    assert env.run(env.ns.statfs()).gc_pending == 1
    _clean(env, 0)


def test_unheld_file_goes_at_once_and_a_rename_over_a_held_one_keeps_it(env: Env) -> None:
    env.create("/a")
    env.create("/b")
    env.create("/c")
    ino_a = env.run(env.ns.stat("/a")).inode
    env.run(env.ns.unlink("/a"))
    assert env.run(env.ns.getattr_inode(ino_a)) is None  # nobody held it
    held = env.run(env.ns.open("/c", os.O_RDONLY, client_id=CLIENT, session_id=HOLD))
    env.run(env.ns.rename("/b", "/c"))  # over the held file
    kept = env.run(env.ns.getattr_inode(held.attr.inode))
    assert kept is not None and kept.nlink == 0
    assert env.names("/") == ["c"]
    _clean(env, 1)
    env.run(env.ns.close(held.attr.inode, HOLD))
    _clean(env, 0)


def test_hard_links_and_inline_files(env: Env) -> None:
    env.create("/f")
    env.run(env.ns.link("/f", "/g"))
    held = env.run(env.ns.open("/f", os.O_RDONLY, client_id=CLIENT, session_id=HOLD))
    env.run(env.ns.unlink("/f"))  # a name is left: no orphan
    assert _orphans(env) == []
    env.run(env.ns.unlink("/g"))
    assert [i for i, _ in _orphans(env)] == [held.attr.inode]
    env.run(env.ns.close(held.attr.inode, HOLD))
    assert _orphans(env) == []


def test_inline_files_take_no_read_hold() -> None:
    env = Env(inline_max_bytes=4096)
    try:
        env.run(env.ns.open("/s", CREAT | os.O_TRUNC, data=b"small"))
        o = env.run(env.ns.open("/s", os.O_RDONLY, client_id=CLIENT, session_id=HOLD))
        assert not o.held and o.data == b"small"  # its content came with the reply
        env.run(env.ns.unlink("/s"))
        assert env.run(env.ns.getattr_inode(o.attr.inode)) is None
    finally:
        env.close()


def test_expired_holds_and_the_gc_sweep_drop_orphans(env: Env) -> None:
    rm = FakeRemover()
    gc = _gc(env, rm, lease_s=30.0)
    for name in ("/x", "/y", "/z"):
        env.create(name)
    x = env.run(env.ns.open("/x", os.O_RDONLY, client_id=CLIENT, session_id=HOLD))
    y = env.run(env.ns.open("/y", os.O_RDONLY, client_id=CLIENT + 1, session_id=HOLD + 1))
    z = env.run(env.ns.open("/z", os.O_RDWR, client_id=CLIENT + 2))
    for name in ("/x", "/y", "/z"):
        env.run(env.ns.unlink(name))
    assert len(_orphans(env)) == 3
    env.clock.advance(20)
    assert env.run(env.ns.renew_sessions(CLIENT + 1, [HOLD + 1])) == 1  # y's holder renews
    assert env.run(env.ns.renew_sessions(CLIENT + 2, [z.session_id])) == 1  # and z's writer
    env.clock.advance(20)  # x's hold not renewed for 40 s > the 30 s lease
    env.run(gc.expire_sessions())
    assert env.run(env.ns.getattr_inode(x.attr.inode)) is None
    assert env.run(env.ns.getattr_inode(y.attr.inode)) is not None
    assert gc.orphans_dropped_total == 1

    async def remove_client(client_id: int) -> None:  # a client's sessions removed at once
        async with env.store.write() as t:
            await t.remove_client_sessions(client_id)
    env.run(remove_client(CLIENT + 1))
    env.run(remove_client(CLIENT + 2))
    assert env.run(gc.drop_orphans()) == 2  # the sweep finds them
    assert env.run(env.ns.getattr_inode(y.attr.inode)) is None
    assert env.run(env.ns.getattr_inode(z.attr.inode)) is None
    assert "orphans_dropped=3" in repr(gc)
    _clean(env, 0)


def test_a_read_hold_grants_no_write(env: Env) -> None:
    env.create("/f")
    env.run(env.ns.setattr("/f", mode=0o644))  # root's: others read, do not write
    with acting_as(USER):
        o = env.run(env.ns.open("/f", os.O_RDONLY, client_id=CLIENT, session_id=HOLD))
        assert o.held
        assert env.err(env.ns.sync(o.attr.inode, 1 << 30)) == errno.EACCES
        assert env.run(env.ns.sessions_held(CLIENT, [(o.attr.inode, HOLD)])) == [False]
        # ending the hold with a length report is refused as a write too
        assert env.err(env.ns.close(o.attr.inode, HOLD, 1 << 30)) == errno.EACCES
    assert env.run(env.ns.stat("/f")).size == 0
