"""GC worker: delay, session blocking, late length reports, remover failures (ManualClock)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_meta_namespace import CREAT, Env

from loomfs.meta.gc import GcWorker
from loomfs.wire.types import Layout


@pytest.fixture
def env() -> Iterator[Env]:
    e = Env()
    yield e
    e.close()


class FakeRemover:
    def __init__(self) -> None:
        self.calls: list[tuple[int, Layout, int]] = []
        self.fail = False

    async def remove_file_chunks(self, inode: int, layout: Layout, length: int) -> None:
        if self.fail:
            raise OSError(5, "storage down")
        self.calls.append((inode, layout, length))


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
    assert rm.calls == [(ino, o.attr.layout, 3000)]
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
    assert rm.calls[0][2] == 10000  # covers what was written after the unlink


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
