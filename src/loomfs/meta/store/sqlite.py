"""SQLite engine: WAL, parameterised statements, group commit.

Writes share transactions (group commit). All write transactions run on one connection, on
the event loop thread, one after another (their bodies await nothing else: the seam's rule).
The first writer of a *group* opens an outer ``BEGIN IMMEDIATE`` transaction; every later
writer of the group runs inside a ``SAVEPOINT`` of it, and one whose body raises rolls back to
its savepoint only (the first writer's work is alone in the transaction: it needs no
savepoint, and its failure rolls the transaction back and ends the group). The group's one ``COMMIT`` is issued once the loop has no more writers ready (a
callback queued behind them; at most ``group_commit_max`` writers), and every writer's
``write()`` returns, or raises, only once that COMMIT settled: a failed COMMIT fails every
writer of the group with ``CommitFailed`` (EIO); a writer whose body raised reports its own
error only if the group committed (its decision may have read a group-mate's work). With
slow COMMITs (``synchronous=FULL`` on a disk whose fsync takes a millisecond or more) and
writers that come together, the COMMIT runs on a commit thread, so the loop goes on serving
meanwhile; otherwise it runs inline (a thread hop, two cross-CPU wake-ups, would cost more
than it frees: a lone writer has nothing to overlap with). Either way the writers that arrive during a
COMMIT queue up as the next group: N concurrent creates cost about one fsync per group, not N.

Reads see committed data only. A read transaction (deferred ``BEGIN``: one snapshot for a path
walk) runs on the write connection while that holds nothing uncommitted (no group open, no
COMMIT in flight: the usual case, and its page cache is the warm one), else on a read-only
connection beside it; so it never sees a group's uncommitted work, never waits for a COMMIT,
and never sees what a failed COMMIT rolled back (WAL makes a commit visible to other
connections only after its frames are written and, with FULL, synced). ``:memory:`` stores
(tests), and files where WAL is refused, keep one connection instead: every write commits on
its own, and reads wait behind the writer.

Checkpoints (copying the WAL back into the database file, and fsyncs of both) run on a
checkpoint thread with its own connection after every ``CHECKPOINT_EVERY_WRITES`` committed
writers (``Checkpointer``), instead of inside the COMMIT that happens to pass SQLite's
automatic threshold: that COMMIT stalled the loop, reads included, for a copy of ~1000 pages
and two fsyncs (measured: COMMIT mean 44 us against a median of 26 and max 12 ms at NORMAL;
p99 14 ms, max 50-150 ms at FULL). Now a writer may wait for the last part of a checkpoint
(polling, like any busy write lock) while the loop serves everything else. The
write connection's automatic checkpoint is off (SQLite ignores its result); should the thread
fall ``BACKSTOP_WRITES`` behind, the loop checkpoints itself between groups. A checkpoint that
fails with an I/O error (a write or fsync the disk refused) fails the store for good
(``failed``): every later write raises ``CommitFailed``, and ``on_fatal`` (the meta server
exits there) is called once: after a failed fsync the kernel may have dropped the pages it
could not write, so the restart's WAL recovery must read what the disk really holds.

Nothing here waits inside SQLite while the loop stands still: another process holding the
file's write lock (meta servers sharing one file) makes a ``BEGIN IMMEDIATE`` fail at once
(the write connection has no busy timeout) and the writer polls with backoff, awaiting between
tries (``_join_group``); statements themselves take microseconds. The schema is versioned
(``PRAGMA user_version``, ``sqlite_txn.MIGRATIONS``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import Any

from loomfs.common.retry import Backoff
from loomfs.meta.store import sqlite_quick
from loomfs.meta.store.base import (
    CommitFailed,
    InlineData,
    MetaStore,
    MetaTxn,
    QuickHit,
    note_commit,
)
from loomfs.meta.store.locks_sqlite import SqliteLockTxn
from loomfs.meta.store.sqlite_checkpoint import (
    BACKSTOP_WRITES,
    CHECKPOINT_EVERY_WRITES,
    CHECKPOINT_READERS_WAIT_S,
    Checkpointer,
    fatal,
)
from loomfs.meta.store.sqlite_txn import (
    LOOKUP_PATH_MAX,
    ReadOnlyTxn,
    SqliteTxn,
    migrate_schema,
    quick_attr_row,
    quick_attr_sql,
)
from loomfs.wire.types import Attr

__all__ = ["BACKSTOP_WRITES", "CHECKPOINT_EVERY_WRITES", "ReadOnlyTxn", "SqliteStore", "SqliteTxn"]

logger = logging.getLogger(__name__)

CACHE_KIB = 256 << 10  # 256 MiB page cache per connection (a budget, allocated as used)
MMAP_BYTES = 1 << 30
GROUP_COMMIT_MAX = 512  # writers sharing one COMMIT at most
# COMMITs that take this long (an EWMA) go to the commit thread: two thread wake-ups (about
# 0.1 ms here) are then cheap next to a loop that would stand still for the whole fsync
COMMIT_THREAD_MIN_S = 0.001
READ_CONNECTIONS_MAX = 4  # read transactions open at once (more wait)
# another process holds the write lock: BEGIN IMMEDIATE is tried again after this long, doubling
BUSY_POLL_MIN_S = 0.0005
BUSY_POLL_MAX_S = 0.02
BUSY_POLL = Backoff(BUSY_POLL_MIN_S, BUSY_POLL_MAX_S)
_SYNC_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")


class _Group:
    """Writers that share one outer transaction and its COMMIT."""

    __slots__ = ("waiters", "writers", "ok", "settled", "flush_after_body")

    def __init__(self) -> None:
        # one future per writer (a cancelled writer cancels only its own): the COMMIT's outcome
        self.waiters: list[asyncio.Future[None]] = []
        self.writers = 0  # bodies run in it
        self.ok = 0  # bodies that succeeded
        self.settled = False
        self.flush_after_body = False  # its flush came while a body was suspended

    def __repr__(self) -> str:
        return f"_Group(writers={self.writers} ok={self.ok} settled={self.settled})"


def _connect(path: str, busy_timeout_s: float) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, cached_statements=256)
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
    # huge directories: keep the hot B-tree pages in memory (the default cache is 2 MiB,
    # so random lookups in a 100k-entry directory went to the OS for most pages)
    conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
    conn.execute(f"PRAGMA mmap_size = {MMAP_BYTES}")
    return conn


def _busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or "locked" in str(exc)


@MetaStore.register("sqlite")
class SqliteStore(MetaStore):
    """``commits``: write transactions committed; ``groups``: COMMITs that covered them."""

    # write transactions run one after another on one connection, in the order their writers
    # start (``loomfs.meta.ops.batch`` runs a batch's items together where this holds)
    serial_writes = True
    # never raises TxnConflict: another process's write lock is waited for (``_join_group``)
    conflicts_possible = False

    def __init__(
        self,
        path: str,
        *,
        synchronous: str = "NORMAL",
        busy_timeout_s: float = 5.0,
        group_commit_max: int = GROUP_COMMIT_MAX,
        commit_in_thread: bool | None = None,
        read_connections_max: int = READ_CONNECTIONS_MAX,
    ):
        """``commit_in_thread``: run each COMMIT on a commit thread (True), on the loop (False),
        or (None) on the thread for a group of several writers while COMMITs take
        ``COMMIT_THREAD_MIN_S`` or more on average (a slow disk under ``synchronous`` FULL);
        ``group_commit_max``: writers per COMMIT at most."""
        synchronous = synchronous.upper()
        if synchronous not in _SYNC_MODES:
            raise ValueError(f"sqlite synchronous must be one of {_SYNC_MODES}, got {synchronous!r}")
        if group_commit_max < 1 or read_connections_max < 1:
            raise ValueError("group_commit_max and read_connections_max must be at least 1")
        self.path = path
        self.url = f"sqlite:///{path}"
        self.synchronous = synchronous
        self._busy_timeout_s = busy_timeout_s
        if path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            # at rest: 0600 before SQLite opens it, so -wal/-shm follow (issue 13 item 5)
            os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(path + suffix):
                    os.chmod(path + suffix, 0o600)
        self._conn = _connect(path, busy_timeout_s)  # every write runs here
        wal = False
        if path != ":memory:":
            wal = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0].lower() == "wal"
            if not wal:
                logger.warning("metastore %s: no WAL here; one connection, no group commit", path)
        # without WAL a reader cannot read beside a writer: one connection, a commit per write
        self._single = not wal
        self._conn.execute(f"PRAGMA synchronous = {synchronous}")
        self._conn.execute("PRAGMA foreign_keys = OFF")
        self.schema_found = migrate_schema(self._conn)  # the version the file was at
        if not self._single:  # a busy write lock is waited for by polling (_join_group), never here
            self._conn.execute("PRAGMA busy_timeout = 0")
        self.checkpoints = 0  # checkpoints the checkpoint thread ran
        self.checkpoints_busy = 0  # of which could not start the WAL over (readers or a writer held on)
        self._writes_since_checkpoint = 0
        self._writes_unchecked = 0  # committed writers since the last checkpoint that completed
        self.failed: BaseException | None = None  # a checkpoint's I/O error: no more writes
        self.on_fatal: Callable[[BaseException], None] | None = None  # called once, on the loop, then
        self._checkpointer: Checkpointer | None = None
        self._holding: threading.Event | None = None  # writers wait: the checkpoint thread's RESTART
        if not self._single:
            self._conn.execute("PRAGMA wal_autocheckpoint = 0")  # the checkpoint thread's (checked) work
            self._checkpointer = Checkpointer(self, lambda: _connect(path, CHECKPOINT_READERS_WAIT_S))
            self._checkpointer.start()
        self.busy_waits = 0  # BEGIN IMMEDIATEs that found another process writing
        self.group_commit_max = group_commit_max
        self.commit_in_thread = commit_in_thread
        self.commit_s_avg = 0.0  # EWMA of COMMIT seconds
        self._executor: ThreadPoolExecutor | None = None
        # writers
        self._lock = asyncio.Lock()  # single-connection mode only: writes and reads
        self._group: _Group | None = None  # the open group: BEGIN IMMEDIATE ran, COMMIT due
        self._committing: asyncio.Future[None] | None = None  # a COMMIT on the commit thread
        self._in_body = False  # a writer's body is running (suspended, if a caller broke the rule)
        self._conn_reading = False  # a read transaction is open on the write connection
        self._gate: asyncio.Future[None] | None = None  # writers waiting for the connection
        self._waiting = 0
        # readers: idle read-only connections, and a bound on read transactions open at once
        self._readers: list[sqlite3.Connection] = []
        self._read_slots = asyncio.Semaphore(read_connections_max)
        self._closed = False
        self.commits = 0
        self.groups = 0
        self.groups_failed = 0
        self.quick_reads = 0  # stat/READ answered by ``quick_attr`` (one statement, no transaction)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SqliteStore:
        """``sqlite:////abs/path.db`` (absolute), ``sqlite:///rel.db``, ``sqlite://:memory:``."""
        rest = url.split("://", 1)[1]
        if rest in (":memory:", "/:memory:"):
            return cls(":memory:", **options)
        if not rest.startswith("/"):
            raise ValueError(f"sqlite URL must be sqlite:///path, got {url!r}")
        return cls(rest[1:], **options)

    # --- reads ----------------------------------------------------------------------------

    def read(self) -> AbstractAsyncContextManager[MetaTxn]:
        if self._single:
            return self._read_single()
        return _Reader(self)

    @asynccontextmanager
    async def _read_single(self) -> AsyncIterator[MetaTxn]:
        async with self._lock:
            c = self._conn
            c.execute("BEGIN")
            try:
                yield SqliteLockTxn(c, False)
            finally:
                c.execute("COMMIT")

    def quick_attr(self, root: int, names: Sequence[str], *, follow_last: bool, with_inline: bool = False,
                   perms: bool = False) -> QuickHit | None:
        """One statement on the write connection while it holds nothing uncommitted (the
        condition ``read`` runs there under), so it sees committed data only; a statement is
        its own snapshot. Nothing awaits here: no writer can start in between."""
        n = len(names)
        if not 0 < n <= LOOKUP_PATH_MAX or self._closed:
            return None
        if self._single:
            if self._lock.locked():
                return None
        elif self._conn_reading or self._in_body or self._group or self._committing:
            return None
        c = self._conn
        if c.in_transaction:
            return None
        row = c.execute(quick_attr_sql(n, with_inline, perms), (root, *names)).fetchone()
        self.quick_reads += 1
        return quick_attr_row(row, n, follow_last, with_inline, perms)

    def entries_in(self, txn: MetaTxn, parent: int, names: Sequence[str], *,
                   with_inline: bool) -> dict[str, tuple[Attr, InlineData | None]] | None:
        """Many names of directory ``parent`` in one statement, in ``txn`` (one of this store's
        transactions): the clean hits (``sqlite_quick.entries``); None for any other ``txn``."""
        if not isinstance(txn, SqliteTxn):
            return None
        return sqlite_quick.entries(txn._c, parent, names, with_inline)  # noqa: SLF001  (this engine's own)

    def _open_reader(self) -> sqlite3.Connection:
        c = _connect(self.path, self._busy_timeout_s)
        c.execute("PRAGMA query_only = ON")
        return c

    # --- writes ---------------------------------------------------------------------------

    def write(self) -> AbstractAsyncContextManager[MetaTxn]:
        if self._single:
            return self._write_single()
        return _Writer(self)

    @asynccontextmanager
    async def _write_single(self) -> AsyncIterator[MetaTxn]:
        async with self._lock:
            c = self._conn
            c.execute("BEGIN IMMEDIATE")
            try:
                yield SqliteLockTxn(c, True)
            except BaseException:
                c.execute("ROLLBACK")
                raise
            c.execute("COMMIT")
            self.commits += 1
            self.groups += 1
        note_commit()

    async def _wait_for_connection(self) -> None:
        if self._gate is None:
            self._gate = asyncio.get_running_loop().create_future()
        gate = self._gate
        self._waiting += 1
        try:
            await asyncio.shield(gate)
        finally:
            self._waiting -= 1

    def _open_gate(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None and not gate.done():
            gate.set_result(None)

    async def _join_group(self, loop: asyncio.AbstractEventLoop) -> _Group:
        """The open group, or a new one (``BEGIN IMMEDIATE``). Another process holding the
        file's write lock (meta servers sharing one file) makes the BEGIN fail at once (the
        write connection has no busy timeout): this writer then polls with backoff, awaiting
        between tries, so the loop goes on serving; after ``busy_timeout_s`` it raises."""
        polls = 0
        deadline: float | None = None
        while True:
            while self._in_body or self._committing is not None or self._conn_reading or self._holding:
                await self._wait_for_connection()
            self._check_open()
            group = self._group
            if group is not None:
                return group
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if not _busy(exc):
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self._busy_timeout_s
                elif now >= deadline:
                    raise
                self.busy_waits += 1
                await asyncio.sleep(BUSY_POLL.delay_s(polls))
                polls += 1
                continue
            group = self._group = _Group()
            loop.call_soon(self._flush, group)  # behind the writers ready now
            return group

    def _undo(self, group: _Group, exc: BaseException, first: bool) -> None:
        """A body raised: roll back to its savepoint; if the outer transaction is gone (SQLite
        drops it on SQLITE_FULL, IOERR...), the whole group fails. The ``first`` writer of a
        group has no savepoint (the transaction holds its work alone): it rolls the whole
        transaction back and the group ends there, settled with nothing to commit."""
        c = self._conn
        if c.in_transaction:
            try:
                if first:
                    c.execute("ROLLBACK")
                    if self._group is group:
                        self._group = None
                    self._settle(group, None)
                    return
                c.execute("ROLLBACK TO w")
                c.execute("RELEASE w")
                return
            except sqlite3.Error as undo_exc:
                exc = undo_exc
        self._lose(group, exc)

    def _release(self, group: _Group, first: bool) -> None:
        c = self._conn
        try:
            if not c.in_transaction:
                raise sqlite3.OperationalError("the write transaction was rolled back under a writer")
            if not first:
                c.execute("RELEASE w")
        except sqlite3.Error as exc:
            self._lose(group, exc)
            return
        group.ok += 1

    def _body_done(self, group: _Group) -> None:
        self._in_body = False
        if self._waiting:
            self._open_gate()
        if self._holding is not None:  # a first writer's rollback settled its group in the body
            self._held_if_idle()
        if self._group is group and (group.flush_after_body or group.writers >= self.group_commit_max):
            self._flush(group)

    def _lose(self, group: _Group, exc: BaseException) -> None:
        """The group's transaction cannot commit: roll it back and fail its writers now."""
        if self._conn.in_transaction:
            try:
                self._conn.execute("ROLLBACK")
            except sqlite3.Error as rb_exc:
                logger.error("metastore: ROLLBACK failed: %s", rb_exc)
        if self._group is group:
            self._group = None
        self._settle(group, exc)

    def _flush(self, group: _Group) -> None:
        """COMMIT the group once no writer is ready to join it."""
        if self._group is not group:
            return  # committed already, or lost
        if self._in_body:  # a body awaited something foreign: commit when it ends
            group.flush_after_body = True
            return
        if self._waiting and group.writers < self.group_commit_max and self._holding is None:
            asyncio.get_running_loop().call_soon(self._flush, group)  # let them join first
            return
        self._group = None
        threaded = self.commit_in_thread
        if threaded is None:  # slow COMMITs, and writers coming together: more will come meanwhile
            threaded = self.commit_s_avg >= COMMIT_THREAD_MIN_S and group.writers > 1
        if threaded:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="loomfs-meta-commit")
            loop = asyncio.get_running_loop()
            fut = loop.run_in_executor(self._executor, self._commit_sync)
            self._committing = fut
            fut.add_done_callback(lambda f: self._committed(group, f))
            return
        try:
            self._commit_sync()
        except Exception as exc:
            self._settle(group, exc)
        else:
            self._settle(group, None)

    def _committed(self, group: _Group, fut: asyncio.Future[None]) -> None:
        self._committing = None
        exc: BaseException | None = (
            sqlite3.OperationalError("the COMMIT was abandoned") if fut.cancelled() else fut.exception()
        )
        self._settle(group, exc)
        self._open_gate()

    def _commit_sync(self) -> None:
        """COMMIT (on the loop or the commit thread); a failure leaves no transaction open."""
        c = self._conn
        started = time.perf_counter()
        try:
            self._commit_now()
            self.commit_s_avg += (time.perf_counter() - started - self.commit_s_avg) * 0.2
        except BaseException:
            if c.in_transaction:
                try:
                    c.execute("ROLLBACK")
                except sqlite3.Error as exc:
                    logger.error("metastore: ROLLBACK after a failed COMMIT failed: %s", exc)
            raise

    def _backstop_checkpoint(self) -> None:
        """The thread fell behind: checkpoint here, on the loop, between groups."""
        try:
            self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as exc:
            if fatal(exc):
                self._fail(exc)
            else:
                logger.warning("metastore %s: backstop checkpoint failed: %s", self.path, exc)
            return
        self._writes_unchecked = 0
        self.checkpoints += 1

    def _fail(self, exc: BaseException) -> None:
        """(On the loop.) A checkpoint's I/O error: no write is acknowledged from now on."""
        if self.failed is not None:
            return
        self.failed = exc
        logger.critical("metastore %s: a checkpoint failed with an I/O error (%s): no more writes; the process "
                        "must restart so that recovery reads what the disk holds", self.path, exc)
        if self.on_fatal is not None:
            self.on_fatal(exc)

    def _hold(self, held: threading.Event) -> None:
        """(On the loop, for the checkpoint thread.) Hold new writers off; ``held`` is set once
        no group is open or committing."""
        self._holding = held
        self._held_if_idle()

    def _held_if_idle(self) -> None:
        held = self._holding
        if held is not None and self._group is None and self._committing is None and not self._in_body:
            held.set()

    def _unhold(self) -> None:
        self._holding = None
        if self._waiting:
            self._open_gate()

    def _commit_now(self) -> None:
        """The COMMIT statement itself (tests replace it to inject failures)."""
        self._conn.execute("COMMIT")

    def _settle(self, group: _Group, exc: BaseException | None) -> None:
        if group.settled:
            return
        group.settled = True
        if exc is None:
            self.commits += group.ok
            self.groups += group.ok > 0  # a group whose only writer rolled back committed nothing
            self._writes_since_checkpoint += group.ok
            self._writes_unchecked += group.ok
            if self._writes_since_checkpoint >= CHECKPOINT_EVERY_WRITES:
                self._writes_since_checkpoint = 0
                if self._checkpointer is not None:
                    self._checkpointer.wake()
                if self._writes_unchecked >= BACKSTOP_WRITES and self._group is None and self._committing is None:
                    self._backstop_checkpoint()
        else:
            self.groups_failed += 1
            logger.error("metastore: a group of %d writes failed to commit: %s", group.writers, exc)
        for fut in group.waiters:
            if fut.done():  # its writer was cancelled
                continue
            if exc is None:
                fut.set_result(None)
            else:
                fut.set_exception(exc)
        self._held_if_idle()

    async def _settled(self, done: asyncio.Future[None]) -> None:
        try:
            if not done.done():
                # the group's flush was queued before this writer's turn to go on: it usually
                # settles the group first, so the outcome is there without another loop pass
                await asyncio.sleep(0)
            await done
        except asyncio.CancelledError:
            done.cancel()  # this writer was cancelled: its work commits (or not) with the group
            raise
        except Exception as exc:
            raise CommitFailed(f"metastore commit failed: {exc}") from exc

    def _check_open(self) -> None:
        if self._closed:
            raise sqlite3.ProgrammingError("the metastore is closed")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._single:
            self._conn.close()
            return
        if self._committing is not None:
            await asyncio.wait([self._committing])  # its writers learn the outcome
        group = self._group
        if group is not None:  # writers whose bodies ran: commit them (their callers wait)
            self._group = None
            try:
                self._commit_sync()
            except Exception as exc:
                self._settle(group, exc)
            else:
                self._settle(group, None)
        self._open_gate()
        for c in self._readers:
            c.close()
        self._readers.clear()
        if self._checkpointer is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._checkpointer.stop)
        self._conn.close()
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r} commits={self.commits} groups={self.groups})"


