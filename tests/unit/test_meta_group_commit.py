"""Group commit in the SQLite metastore: concurrent writers share one COMMIT, a failing
writer undoes only itself, a failed COMMIT fails its whole group, reads see committed data
only and never wait for a COMMIT in flight. No sockets, no sleeps: tasks on one loop (and
the store's commit thread, held by an event where a test needs a COMMIT in flight)."""

from __future__ import annotations

import asyncio
import errno
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from loomfs.meta.store.base import CommitFailed
from loomfs.meta.store.sqlite import SqliteStore
from loomfs.wire.types import Attr, FileType

T = TypeVar("T")
HOLD_S = 30.0  # a held COMMIT never waits longer (a failing test must not hang)


def run(aw: Awaitable[T]) -> T:
    async def main() -> T:
        return await aw

    return asyncio.run(main())


def _attr(ino: int) -> Attr:
    return Attr(inode=ino, type=FileType.FILE, mode=0o644, nlink=1, mtime_ns=1, ctime_ns=1, atime_ns=1)


@pytest.fixture(params=[False, True], ids=["inline-commit", "thread-commit"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(str(tmp_path / "meta.db"), synchronous="FULL", commit_in_thread=request.param)
    yield s
    run(s.close())


@pytest.fixture()
def threaded(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(str(tmp_path / "meta.db"), synchronous="FULL", commit_in_thread=True)
    yield s
    run(s.close())


async def _create(store: SqliteStore, ino: int, fail: bool = False) -> int:
    async with store.write() as t:
        await t.put_inode(_attr(ino))
        await t.put_dentry(1, f"f{ino}", ino, FileType.FILE)
        n = await t.next_id("files")
        if fail:
            raise ValueError(f"writer {ino} fails")
    return n


async def _present(store: SqliteStore, inos: range | list[int]) -> set[int]:
    async with store.read() as t:
        return set(await t.get_inodes(list(inos)))


def _hold_commits(store: SqliteStore) -> tuple[threading.Event, threading.Event]:
    """COMMITs wait for ``release``; ``entered`` is set when one is waiting."""
    entered, release = threading.Event(), threading.Event()
    real = store._commit_now

    def held() -> None:
        entered.set()
        assert release.wait(HOLD_S), "the test never released the COMMIT"
        real()

    store._commit_now = held  # type: ignore[method-assign]
    return entered, release


async def _until(cond: Callable[[], bool]) -> None:
    """Yield to the loop (and the commit thread) until ``cond`` holds."""
    for _ in range(100_000):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


def test_concurrent_writers_share_one_commit(store: SqliteStore) -> None:
    async def go() -> None:
        seen: list[bool] = []

        async def writer(ino: int) -> int:
            n = await _create(store, ino)
            seen.append(ino in await _present(store, [ino]))  # committed when write() returns
            return n

        ids = await asyncio.gather(*(writer(100 + i) for i in range(50)))
        assert sorted(ids) == list(range(1, 51))  # each writer saw the earlier ones' counter
        assert seen == [True] * 50
        assert (store.commits, store.groups) == (50, 1)
        assert await _present(store, range(100, 150)) == set(range(100, 150))

    run(go())
    assert "commits=50 groups=1" in repr(store)


def test_group_size_is_bounded(tmp_path: Path) -> None:
    s = SqliteStore(str(tmp_path / "m.db"), synchronous="NORMAL", group_commit_max=4)

    async def go() -> None:
        await asyncio.gather(*(_create(s, 10 + i) for i in range(10)))
        assert (s.commits, s.groups) == (10, 3)  # 4 + 4 + 2
        await s.close()

    run(go())


def test_failing_writer_undoes_only_itself(store: SqliteStore) -> None:
    async def go() -> None:
        results = await asyncio.gather(*(_create(store, 10 + i, fail=i == 4) for i in range(10)),
                                       return_exceptions=True)
        assert isinstance(results[4], ValueError) and "writer 14 fails" in str(results[4])
        assert all(isinstance(r, int) for i, r in enumerate(results) if i != 4)
        assert await _present(store, range(10, 20)) == set(range(10, 20)) - {14}
        async with store.read() as t:
            assert await t.lookup(1, "f14") is None
            assert (await t.counters())["files"] == 9
        assert (store.commits, store.groups) == (9, 1)

    run(go())


def test_a_groups_first_writer_runs_without_a_savepoint(store: SqliteStore) -> None:
    """The first writer's work is alone in the transaction: no SAVEPOINT/RELEASE for it;
    the later writers of its group each get one."""
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)

    async def go() -> None:
        await _create(store, 5)
        assert not [s for s in statements if s.startswith(("SAVEPOINT", "RELEASE"))]
        statements.clear()
        await asyncio.gather(*(_create(store, 10 + i) for i in range(3)))
        assert [s for s in statements if s.startswith(("SAVEPOINT", "RELEASE"))] == ["SAVEPOINT w", "RELEASE w"] * 2
        assert (store.commits, store.groups) == (4, 2)

    run(go())
    store._conn.set_trace_callback(None)


def test_failing_first_writer_rolls_back_alone_and_ends_its_group(store: SqliteStore) -> None:
    """The first writer of a burst fails: its work is rolled back (the whole transaction,
    which held nothing else) and the writers behind it commit in a group of their own."""
    async def go() -> None:
        results = await asyncio.gather(*(_create(store, 10 + i, fail=i == 0) for i in range(5)),
                                       return_exceptions=True)
        assert isinstance(results[0], ValueError) and "writer 10 fails" in str(results[0])
        assert sorted(r for r in results[1:] if isinstance(r, int)) == [1, 2, 3, 4]
        assert await _present(store, range(10, 15)) == set(range(11, 15))
        async with store.read() as t:
            assert await t.lookup(1, "f10") is None
            assert (await t.counters())["files"] == 4
        assert store.commits == 4 and store.groups_failed == 0
        assert await _create(store, 20) == 5  # the store goes on

    run(go())


def test_failing_writer_reports_only_after_its_group_committed(threaded: SqliteStore) -> None:
    """Its decision may have read a group-mate's uncommitted work: the error waits for it."""
    store = threaded
    entered, release = _hold_commits(store)

    async def go() -> None:
        ok = asyncio.create_task(_create(store, 1))
        bad = asyncio.create_task(_create(store, 2, fail=True))
        await _until(entered.is_set)  # the group's COMMIT is in flight
        assert not bad.done() and not ok.done()
        release.set()
        with pytest.raises(ValueError):
            await bad
        assert store.groups == 1 and await ok == 1

    run(go())


@pytest.mark.parametrize("sqlite_rolled_back", [False, True], ids=["txn-left-open", "txn-rolled-back"])
def test_failed_commit_fails_the_whole_group(store: SqliteStore, sqlite_rolled_back: bool) -> None:
    real = store._commit_now
    calls = 0

    def failing() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            if sqlite_rolled_back:  # as SQLite does itself on SQLITE_FULL / IOERR
                store._conn.execute("ROLLBACK")
            raise sqlite3.OperationalError("disk I/O error")
        real()

    store._commit_now = failing  # type: ignore[method-assign]

    async def go() -> None:
        results = await asyncio.gather(*(_create(store, 10 + i) for i in range(8)), return_exceptions=True)
        for r in results:
            assert isinstance(r, CommitFailed) and r.errno == errno.EIO, r
            assert isinstance(r.__cause__, sqlite3.OperationalError)
        assert await _present(store, range(10, 18)) == set()
        assert (store.commits, store.groups, store.groups_failed) == (0, 0, 1)
        # the store goes on: the next group commits
        assert await _create(store, 30) == 1
        assert await _present(store, [30]) == {30}
        assert (store.commits, store.groups) == (1, 1)

    run(go())


def test_reads_never_see_a_groups_uncommitted_work(store: SqliteStore) -> None:
    store._commit_now = _fail_once(store)  # type: ignore[method-assign]

    async def go() -> None:
        async def reader() -> set[int]:
            return await _present(store, [5])

        # the writer's body runs first, then the reader, both before the group's COMMIT
        w = asyncio.create_task(_create(store, 5))
        r = asyncio.create_task(reader())
        assert await r == set()
        with pytest.raises(CommitFailed):
            await w
        assert await _present(store, [5]) == set()  # rolled back: never seen, not even now
        w = asyncio.create_task(_create(store, 5))
        r = asyncio.create_task(reader())
        assert await r == set()  # not committed yet
        await w
        assert await _present(store, [5]) == {5}

    run(go())


def _fail_once(store: SqliteStore) -> Callable[[], None]:
    real = store._commit_now
    failed = False

    def commit() -> None:
        nonlocal failed
        if not failed:
            failed = True
            raise sqlite3.OperationalError("disk I/O error")
        real()

    return commit


def test_reads_go_on_and_writers_queue_while_a_commit_is_in_flight(threaded: SqliteStore) -> None:
    store = threaded
    run(_create(store, 1))
    entered, release = _hold_commits(store)

    async def go() -> None:
        first = asyncio.create_task(_create(store, 2))
        await _until(entered.is_set)
        # the COMMIT waits on its thread; reads are answered meanwhile (the committed state)
        assert await _present(store, [1, 2]) == {1}
        later = [asyncio.create_task(_create(store, 10 + i)) for i in range(5)]
        await _until(lambda: store._waiting == 5)  # queued for the next group
        release.set()
        await first
        await asyncio.gather(*later)
        assert await _present(store, [1, 2, *range(10, 15)]) == {1, 2, *range(10, 15)}
        assert store.groups == 3  # the first write, the held one, the five queued behind it

    run(go())


def test_a_body_that_loses_the_transaction_fails_its_group(store: SqliteStore) -> None:
    """SQLite drops the whole transaction on some errors (SQLITE_FULL...): every writer of the
    group fails, and no later statement of the body autocommits on its own."""

    async def go() -> None:
        async def loser() -> None:
            async with store.write() as t:
                store._conn.execute("ROLLBACK")  # what SQLite does on SQLITE_FULL
                with pytest.raises(sqlite3.OperationalError, match="rolled back"):
                    await t.put_inode(_attr(99))
                # the body swallowed the error and returns normally

        results = await asyncio.gather(_create(store, 1), loser(), _create(store, 2), return_exceptions=True)
        # the first two shared the lost group; the third came after it and opened a new one
        assert [type(r) for r in results] == [CommitFailed, CommitFailed, int]
        assert await _present(store, [1, 2, 99]) == {2}
        assert (store.commits, store.groups, store.groups_failed) == (1, 1, 1)

    run(go())


def test_cancelled_writer_still_commits(threaded: SqliteStore) -> None:
    """A writer cancelled while its group commits learns nothing (like a lost reply); its
    work commits with the group and the others are not disturbed."""
    store = threaded
    entered, release = _hold_commits(store)

    async def go() -> None:
        a = asyncio.create_task(_create(store, 1))
        b = asyncio.create_task(_create(store, 2))
        await _until(entered.is_set)
        a.cancel()
        await asyncio.wait([a])
        release.set()
        assert a.cancelled() and await b == 2
        assert await _present(store, [1, 2]) == {1, 2}

    run(go())


def test_close_commits_an_open_group(tmp_path: Path) -> None:
    path = str(tmp_path / "m.db")
    s = SqliteStore(path, synchronous="FULL")

    async def go() -> None:
        w = asyncio.create_task(_create(s, 7))
        await asyncio.sleep(0)  # its body ran; its group's COMMIT is still queued
        assert s._group is not None
        await s.close()
        assert await w == 1
        with pytest.raises(sqlite3.ProgrammingError):
            await _create(s, 8)

    run(go())
    again = SqliteStore(path)
    try:
        assert run(_present(again, [7])) == {7}
    finally:
        run(again.close())


def test_commit_thread_is_used_for_slow_commits_of_several_writers(tmp_path: Path) -> None:
    s = SqliteStore(str(tmp_path / "m.db"), synchronous="FULL")
    threads: set[str] = set()
    real = s._commit_now
    slow = False

    def commit() -> None:
        threads.add(threading.current_thread().name)
        if slow:
            s.commit_s_avg = 1.0  # as if the disk took a second per fsync
        real()

    s._commit_now = commit  # type: ignore[method-assign]

    async def go() -> None:
        nonlocal slow
        loop_thread = threading.current_thread().name
        s.commit_s_avg = 0.0
        await asyncio.gather(_create(s, 1), _create(s, 2))
        assert threads == {loop_thread}  # fast: inline on the loop
        slow = True
        await _create(s, 3)  # measured slow
        await _create(s, 4)  # but a lone writer has nothing to overlap with: inline still
        assert threads == {loop_thread}
        await asyncio.gather(_create(s, 5), _create(s, 6))  # slow, and together: the thread
        assert any(name.startswith("loomfs-meta-commit") for name in threads)
        await s.close()

    run(go())


def test_memory_store_commits_each_write() -> None:
    s = SqliteStore(":memory:")

    async def go() -> Any:
        await asyncio.gather(*(_create(s, 10 + i) for i in range(5)))
        assert await _present(s, range(10, 15)) == set(range(10, 15))
        assert (s.commits, s.groups) == (5, 5)
        await s.close()

    run(go())


def test_idle_reads_use_the_write_connection(store: SqliteStore) -> None:
    """Its page cache stays warm across COMMITs; a read-only connection is opened only for a
    read that comes while a group is open."""

    async def go() -> None:
        for i in range(5):
            await _create(store, 10 + i)
            assert await _present(store, [10 + i]) == {10 + i}
        assert store._readers == []
        w = asyncio.create_task(_create(store, 20))
        r = asyncio.create_task(_present(store, [20]))  # runs while the group is open
        assert await r == set()
        await w
        assert len(store._readers) == 1

    run(go())
