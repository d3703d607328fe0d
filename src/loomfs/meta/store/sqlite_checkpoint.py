"""The SQLite store's checkpoint thread (``loomfs.meta.store.sqlite``).

Checkpoints (copying the WAL back into the database file, and fsyncs of both) run here, on a
thread with its own connection, after every ``CHECKPOINT_EVERY_WRITES`` committed writers,
instead of inside whichever COMMIT passes SQLite's automatic threshold on the loop: that
COMMIT stalled the loop, reads included, for a copy of ~1000 pages and two fsyncs. A PASSIVE
copy runs beside the writers; then, with the loop's writers held off (``Host._hold``: no new
group until the open one settled), a RESTART copies the rest and starts the WAL over, so it
stays small. A checkpoint that fails with an I/O error or finds the file damaged (``fatal``)
fails the store (``Host._fail``); anything else is tried again at the next wake-up.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections.abc import Callable
from typing import Protocol

logger = logging.getLogger(__name__)

# a checkpoint on the checkpoint thread after this many committed writers (a small-file create
# writes ~6-7 WAL frames: ~3,500 frames, within one 4,096-frame block of the WAL index, so a
# page lookup in the WAL stays one hash probe). The pages every create touches (counters,
# the parent's inode, the dentry and inode leaves) are copied once per checkpoint: 512 instead
# of 128 cost the checkpoint thread 16.9 instead of 19.9 us of CPU per 4 KiB create (3
# alternating pairs, medians; docs/meta-cpu.md)
CHECKPOINT_EVERY_WRITES = 512
# should the thread fall behind by this many committed writers, the loop checkpoints itself
# (between groups; its result checked like the thread's)
BACKSTOP_WRITES = 8 * CHECKPOINT_EVERY_WRITES
# a checkpoint that fails with one of these (the disk refused a write or an fsync, or the file
# is damaged) fails the store: after a failed fsync the kernel may have dropped the pages it
# could not write, so no later checkpoint can be trusted to copy what was acknowledged
# (PostgreSQL's 2018 answer). A full disk is not among them: the WAL still holds every frame,
# a later checkpoint copies them once there is room, and COMMITs meet the full disk themselves
# (CommitFailed); a restart would only meet it again.
_FATAL_CODES = (sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)
CHECKPOINT_HOLD_S = 2.0  # the checkpoint thread waits this long for the loop to hold its writers off
# with the writers held off, a RESTART waits this long for readers still on old WAL frames, then
# gives up until next time (the writers wait meanwhile: keep it short)
CHECKPOINT_READERS_WAIT_S = 0.05



class Host(Protocol):
    """What the thread needs of its store (``SqliteStore``); ``_hold``, ``_unhold`` and
    ``_fail`` are called on the store's loop."""

    path: str
    checkpoints: int
    checkpoints_busy: int
    _writes_unchecked: int

    def _hold(self, held: threading.Event) -> None: ...
    def _unhold(self) -> None: ...
    def _fail(self, exc: BaseException) -> None: ...


def fatal(exc: sqlite3.Error) -> bool:
    """A checkpoint error after which the store must not acknowledge anything more."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and (code & 0xFF) in _FATAL_CODES


class Checkpointer:
    """A thread with its own connection that checkpoints when woken (SQLite's calls release
    the GIL, so the loop goes on meanwhile). ``connect`` opens its connection (with the
    store's settings, busy timeout ``CHECKPOINT_READERS_WAIT_S``)."""

    def __init__(self, store: Host, connect: Callable[[], sqlite3.Connection]):
        self._path = store.path
        self._store = store
        self._connect = connect
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Start the thread (with the store: starting one can take tens of milliseconds on a
        busy host, better not in the middle of serving)."""
        self._thread = threading.Thread(target=self._run, name="loomfs-meta-checkpoint", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Called on the loop (a COMMIT settled): checkpoint soon."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        if self._thread is None:
            self.start()
        self._wake.set()

    def _run(self) -> None:
        conn = self._connect()
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stopping:
                    return
                try:
                    self._checkpoint(conn)
                except sqlite3.Error as exc:
                    if fatal(exc):
                        self._report(exc)
                        return
                    logger.warning("metastore %s: checkpoint failed (tried again later): %s", self._path, exc)
                except RuntimeError:  # the loop closed under us: the store is closing
                    return
        finally:
            conn.close()

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        """The bulk of the copy beside the writers (PASSIVE), then, with the loop's writers
        held off (the store's ``_hold``), a RESTART for the frames they added meanwhile,
        which starts the WAL over so it stays small (a PASSIVE alone never catches up with a
        steady stream of writers, and a RESTART beside them starves)."""
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        held = threading.Event()
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._store._hold, held)  # noqa: SLF001
        try:
            if not held.wait(CHECKPOINT_HOLD_S) or self._stopping:
                self._store.checkpoints_busy += 1
                return
            busy = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()[0]
        finally:
            self._loop.call_soon_threadsafe(self._store._unhold)  # noqa: SLF001
        self._store.checkpoints += 1
        self._store._writes_unchecked = 0  # noqa: SLF001
        if busy:
            self._store.checkpoints_busy += 1

    def _report(self, exc: sqlite3.Error) -> None:
        loop = self._loop
        try:
            if loop is not None:
                loop.call_soon_threadsafe(self._store._fail, exc)  # noqa: SLF001
        except RuntimeError:  # the loop is gone: nothing more can be acknowledged anyway
            logger.critical("metastore %s: checkpoint failed: %s", self._path, exc)

    def stop(self) -> None:
        """End the thread (a checkpoint under way finishes first)."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()

    def __repr__(self) -> str:
        return f"Checkpointer({self._path!r} running={self._thread is not None and self._thread.is_alive()})"
