"""A failed fsync takes the target out of service; it comes back verified and resynced.

After a failed ``fsync`` (of a data file, a directory or the index's WAL) the state of the disk
is unknown: Linux may have dropped the dirty pages and cleared the error ("fsyncgate"), so a
later fsync succeeds although the data never reached the disk, and the page cache may still
show bytes the disk does not hold. Retrying the fsync, or going on, could ack or serve data
that a power loss (or just page eviction) turns into older bytes. So a file engine that sees
one failed fsync marks itself *failed* (``FileEngine.failed``):

* it refuses every commit from then on, and the storage service refuses every request for the
  target (TARGET_NOT_SERVING: clients and predecessors retry on the chain without it);
* the node reports the target OFFLINE in its heartbeats (at once, not at the next tick) and
  mgmtd takes it out of its chain without waiting for a revocation (the node already stopped
  serving it);
* a marker file (``FSYNC_FAILED``) in the target directory makes the next process verify the
  target (on a thread, the target reported OFFLINE meanwhile; the node's other targets serve): the index files are flushed and their cached pages dropped
  before SQLite opens them (its WAL recovery must see what the disk has, not pages a process
  restart kept in the cache), then every committed chunk is flushed, its cached pages dropped,
  read back from the disk and checked against the CRC of its index row. Rows lost with the WAL
  leave older versions (resync copies the newer ones). Chunks that do not match (lost pages, a
  row ahead of its data) are kept, not removed, and handed to the scrubber once the node is
  registered: it repairs each from a replica holding that version (removing them would let a
  target that comes back as the chain's last serving member make resync delete a good copy
  elsewhere). Only then is the marker removed; a verification that cannot finish (a flush
  fails again) leaves the target failed.

``fsync_for`` is also the fault seam: with ``$LOOMFS_DISK_FAULTS`` set, an fsync fails with EIO
while a file ``FAULT_FSYNC_EIO`` exists in the target directory (integration tests create it in
one storage node's target). Without the variable it is ``os.fsync`` itself.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import crc32c

logger = logging.getLogger(__name__)

ENV_VAR = "LOOMFS_DISK_FAULTS"
FAULT_TRIGGER = "FAULT_FSYNC_EIO"
MARKER = "FSYNC_FAILED"
VERIFY_READ_BYTES = 4 << 20

Fsync = Callable[[int], None]


def fsync_for(target_dir: Path) -> Fsync:
    """The fsync a target's engine uses: ``os.fsync``, or the fault seam (see the module doc)."""
    if not os.environ.get(ENV_VAR):
        return _os_fsync
    trigger = target_dir / FAULT_TRIGGER

    def fsync(fd: int) -> None:
        if trigger.exists():
            raise OSError(errno.EIO, f"injected fsync failure ({trigger})")
        os.fsync(fd)

    return fsync


def _os_fsync(fd: int) -> None:
    os.fsync(fd)  # looked up per call (tests patch os.fsync)


def fsync_path(path: Path, fsync: Fsync = os.fsync) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        fsync(fd)
    finally:
        os.close(fd)


def write_marker(target_dir: Path, why: str) -> bool:
    """Leave ``FSYNC_FAILED`` for the next process (best effort: the disk may refuse it too)."""
    path = target_dir / MARKER
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, why.encode(errors="replace")[:4096])
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_path(target_dir)
    except OSError as exc:
        logger.critical("target %s: could not record the failed fsync in %s (%s): its data is NOT verified "
                        "if the process restarts; do not start it again before the disk is checked",
                        target_dir, path, exc)
        return False
    return True


def marker_present(target_dir: Path) -> bool:
    return (target_dir / MARKER).exists()


def clear_marker(target_dir: Path, fsync: Fsync) -> None:
    (target_dir / MARKER).unlink(missing_ok=True)
    fsync_path(target_dir, fsync)


def drop_cached(path: Path, fsync: Fsync) -> None:
    """Flush ``path`` (an error raises: the disk still fails) and drop its cached pages, so the
    next read sees what the disk holds (``POSIX_FADV_DONTNEED`` skips dirty pages: flush first)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def drop_index_cache(target_dir: Path, fsync: Fsync) -> None:
    """Before the index is opened after a failed fsync: its WAL pages may be clean in the cache
    but not on the disk (a process restart keeps them); SQLite must recover from what the disk
    has (a hole in the WAL ends recovery there: later rows are lost, and resync copies them)."""
    for name in ("index.sqlite", "index.sqlite-wal"):
        path = target_dir / name
        if path.exists():
            drop_cached(path, fsync)


def content_ok(path: Path, length: int, crc: int, buf: bytearray, fsync: Fsync) -> bool:
    """Whether the file's first ``length`` bytes, read from the disk (flushed, then its cached
    pages dropped), have CRC32C ``crc``. A failed flush raises (the disk still fails)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # clean cached pages: read the disk
        value, pos = 0, 0
        view = memoryview(buf)
        while pos < length:
            try:
                n = os.preadv(fd, [view[: min(len(buf), length - pos)]], pos)
            except OSError:
                return False
            if n <= 0:
                return False
            value = crc32c.crc32c(view[:n], value)
            pos += n
        return value == crc
    finally:
        os.close(fd)


def bad_chunks(chunks: Iterable[tuple[object, Path, int, int]], fsync: Fsync,
               stopped: Callable[[], bool] = lambda: False) -> list[object]:
    """The keys of ``(key, file, length, crc)`` whose file does not hold that content on the
    disk; a failed flush raises, and so does ``stopped()`` turning true (the engine closes)."""
    buf = bytearray(VERIFY_READ_BYTES)
    bad = []
    for key, path, length, crc in chunks:
        if stopped():
            break
        if not content_ok(path, length, crc, buf, fsync):
            bad.append(key)
    if stopped():  # also after the last one: a closed engine finishes nothing
        raise OSError(errno.ECANCELED, "verification stopped: the engine closes")
    return bad
