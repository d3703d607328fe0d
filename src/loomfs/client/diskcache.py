"""An optional on-disk data cache: file bytes by ``DataKey`` in a local directory.

For read-mostly datasets read again every epoch, by processes that come and go (DataLoader
workers): entries are plain files, so they survive restarts, and several processes may share
one directory.

Layout under ``root`` (``root/<namespace>/`` when a namespace, e.g. the cluster, is given)::

    v1/<2 hex>/<inode>.<block>.<size>.<mtime_ns>.<ctime_ns>   one entry: header + bytes
    tmp/                                                     entries being written
    evict.lock                                               flock held by the evicting process

- **Checksummed**: an entry's header carries its key, length and the CRC32C of its bytes;
  every read checks all of them. A mismatch (a torn write after a crash, bit rot, a stray
  file) is a miss, and the entry is removed.
- **Atomic**: an entry is written to a unique temporary file in ``tmp/`` and renamed into
  place, so a reader sees a whole entry or none. Two processes storing the same key write
  the same bytes; the last rename wins. A reader whose entry an evictor removes meanwhile
  either still reads it whole (open files outlive the unlink) or misses.
- **Bounded** by ``bytes_max`` (entry files' sizes, headers included). Each process keeps an
  estimate of the directory's total (a scan at start, plus its own writes) and rescans
  whenever its estimate passes the bound or it has written ``bytes_max / 16`` since the last
  scan; a scan over the bound removes the least recently used entries (file mtimes: set on
  write, refreshed on a hit at most every ``touch_interval_s``) down to 90% of it. Only one
  process evicts at a time (``flock``). With P processes writing at once the directory may
  pass the bound by at most about P/16 of it before a scan brings it back.
- Nothing here is fsync'd: it is a cache, and the checksum catches what a crash tears.

``get`` and ``put`` are blocking (small local file I/O). Creating a file costs from tens of
microseconds to a millisecond on a busy disk, so an event loop hands its writes to
``put_later``: a bounded queue (``queue_bytes_max``; a full queue drops the write and counts
it) drained by one writer thread. An eviction scan runs on a short-lived background thread
unless ``background_evict=False`` (tests).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import secrets
import struct
import threading
import time
from collections import deque
from typing import NamedTuple

import crc32c

from loomfs.client.cache import DataKey

logger = logging.getLogger(__name__)

_MAGIC = b"LMDC"
_VERSION = 1
# magic, version, inode, size, mtime_ns, ctime_ns, block, data length, data crc32c
_HEADER = struct.Struct("<4sIQQqqQQI")
HEADER_BYTES = _HEADER.size
LOW_WATER = 0.9  # an eviction brings the total down to this share of bytes_max
SCAN_SHARE = 16  # rescan after writing bytes_max / SCAN_SHARE
TMP_STALE_S = 3600.0  # temp files older than this are a dead writer's: removed by scans
WRITER_IDLE_S = 5.0  # the writer thread ends after this long without work
_U64 = (1 << 64) - 1


class _Found(NamedTuple):
    path: str
    size: int
    mtime: float


def _namespace_dir(namespace: str) -> str:
    """A directory name for a namespace (any string, e.g. the mgmtd address)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in namespace)[:40]
    digest = hashlib.blake2b(namespace.encode(), digest_size=6).hexdigest()
    return f"{safe}-{digest}"