class _Reader(AbstractAsyncContextManager[MetaTxn]):
    """``SqliteStore.read()`` with WAL: a read transaction on the write connection while that
    holds nothing uncommitted, else on a read-only connection beside it (the module
    docstring). A class, not an ``@asynccontextmanager``: no generator per transaction."""

    __slots__ = ("_store", "_c", "_own")

    def __init__(self, store: SqliteStore):
        self._store = store
        self._c: sqlite3.Connection | None = None
        self._own = False  # on a read-only connection of its own (holding a read slot)

    async def __aenter__(self) -> MetaTxn:
        store = self._store
        if not (store._conn_reading or store._in_body or store._group or store._committing):
            # the write connection holds nothing uncommitted now, and its page cache is
            # the warm one (another connection's cache is dropped at every COMMIT)
            store._check_open()
            store._conn_reading = True
            c = self._c = store._conn
            try:
                c.execute("BEGIN")
            except BaseException:
                self._end_shared(c)
                raise
            return SqliteLockTxn(c, False)
        await store._read_slots.acquire()  # a group is open or committing: read beside it
        self._own = True
        try:
            store._check_open()
            c = self._c = store._readers.pop() if store._readers else store._open_reader()
        except BaseException:
            store._read_slots.release()
            raise
        try:
            c.execute("BEGIN")
        except BaseException:
            self._end_own(c)
            raise
        return SqliteLockTxn(c, False)

    async def __aexit__(self, et: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool:
        c = self._c
        assert c is not None
        if self._own:
            self._end_own(c)
        else:
            self._end_shared(c)
        return False

    def _end_shared(self, c: sqlite3.Connection) -> None:
        store = self._store
        try:
            if c.in_transaction:
                c.execute("COMMIT")
        finally:
            store._conn_reading = False
            if store._waiting:
                store._open_gate()

    def _end_own(self, c: sqlite3.Connection) -> None:
        store = self._store
        reuse = False
        try:
            if c.in_transaction:
                c.execute("COMMIT")  # read-only: ends the snapshot
            reuse = not store._closed
        finally:
            if reuse:
                store._readers.append(c)
            else:
                c.close()
            store._read_slots.release()


class _Writer(AbstractAsyncContextManager[MetaTxn]):
    """``SqliteStore.write()`` with WAL: one writer of a group (the module docstring). Its
    body runs inside a ``SAVEPOINT`` of the group's transaction, except the group's first
    writer, whose work is alone in the transaction (a failure rolls it all back). Exiting
    waits for the group's COMMIT. A class, not an ``@asynccontextmanager``: no generator
    per transaction."""

    __slots__ = ("_store", "_group", "_done", "_first")

    def __init__(self, store: SqliteStore):
        self._store = store

    async def __aenter__(self) -> MetaTxn:
        store = self._store
        if store.failed is not None:
            raise CommitFailed(f"metastore failed: {store.failed}")
        loop = asyncio.get_running_loop()
        group = await store._join_group(loop)
        c = store._conn
        first = self._first = group.writers == 0
        if not first:
            c.execute("SAVEPOINT w")
        done: asyncio.Future[None] = loop.create_future()
        group.waiters.append(done)
        group.writers += 1
        store._in_body = True
        self._group = group
        self._done = done
        return SqliteLockTxn(c, True)

    async def __aexit__(self, et: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool:
        store = self._store
        group = self._group
        try:
            if exc is not None:
                store._undo(group, exc, self._first)
                if not isinstance(exc, Exception):  # cancelled, interrupted: no waiting
                    return False
            else:
                store._release(group, self._first)
        finally:
            store._body_done(group)
        await store._settled(self._done)
        if exc is None:
            note_commit()
        return False  # a body's error goes on (once its group committed)
