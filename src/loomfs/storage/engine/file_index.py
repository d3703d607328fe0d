"""The file engine's index: committed chunk metadata in SQLite (WAL), one row per chunk.

Why SQLite: it is crash-safe (WAL), supports the range deletes and scans that GC and resync
need, and costs one small transaction per commit. Rows: (inode, index) -> version, length,
CRC32C, which data file holds it, block CRC32Cs, request tags.

Schema migration (``user_version``; 0: no block CRCs, 1: ``blocks``, 2: ``tags``): each missing
column is added, NULL on every old row. A NULL ``tags`` is no tags (a version committed before
tags: its retries are not deduplicated, as before). A NULL ``blocks`` is unknown block CRCs (the
engine computes them on first need). Code from schema 0 cannot open a migrated index (its
``SELECT *`` sees 8 columns); code from schema 1 can (it names its columns), but its commits
write NULL tags.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 2  # 0: no block CRCs; 1: ``blocks`` column; 2: ``tags`` column
_SCHEMA = """
CREATE TABLE IF NOT EXISTS chunks (
    inode INTEGER NOT NULL, idx INTEGER NOT NULL, commit_ver INTEGER NOT NULL,
    length INTEGER NOT NULL, crc INTEGER NOT NULL, file_ver INTEGER NOT NULL,
    blocks BLOB, tags BLOB,
    PRIMARY KEY (inode, idx)) WITHOUT ROWID
"""
_COLUMNS = "inode, idx, commit_ver, length, crc, file_ver, blocks, tags"

Row = tuple[int, int, int, int, int, int, "bytes | None", "bytes | None"]  # as stored (inode unsigned)


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _unsigned(v: int) -> int:
    return v + (1 << 64) if v < 0 else v


def private_db_file(path: Path | str) -> None:
    """Create (or fix) a SQLite database file as 0600 before SQLite opens it: its -wal and
    -shm files take the database file's mode (issue 13: files at rest)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    for suffix in ("", "-wal", "-shm"):
        try:
            os.chmod(f"{path}{suffix}", 0o600)
        except FileNotFoundError:
            pass


# statements between two explicit WAL checkpoints (SQLite's automatic one runs every ~1000 pages;
# every statement here is its own transaction, so at least one page)
CHECKPOINT_STATEMENTS = 1000


class IndexSyncError(OSError):
    """A WAL checkpoint (or its fsync) failed: the index's disk state is unknown (the engine fails
    the target, engine.diskfail)."""


class ChunkIndex:
    """The index file of one target. Statements may run on the loop thread or on one helper
    thread (fsyncing commits); SQLite serialises them on the connection.

    WAL checkpoints are explicit (``wal_autocheckpoint=0``): SQLite's automatic checkpoint
    ignores its own result, so a failed fsync of the WAL inside it would pass unnoticed and a
    later durable commit's row could sit behind frames that never reached the disk (reviewer's
    R1). ``sync`` fsyncs the WAL through one long-lived fd, which sees every writeback error
    since it was opened even when SQLite's own fd saw it first (errseq)."""

    def __init__(self, path: Path, *, synchronous_full: bool):
        self.path = path
        private_db_file(path)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={'FULL' if synchronous_full else 'NORMAL'}")
        self._db.execute("PRAGMA wal_autocheckpoint=0")
        self._db.execute(_SCHEMA)
        self._migrate()
        self._statements = 0
        self._wal_fd = -1
        self._wal_lock = threading.Lock()

    def _wrote(self, *, checkpoint: bool = True) -> None:
        """Count a statement; checkpoint when due (only on the commit path, ``put``, whose
        caller fails the target on IndexSyncError)."""
        self._statements += 1
        if checkpoint and self._statements >= CHECKPOINT_STATEMENTS:
            self._statements = 0
            self.checkpoint()

    def checkpoint(self) -> None:
        """Copy the WAL into the main file now (PASSIVE); any error raises IndexSyncError."""
        try:
            self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:
            raise IndexSyncError(errno.EIO, f"index {self.path}: WAL checkpoint failed: {exc}") from exc

    def _migrate(self) -> None:
        """Add the columns an older index lacks; old rows keep NULL. Schema 0 -> 1: ``blocks``
        (block CRCs unknown, computed and stored on first need); 1 -> 2: ``tags`` (no tags)."""
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(chunks)")}
        for column, what in (("blocks", "per-block CRCs"), ("tags", "request tags")):
            if column not in columns:
                self._db.execute(f"ALTER TABLE chunks ADD COLUMN {column} BLOB")
                logger.info("index %s migrated: %s column added (%s)", self.path, column, what)
        self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def rows(self) -> Iterator[Row]:
        for inode, idx, ver, length, crc, file_ver, blocks, tags in self._db.execute(f"SELECT {_COLUMNS} FROM chunks"):
            yield _unsigned(inode), idx, ver, length, crc, file_ver, blocks, tags

    def put(self, inode: int, index: int, ver: int, length: int, crc: int, file_ver: int, blocks: bytes,
            tags: bytes) -> None:
        """The committed version of a chunk (one autocommitted statement)."""
        self._db.execute(
            f"INSERT OR REPLACE INTO chunks ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (_signed(inode), index, ver, length, crc, file_ver, blocks, tags),
        )
        self._wrote()

    def set_blocks(self, inode: int, index: int, commit_ver: int, blocks: bytes) -> None:
        """Store block CRCs computed late for a row that had none (only if still that version)."""
        self._db.execute("UPDATE chunks SET blocks = ? WHERE inode = ? AND idx = ? AND commit_ver = ?",
                         (blocks, _signed(inode), index, commit_ver))
        self._wrote(checkpoint=False)

    def delete_range(self, inode: int, index_begin: int, index_end: int) -> None:
        self._db.execute("DELETE FROM chunks WHERE inode = ? AND idx >= ? AND idx < ?",
                         (_signed(inode), index_begin, index_end))
        self._wrote(checkpoint=False)

    def sync(self, fsync: Callable[[int], None] = os.fsync) -> None:
        """Make every statement so far durable (fsync the WAL), whatever ``synchronous`` is."""
        with self._wal_lock:
            wal = Path(f"{self.path}-wal")
            try:
                ino = os.stat(wal).st_ino
            except FileNotFoundError:
                return  # checkpointed into the main file, which SQLite synced
            if self._wal_fd >= 0 and os.fstat(self._wal_fd).st_ino != ino:
                os.close(self._wal_fd)  # a new WAL file (not while this connection is open)
                self._wal_fd = -1
            if self._wal_fd < 0:
                self._wal_fd = os.open(wal, os.O_RDONLY)
            fsync(self._wal_fd)

    def close(self) -> None:
        with self._wal_lock:
            if self._wal_fd >= 0:
                os.close(self._wal_fd)
                self._wal_fd = -1
        self._db.close()