class DiskCache:
    def __init__(
        self,
        root: str | os.PathLike[str],
        bytes_max: int,
        *,
        namespace: str = "",
        entry_bytes_max: int = 64 << 20,
        touch_interval_s: float = 60.0,
        background_evict: bool = True,
        queue_bytes_max: int = 64 << 20,
    ):
        if bytes_max <= 0:
            raise ValueError("bytes_max must be > 0")
        base = os.fspath(root)
        self.root = os.path.join(base, _namespace_dir(namespace)) if namespace else base
        self.bytes_max = bytes_max
        self.entry_bytes_max = min(entry_bytes_max, bytes_max)
        self.touch_interval_s = touch_interval_s
        self.background_evict = background_evict
        self._data_dir = os.path.join(self.root, "v1")
        self._tmp_dir = os.path.join(self.root, "tmp")
        os.makedirs(self._data_dir, exist_ok=True)
        os.makedirs(self._tmp_dir, exist_ok=True)
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._evicting = False
        self._evict_thread: threading.Thread | None = None
        self._since_scan = 0
        self.queue_bytes_max = queue_bytes_max
        self._queue: deque[tuple[DataKey, bytes]] = deque()
        self._queued_bytes = 0  # queued or being written
        self._queue_cond = threading.Condition(threading.Lock())
        self._writer: threading.Thread | None = None
        self.dropped = 0  # put_later calls refused by a full queue
        self.hits = 0
        self.misses = 0
        self.hit_bytes = 0
        self.corrupt = 0  # entries that failed their checks (removed)
        self.writes = 0
        self.write_bytes = 0
        self.write_errors = 0
        self.rejected = 0  # too large to hold
        self.evictions = 0
        self.evicted_bytes = 0
        self.scans = 0
        self.bytes = 0  # this process's estimate of the directory's total
        self.bytes = self._scan(evict=False)

    # --- paths ------------------------------------------------------------------------

    def _path(self, key: DataKey) -> str:
        name = (f"{key.inode & _U64:x}.{key.block & _U64:x}.{key.size & _U64:x}."
                f"{key.mtime_ns & _U64:x}.{key.ctime_ns & _U64:x}")
        return os.path.join(self._data_dir, f"{(key.inode ^ key.block) & 0xFF:02x}", name)

    # --- reading ----------------------------------------------------------------------

    def get(self, key: DataKey) -> bytes | None:
        """The bytes stored under ``key``, checked; None on a miss (or a failed check)."""
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                raw = f.read()
                mtime = os.fstat(f.fileno()).st_mtime
        except FileNotFoundError:
            self._count(misses=1)
            return None
        except OSError as exc:
            logger.warning("disk cache: reading %s: %s", path, exc)
            self._count(misses=1)
            return None
        data = self._check(key, raw)
        if data is None:
            logger.warning("disk cache: %s fails its checks; removing it", path)
            self._remove(path)
            self._count(misses=1, corrupt=1)
            return None
        if self.touch_interval_s >= 0 and time.time() - mtime >= self.touch_interval_s:
            try:
                os.utime(path)  # keeps a used entry young (LRU by mtime)
            except OSError:
                pass
        self._count(hits=1, hit_bytes=len(data))
        return data

    @staticmethod
    def _check(key: DataKey, raw: bytes) -> bytes | None:
        if len(raw) < HEADER_BYTES:
            return None
        magic, version, inode, size, mtime_ns, ctime_ns, block, length, crc = _HEADER.unpack_from(raw)
        if magic != _MAGIC or version != _VERSION or length != len(raw) - HEADER_BYTES:
            return None
        if (inode, size, mtime_ns, ctime_ns, block) != (key.inode & _U64, key.size & _U64,
                                                        key.mtime_ns, key.ctime_ns, key.block & _U64):
            return None
        data = raw[HEADER_BYTES:]
        if crc32c.crc32c(data) != crc:
            return None
        return data

    # --- writing ----------------------------------------------------------------------

    def put(self, key: DataKey, data: bytes | bytearray | memoryview) -> bool:
        """Store ``data`` under ``key`` (atomically); False if too large or the write failed."""
        n = len(data)
        if n > self.entry_bytes_max:
            self._count(rejected=1)
            return False
        path = self._path(key)
        header = _HEADER.pack(_MAGIC, _VERSION, key.inode & _U64, key.size & _U64, key.mtime_ns,
                              key.ctime_ns, key.block & _U64, n, crc32c.crc32c(data))
        tmp = os.path.join(self._tmp_dir, f"{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(6)}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                if n:
                    os.writev(fd, [header, data])
                else:
                    os.write(fd, header)
                written = os.fstat(fd).st_size
            finally:
                os.close(fd)
            if written != HEADER_BYTES + n:
                raise OSError(errno.EIO, f"short write ({written} of {HEADER_BYTES + n} bytes)")
            try:
                os.replace(tmp, path)
            except FileNotFoundError:  # first entry in its shard directory
                os.makedirs(os.path.dirname(path), exist_ok=True)
                os.replace(tmp, path)
        except OSError as exc:
            logger.warning("disk cache: writing %s: %s", path, exc)
            self._remove(tmp)
            self._count(write_errors=1)
            return False
        total = HEADER_BYTES + n
        with self._lock:
            self.writes += 1
            self.write_bytes += n
            self.bytes += total
            self._since_scan += total
            due = self.bytes > self.bytes_max or self._since_scan >= self.bytes_max // SCAN_SHARE
        if due:
            self._evict_soon()
        return True

    def put_later(self, key: DataKey, data: bytes) -> bool:
        """Queue ``data`` for the writer thread; False if the queue is full or it is too large."""
        n = len(data)
        if n > self.entry_bytes_max:
            self._count(rejected=1)
            return False
        with self._queue_cond:
            if self._pid != os.getpid():  # forked: the parent's writer and queue are not ours
                self._pid, self._evicting, self._writer = os.getpid(), False, None
                self._queue.clear()
                self._queued_bytes = 0
            if self._queued_bytes + n > self.queue_bytes_max:
                self.dropped += 1
                return False
            self._queue.append((key, data))
            self._queued_bytes += n
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, name="loomfs-diskcache-write",
                                                daemon=True)
                self._writer.start()
            else:
                self._queue_cond.notify()
        return True

    def _write_loop(self) -> None:
        me = threading.current_thread()
        while True:
            with self._queue_cond:
                if not self._queue:
                    self._queue_cond.wait(WRITER_IDLE_S)
                if not self._queue or self._writer is not me:
                    if self._writer is me:
                        self._writer = None
                    self._queue_cond.notify_all()
                    return
                key, data = self._queue.popleft()
            try:
                self.put(key, data)
            finally:
                with self._queue_cond:
                    self._queued_bytes -= len(data)
                    self._queue_cond.notify_all()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every ``put_later`` so far is written; False on timeout."""
        with self._queue_cond:
            return self._queue_cond.wait_for(lambda: self._queued_bytes == 0, timeout_s)

    def discard(self, key: DataKey) -> None:
        self._remove(self._path(key))

    # --- bounding ---------------------------------------------------------------------

    def _evict_soon(self) -> None:
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's evicting thread is not here
                self._pid, self._evicting = os.getpid(), False
            if self._evicting:
                return
            self._evicting = True
        if not self.background_evict:
            self._evict_guarded()
            return
        t = threading.Thread(target=self._evict_guarded, name="loomfs-diskcache-evict", daemon=True)
        self._evict_thread = t
        t.start()

    def join_eviction(self, timeout_s: float | None = None) -> None:
        """Wait for a background eviction to finish (tests, shutdown)."""
        t = self._evict_thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout_s)

    def _evict_guarded(self) -> None:
        try:
            self.evict()
        except Exception as exc:  # a cache must never take its user down
            logger.warning("disk cache: eviction in %s failed: %s", self.root, exc)
        finally:
            with self._lock:
                self._evicting = False

    def evict(self) -> int:
        """Scan the directory and, if it is over the bound, remove the least recently used
        entries down to ``LOW_WATER`` of it (unless another process is doing so now).
        Returns the bytes removed."""
        lock_path = os.path.join(self.root, "evict.lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                with self._lock:
                    self._since_scan = 0  # another process scans; it will bring the total down
                return 0
            before = self.evicted_bytes
            self._scan(evict=True)
            return self.evicted_bytes - before
        finally:
            os.close(fd)  # releases the flock

    def _scan(self, *, evict: bool) -> int:
        found: list[_Found] = []
        total = 0
        try:
            shards = list(os.scandir(self._data_dir))
        except FileNotFoundError:
            shards = []
        for shard in shards:
            if not shard.is_dir(follow_symlinks=False):
                continue
            try:
                entries = list(os.scandir(shard.path))
            except FileNotFoundError:
                continue
            for e in entries:
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                found.append(_Found(e.path, st.st_size, st.st_mtime))
                total += st.st_size
        self._sweep_tmp()
        removed = removed_bytes = 0
        if evict and total > self.bytes_max:
            goal = int(self.bytes_max * LOW_WATER)
            found.sort(key=lambda f: f.mtime)
            for f in found:
                if total <= goal:
                    break
                if self._remove(f.path):
                    removed += 1
                    removed_bytes += f.size
                total -= f.size
            logger.debug("disk cache %s: evicted %d entries (%d bytes)", self.root, removed, removed_bytes)
        with self._lock:
            self.scans += 1
            self.evictions += removed
            self.evicted_bytes += removed_bytes
            self.bytes = total
            self._since_scan = 0
        return total

    def _sweep_tmp(self) -> None:
        cutoff = time.time() - TMP_STALE_S
        try:
            for e in os.scandir(self._tmp_dir):
                try:
                    if e.stat(follow_symlinks=False).st_mtime < cutoff:
                        os.unlink(e.path)
                except OSError:
                    pass
        except FileNotFoundError:
            pass

    @staticmethod
    def _remove(path: str) -> bool:
        try:
            os.unlink(path)
            return True
        except OSError:
            return False

    def clear(self) -> None:
        """Remove every entry (other processes' too)."""
        for shard in list(os.scandir(self._data_dir)):
            if shard.is_dir(follow_symlinks=False):
                for e in list(os.scandir(shard.path)):
                    self._remove(e.path)
        with self._lock:
            self.bytes = 0
            self._since_scan = 0

    def _count(self, *, hits: int = 0, misses: int = 0, hit_bytes: int = 0, corrupt: int = 0,
               write_errors: int = 0, rejected: int = 0) -> None:
        with self._lock:
            self.hits += hits
            self.misses += misses
            self.hit_bytes += hit_bytes
            self.corrupt += corrupt
            self.write_errors += write_errors
            self.rejected += rejected

    def __repr__(self) -> str:
        return (f"DiskCache({self.root} ~{self.bytes}/{self.bytes_max} bytes hits={self.hits} "
                f"misses={self.misses} corrupt={self.corrupt} evictions={self.evictions})")
