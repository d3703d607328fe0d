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
  target before it registers: every committed chunk is read back from the disk (its cached
  pages dropped first) and checked against the CRC of its index row; chunks that do not match
  (lost pages, a row ahead of its data) are removed, so the normal rejoin path (restarted ->
  waiting -> syncing) copies them from a healthy replica. Only then is the marker removed.

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


def content_ok(path: Path, length: int, crc: int, buf: bytearray) -> bool:
    """Whether the file's first ``length`` bytes, read from the disk (cached pages dropped
    first), have CRC32C ``crc``."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # clean cached pages: read the disk
        value, pos = 0, 0
        view = memoryview(buf)
        while pos < length:
            n = os.preadv(fd, [view[: min(len(buf), length - pos)]], pos)
            if n <= 0:
                return False
            value = crc32c.crc32c(view[:n], value)
            pos += n
        return value == crc
    except OSError:
        return False
    finally:
        os.close(fd)


def bad_chunks(chunks: Iterable[tuple[object, Path, int, int]]) -> list[object]:
    """The keys of ``(key, file, length, crc)`` whose file does not hold that content."""
    buf = bytearray(VERIFY_READ_BYTES)
    return [key for key, path, length, crc in chunks if not content_ok(path, length, crc, buf)]
