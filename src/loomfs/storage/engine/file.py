"""File-backed ChunkEngine: one file per chunk version, metadata in SQLite (WAL).

Layout of a target directory::

    index.sqlite                         committed metadata: (inode, index) -> version, length,
                                         CRC32C, which data file holds it, block CRC32Cs,
                                         request tags
    chunks/<inode & 0xff>/<inode>.<index>.<file_ver>   chunk data (hex names)

The index (``file_index``: SQLite, WAL, and its schema migrations) holds committed metadata;
the I/O policy (O_DIRECT, offloading to threads) is in ``file_io``. Pending updates live only in memory plus
a data file, so a crash drops them (the chain resyncs); start-up deletes every data file the
index does not name.

Copy-on-write: a pending update that rewrites committed bytes goes to a new file (a full
chunk is written directly; a partial overwrite first copies the committed file with
``os.copy_file_range``), so the committed file stays readable and a crash leaves the old or
the new version. Appends and zero-extensions go in place, past the committed length, where no
reader looks: the committed bytes are never touched (but the old short last block, whose CRC
they continue, is read back and checked first: ``blocks.joined_block``). CRC32C is carried forward for full
writes (the client's CRC) and appends (CRC continuation); only a mid-chunk overwrite or a
shrinking truncate re-reads the new content (one pass, which also checks the bytes it kept, see
below).

Block CRCs (one CRC32C per 64 KiB block, ``blocks`` BLOB of little-endian uint32s in the index
row, kept in memory with the rest of the row: 4 bytes per 64 KiB, 1/16384 of the data). Each
update recomputes only the blocks it changed: a whole write hashes its data (for big chunks on a
helper thread while this thread is in the kernel writing), an append continues the old last
block's CRC over the new bytes, an overwrite hashes the blocks its data covers and reads back
only the (at most two) edge blocks from the new file, a shrinking truncate re-reads only the new
last block; every other block keeps its stored CRC. An overwrite or a shrinking truncate keeps
committed bytes, so it must not bless bit rot in them (see ``base``): before copying it reads
and checks the old content of the (at most two) blocks it changes only in part, and the one
pass that reads the new file back for its whole-chunk CRC compares that CRC with the one its
block CRCs add up to (``crc_of_blocks``: joined, no byte read again), so a block copied with rot
in it fails the stage (CHECKSUM_MISMATCH naming the block, found by a second pass on this
failure path; the new file is dropped). A partial read of committed data reads the blocks it
touches whole (the inner ones
straight into the caller's buffer, the edge ones through a reused scratch buffer) and checks
them; whole-chunk reads are not hashed here (the client checks the whole-chunk CRC).

Request tags (see ``base``): the committed version's, packed (``tags`` BLOB of little-endian u64
(client, request, version) triples, at most ``TAGS_MAX``), in the same row as its length and
CRCs, so ``commit`` writes them in its one ``INSERT OR REPLACE`` (no extra statement or fsync).
In memory they stay packed (24 bytes a tag) and are decoded by ``get``. A pending update's tags
live in memory only, like the rest of it: a crash drops them.

Modules: ``file_rows`` (what is kept per chunk), ``file_fds`` (fd caches), ``file_crc`` (block
CRC scans, checks and checked reads), ``file_index`` (the SQLite index), ``file_io`` (I/O
policy), ``durable`` (durable commits: early data flushes and group commit).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import sqlite3
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from heapq import merge
from itertools import islice
from pathlib import Path

import crc32c

from loomfs.errors import StatusError
from loomfs.storage.engine.base import ChunkEngine
from loomfs.storage.engine.blocks import (
    bad_blocks,
    block_count,
    block_crcs_of,
    check_range,
    check_stage_version,
    crc_zeros,
    extend_blocks,
    joined_block,
    kept_blocks,
    missing_chunk,
    no_pending,
    restage_blocks,
    unpack_blocks,
)
from loomfs.storage.engine.chunkmap import ChunkMap
from loomfs.storage.engine.diskfail import (
    Fsync,
    bad_chunks,
    clear_marker,
    drop_index_cache,
    fsync_for,
    fsync_path,
    marker_present,
    write_marker,
)
from loomfs.storage.engine.durable import DurableCommits
from loomfs.storage.engine.file_crc import BlockChecks
from loomfs.storage.engine.file_index import ChunkIndex, IndexSyncError
from loomfs.storage.engine.file_io import (
    DIRECT_ALIGN_BYTES,
    DIRECT_READ_MIN_BYTES,
    DIRECT_WRITE_MIN_BYTES,
    IO_THREADS,
    OFFLOAD_MIN_BYTES,
    SCRATCH_BYTES,
    _direct_ok,
    _pread,
    _pwrite_at,
)
from loomfs.storage.engine.file_rows import Meta, Pending
from loomfs.storage.engine.tags import decode_tags, encode_tags, tags_ok
from loomfs.storage.engine.types import (
    INDEX_END,
    ChunkKey,
    ChunkState,
    ChunkTag,
    Usage,
)

logger = logging.getLogger(__name__)

MARKER_WAIT_S = 30.0  # close() waits this long for the FSYNC_FAILED marker to be written
VERIFYING = "verifying after a failed fsync"  # ``failed`` while the check runs (out of service)

class FileEngine(BlockChecks, ChunkEngine):
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fsync_on_commit: bool = False,
        fd_cache_max: int = 256,
        direct_io: bool = True,
        fsync: Fsync | None = None,
    ):
        """``fsync``: what flushes a file (default ``diskfail.fsync_for``: ``os.fsync`` but
        for injected faults); one failure fails the target (``diskfail``)."""
        self.path = Path(path)
        self._fsync = fsync or fsync_for(self.path)
        self.failed = ""
        # Whole-chunk writes and aligned reads bypass the page cache (as 3FS does): on this VM
        # fresh page-cache pages cost 3-5 us each, so buffered writes of new data crawl at
        # ~0.4 GB/s while O_DIRECT moves ~1.5 GB/s. Falls back to buffered I/O when the file
        # system refuses O_DIRECT or a buffer is not aligned.
        self.direct_io = direct_io and hasattr(os, "O_DIRECT")
        self._direct_fds: OrderedDict[tuple[ChunkKey, int], int] = OrderedDict()
        self._io: ThreadPoolExecutor | None = None
        self.fsync_on_commit = fsync_on_commit
        self.fd_cache_max = fd_cache_max
        self._chunks_dir = self.path / "chunks"
        self._chunks_dir.mkdir(parents=True, exist_ok=True)
        for d in (self.path, self._chunks_dir):  # data at rest: only the service's user (issue 13)
            os.chmod(d, 0o700)
        self.suspect_chunks: list[ChunkKey] = []  # failed verification: the scrubber repairs them
        failed_before = marker_present(self.path)
        if failed_before:
            try:
                drop_index_cache(self.path, self._fsync)
            except OSError as exc:
                self._fail(exc)
        self._index = ChunkIndex(self.path / "index.sqlite", synchronous_full=fsync_on_commit)
        self._meta: ChunkMap[Meta] = ChunkMap()
        self._pending: dict[ChunkKey, Pending] = {}
        self._fds: OrderedDict[tuple[ChunkKey, int], int] = OrderedDict()
        self._scratch = bytearray(SCRATCH_BYTES)  # loop-thread only; pool threads have their own
        self._tls = threading.local()
        self._hasher: ThreadPoolExecutor | None = None
        self._hasher_lock = threading.Lock()
        self._used_bytes = 0
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="chunk-fsync") if fsync_on_commit else None
        self._durable = DurableCommits(self._index, self._chunks_dir, fsync=self._fsync,
                                       on_error=self._fail)  # when not every commit fsyncs
        self._load()
        self._stop_verify = threading.Event()
        self._verifier: threading.Thread | None = None
        if failed_before and not self.failed:
            # out of service (reported OFFLINE) until verified, on a thread: a big target takes
            # long to read back, and the node's other targets need not wait (reviewer's R7)
            self.failed = VERIFYING
            self._verifier = threading.Thread(target=self._verify_after_failure, name="verify-after-fsync-failure",
                                              daemon=True)
            self._verifier.start()

    # ---- start-up -----------------------------------------------------------------------
    def _load(self) -> None:
        unknown = bad_tags = 0
        for inode, idx, ver, length, crc, file_ver, blocks, tags in self._index.rows():
            if blocks is not None and len(blocks) != 4 * block_count(length):
                blocks = None  # malformed: recompute (and check the whole-chunk CRC) on first need
            unknown += blocks is None
            if tags is None:
                tags = b""  # committed before tags
            elif not tags_ok(tags):
                tags, bad_tags = b"", bad_tags + 1  # malformed: no dedupe for this version
            self._meta.put(inode, idx, Meta(ver, length, crc, file_ver, blocks, tags))
            self._used_bytes += length
        orphans = 0
        for bucket in self._chunks_dir.iterdir():
            for f in bucket.iterdir():
                try:
                    inode_s, idx_s, ver_s = f.name.split(".")
                    m = self._meta.get(int(inode_s, 16), int(idx_s, 16))
                    keep = m is not None and m.file_ver == int(ver_s, 16)
                except ValueError:
                    keep = False
                if not keep:
                    f.unlink()
                    orphans += 1
        logger.info("engine %s: %d chunks (%d without block CRCs yet), %d bytes, %d orphan files removed",
                    self.path, len(self._meta), unknown, self._used_bytes, orphans)
        if bad_tags:
            logger.warning("engine %s: %d index rows had malformed request tags (dropped)", self.path, bad_tags)

    def _verify_after_failure(self) -> None:
        """The last process saw an fsync fail here (``diskfail``); runs on its own thread while
        the target is out of service (nothing else touches the index or the files meanwhile):
        every committed chunk whose file does not hold its row's content on the disk is kept as
        a suspect (the node hands it to the scrubber), then the index is checkpointed, the
        marker cleared and the target serves again (the node's next heartbeat says so; it
        rejoins through resync). A flush that fails again leaves the target failed."""
        chunks = [(key, self._file(key, m.file_ver), m.length, m.crc) for key, m in self._meta.items()]
        try:
            bad = bad_chunks(chunks, self._fsync, self._stop_verify.is_set)
            fsync_path(self._chunks_dir, self._fsync)
            self._index.checkpoint()
            self._index.sync(self._fsync)
            clear_marker(self.path, self._fsync)
        except (OSError, sqlite3.Error) as exc:
            self.failed = f"verification after a failed fsync failed: {exc}"
            logger.critical("engine %s: %s: the target stays out of service", self.path, self.failed)
            return
        self.suspect_chunks = [k for k in bad if isinstance(k, ChunkKey)]
        logger.warning("engine %s: verified %d chunks after a failed fsync: %d did not match their index row "
                       "(kept for the scrubber to repair from another replica)", self.path, len(chunks), len(bad))
        self.verified = True  # before serving again: the node's next heartbeat carries both
        self.failed = ""

    def start_verification(self) -> None:
        """mgmtd saw this target fail and this process did not verify it (the FSYNC_FAILED
        marker never reached the failing disk: reviewer's R5). As the marker would have made it
        at start-up: out of service (VERIFYING), the index closed, its cached pages dropped and
        reopened (SQLite's recovery reads what the disk holds), then every chunk checked, on a
        thread. Called at registration, before the target served anything in this process."""
        if self.failed or self.verified or (self._verifier is not None and self._verifier.is_alive()):
            return  # failed (or verifying) in this process, or verified already
        self.failed = VERIFYING
        for key in list(self._pending):
            self.abort(key)
        self._close_fds()
        logger.warning("engine %s: mgmtd saw this target fail and it was not verified since: verifying now",
                       self.path)
        self._stop_verify.clear()
        self._verifier = threading.Thread(target=self._reopen_and_verify, name="verify-for-mgmtd", daemon=True)
        self._verifier.start()

    def _reopen_and_verify(self) -> None:
        try:
            self._durable.close()
            self._index.close()
            drop_index_cache(self.path, self._fsync)
            self._index = ChunkIndex(self.path / "index.sqlite", synchronous_full=self.fsync_on_commit)
            self._durable = DurableCommits(self._index, self._chunks_dir, fsync=self._fsync, on_error=self._fail)
            self._meta = ChunkMap()
            self._used_bytes = 0
            self._load()
        except (OSError, sqlite3.Error) as exc:
            self.failed = f"verification for mgmtd failed: {exc}"
            logger.critical("engine %s: %s: the target stays out of service", self.path, self.failed)
            return
        self._verify_after_failure()

    def wait_verified(self, timeout_s: float | None = None) -> bool:
        """Wait for a verification after a failed fsync (if one runs); True once it ended."""
        if self._verifier is not None:
            self._verifier.join(timeout_s)
            return not self._verifier.is_alive()
        return True

    def _fail(self, exc: BaseException) -> None:
        """A flush failed: the disk state is unknown. Out of service from now on (any thread)."""
        if self.failed:
            return
        self.failed = f"fsync failed: {exc}"
        logger.critical("engine %s: %s: the target stops serving and leaves its chain; it comes back only "
                        "verified and resynced (restart its storage process once the disk is checked)",
                        self.path, self.failed)
        if self.on_failed is not None:  # first: the node heartbeats it OFFLINE at once
            self.on_failed(self.failed)
        # the marker on its own thread: an fsync on the failing disk may hang, and this may run
        # on the event loop (heartbeats must go on); close() waits for it
        self._marker = threading.Thread(target=write_marker, args=(self.path, self.failed),
                                        name="fsync-failed-marker", daemon=True)
        self._marker.start()

    def _check_failed(self) -> None:
        if self.failed:
            raise OSError(errno.EIO, f"target at {self.path} is out of service: {self.failed}")

    # ---- files --------------------------------------------------------------------------
    def _create(self, key: ChunkKey, file_ver: int) -> int:
        p = self._file(key, file_ver)
        try:
            return os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        except FileNotFoundError:
            p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._durable.new_dirs.add(p.parent)  # a durable commit in it syncs chunks/ too
            return os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)

    def _copy(self, src: int, dst: int, count: int) -> None:
        pos = 0
        while pos < count:
            try:
                n = os.copy_file_range(src, dst, count - pos, pos, pos)
            except OSError:  # e.g. EXDEV/ENOSYS on odd file systems: copy by hand
                n = os.preadv(src, [memoryview(self._scratch)[: min(SCRATCH_BYTES, count - pos)]], pos)
                os.pwrite(dst, memoryview(self._scratch)[:n], pos)
            if n <= 0:
                break
            pos += n

    # ---- reads --------------------------------------------------------------------------
    def _m(self, key: ChunkKey) -> Meta | None:
        return self._meta.get(key.inode, key.index)

    def get(self, key: ChunkKey) -> ChunkState | None:
        m, p = self._m(key), self._pending.get(key)
        if m is None and p is None:
            return None
        return ChunkState(
            key=key,
            commit_ver=m.commit_ver if m else 0,
            length=m.length if m else 0,
            crc=m.crc if m else 0,
            pending_ver=p.ver if p else 0,
            pending_length=p.length if p else 0,
            pending_crc=p.crc if p else 0,
            tags=decode_tags(m.tags) if m else (),
            pending_tags=decode_tags(p.tags) if p else (),
        )

    def read(self, key: ChunkKey, offset: int, into: memoryview, *, pending: bool = False) -> int:
        check_range(offset, len(into))
        if pending:
            p = self._pending.get(key)
            if p is None:
                raise no_pending(key, 0)
            want = min(len(into), p.length - offset)
            if want > 0:
                _pread(p.fd, into[:want], offset)
            return max(0, want)
        m = self._m(key)
        if m is None:
            raise missing_chunk(key)
        want = min(len(into), m.length - offset)
        if want <= 0:
            return 0
        fd = self._fd(key, m.file_ver)

        def direct_fd() -> int:
            return self._direct_fd_or_none(key, m.file_ver)

        if offset == 0 and want == m.length:  # whole chunk: the reader checks the whole CRC
            self._fill(fd, direct_fd, into[:want], 0)
        else:
            blocks = self._known_blocks(key, m)
            self._read_checked(key, fd, direct_fd, into[:want], offset, m.length, blocks, memoryview(self._scratch))
        return want

    def block_crcs(self, key: ChunkKey, *, pending: bool = False) -> list[int]:
        if pending:
            p = self._pending.get(key)
            if p is None:
                raise no_pending(key, 0)
            return unpack_blocks(p.blocks)
        m = self._m(key)
        if m is None:
            raise missing_chunk(key)
        return unpack_blocks(self._known_blocks(key, m))

    def verify(self, key: ChunkKey) -> list[int]:
        """Re-read the committed file (page cache, 1 MiB at a time) and compare every block."""
        m = self._m(key)
        if m is None:
            raise missing_chunk(key)
        if m.blocks is None:
            try:
                self._known_blocks(key, m)
            except StatusError:
                return list(range(block_count(m.length)))  # bad, but no block CRCs to say where
            return []
        computed, _ = self._scan_blocks(self._fd(key, m.file_ver), m.length, whole=False)
        return bad_blocks(m.blocks, computed)

    # ---- updates ------------------------------------------------------------------------
    def _begin(self, key: ChunkKey, version: int) -> Meta | None:
        check_stage_version(self.get(key), key, version)
        self.abort(key)
        return self._m(key)

    def _new_tags(self, key: ChunkKey, tags: tuple[ChunkTag, ...] | None) -> bytes:
        """The packed tags a staged version carries (checked before anything changes)."""
        if tags is not None:
            return encode_tags(tags)
        m = self._m(key)
        return m.tags if m is not None else b""

    def _stage(self, key: ChunkKey, p: Pending) -> ChunkState:
        self._pending[key] = p
        st = self.get(key)
        assert st is not None
        return st

    def stage_write(
        self,
        key: ChunkKey,
        version: int,
        offset: int,
        data: memoryview | bytes,
        *,
        data_crc: int | None = None,
        full_replace: bool = False,
        tags: tuple[ChunkTag, ...] | None = None,
    ) -> ChunkState:
        check_range(offset, len(data))
        packed = self._new_tags(key, tags)
        m = self._begin(key, version)
        n = len(data)
        committed_len = m.length if m else 0
        if full_replace or (offset == 0 and n >= committed_len):
            fd = self._create(key, version)
            try:
                blocks = self._write_whole(key, version, fd, data)
            except BaseException:
                self._drop_new(key, version, fd)
                raise
            crc = data_crc if data_crc is not None else crc32c.crc32c(data)
            return self._stage(key, Pending(version, n, crc, version, fd, False, blocks, packed))
        if m is not None and offset >= committed_len:  # append (maybe past a gap), in place
            old_blocks = self._known_blocks(key, m)
            self._check_old_blocks(key, m, old_blocks, joined_block(committed_len), version)
            fd = os.open(self._file(key, m.file_ver), os.O_RDWR)
            try:
                if offset > committed_len:
                    os.ftruncate(fd, committed_len)  # the gap must read as zeros
                _pwrite_at(fd, data, offset)
            except BaseException:
                os.close(fd)
                raise
            crc = crc32c.crc32c(data, crc_zeros(offset - committed_len, m.crc))
            blocks = extend_blocks(old_blocks, committed_len, offset + n, data, offset)
            return self._stage(key, Pending(version, offset + n, crc, m.file_ver, fd, True, blocks, packed))
        old_blocks = self._known_blocks(key, m) if m is not None else b""
        kept, part = kept_blocks(committed_len, offset, offset + n)
        if m is not None:  # the old bytes of the blocks it changes in part: checked before copying
            self._check_old_blocks(key, m, old_blocks, part, version)
        fd = self._create(key, version)
        try:
            if m is None:  # a new chunk written past offset 0: zeros before
                _pwrite_at(fd, data, offset)
                length = offset + n
                crc = crc32c.crc32c(data, crc_zeros(offset))
                blocks = extend_blocks(b"", 0, length, data, offset)
            else:  # overwrite inside the committed bytes: copy-on-write, then one checking pass
                self._copy(self._fd(key, m.file_ver), fd, committed_len)
                os.pwrite(fd, data, offset)
                length = max(committed_len, offset + n)
                view = memoryview(data)

                def crc_of(i: int, start: int, end: int) -> int:
                    if offset <= start and end <= offset + n:
                        return crc32c.crc32c(view[start - offset : end - offset])
                    return self._crc_range(fd, start, end)  # an edge block (its old bytes checked)

                blocks = restage_blocks(old_blocks, committed_len, length, offset, offset + n, crc_of)
                crc = self._check_copy(key, fd, length, old_blocks, blocks, kept, version)
        except BaseException:
            self._drop_new(key, version, fd)
            raise
        return self._stage(key, Pending(version, length, crc, version, fd, False, blocks, packed))

    def stage_truncate(
        self, key: ChunkKey, version: int, length: int, *, tags: tuple[ChunkTag, ...] | None = None
    ) -> ChunkState:
        check_range(0, length)
        packed = self._new_tags(key, tags)
        m = self._begin(key, version)
        if m is not None and length >= m.length:
            old_blocks = self._known_blocks(key, m)
            self._check_old_blocks(key, m, old_blocks, joined_block(m.length), version)
            fd = os.open(self._file(key, m.file_ver), os.O_RDWR)
            try:
                os.ftruncate(fd, m.length)
                os.ftruncate(fd, length)
            except BaseException:
                os.close(fd)
                raise
            crc = crc_zeros(length - m.length, m.crc)
            blocks = extend_blocks(old_blocks, m.length, length, b"", length)
            return self._stage(key, Pending(version, length, crc, m.file_ver, fd, True, blocks, packed))
        old_blocks = self._known_blocks(key, m) if m is not None else b""
        old_len = m.length if m is not None else 0
        kept, part = kept_blocks(old_len, length, old_len)
        if m is not None:  # the old block that becomes the new last one: checked before copying
            self._check_old_blocks(key, m, old_blocks, part, version)
        fd = self._create(key, version)
        try:
            if m is None:
                os.ftruncate(fd, length)
                crc = crc_zeros(length)
                blocks = extend_blocks(b"", 0, length, b"", length)
            else:
                self._copy(self._fd(key, m.file_ver), fd, length)
                os.ftruncate(fd, length)
                blocks = restage_blocks(old_blocks, m.length, length, length, length,
                                        lambda i, start, end: self._crc_range(fd, start, end))
                crc = self._check_copy(key, fd, length, old_blocks, blocks, kept, version)
        except BaseException:
            self._drop_new(key, version, fd)
            raise
        return self._stage(key, Pending(version, length, crc, version, fd, False, blocks, packed))

    def _write_whole(self, key: ChunkKey, file_ver: int, fd: int, data: memoryview | bytes) -> bytes:
        """Write a whole new chunk file; returns its block CRCs. A big chunk is hashed on the
        helper thread while this thread waits in the kernel for the write (crc32c drops the GIL)."""
        if len(data) < OFFLOAD_MIN_BYTES:
            self._pwrite_maybe_direct(key, file_ver, fd, data)
            return block_crcs_of(data)
        hashing = self._hash_pool().submit(block_crcs_of, data)
        try:
            self._pwrite_maybe_direct(key, file_ver, fd, data)
        except BaseException:
            wait_futures([hashing])  # it still reads ``data``
            raise
        return hashing.result()

    def _hash_pool(self) -> ThreadPoolExecutor:
        with self._hasher_lock:  # astage_write calls this from pool threads
            if self._hasher is None:
                self._hasher = ThreadPoolExecutor(1, thread_name_prefix="chunk-crc")
            return self._hasher

    def _pwrite_maybe_direct(self, key: ChunkKey, file_ver: int, fd: int, data: memoryview | bytes) -> None:
        """Write a whole new chunk file from offset 0: the aligned body with O_DIRECT."""
        body = len(data) - len(data) % DIRECT_ALIGN_BYTES
        if self.direct_io and len(data) >= DIRECT_WRITE_MIN_BYTES and _direct_ok(data, 0):
            try:
                dfd = os.open(self._file(key, file_ver), os.O_WRONLY | os.O_DIRECT)
            except OSError:
                self.direct_io = False  # this file system has no O_DIRECT
            else:
                try:
                    view = memoryview(data)
                    done = 0
                    while done < body:
                        done += os.pwrite(dfd, view[done:body], done)
                finally:
                    os.close(dfd)
                if body < len(data):
                    os.pwrite(fd, view[body:], body)
                return
        os.pwrite(fd, data, 0)

    # ---- off-loop variants: the disk I/O of big requests runs in a small thread pool, so
    # the event loop keeps receiving and sending while a 4 MiB pread/pwrite is in the kernel.
    # Only I/O on a private dup of the fd (and hashing) runs in a thread; all state changes
    # stay on the loop.
    def _io_pool(self) -> ThreadPoolExecutor:
        if self._io is None:
            self._io = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="chunk-io")
        return self._io

    async def aread(self, key: ChunkKey, offset: int, into: memoryview) -> int:
        m = self._m(key)
        if len(into) < OFFLOAD_MIN_BYTES or m is None or key in self._pending:
            return self.read(key, offset, into)
        check_range(offset, len(into))
        want = min(len(into), m.length - offset)
        if want <= 0:
            return 0
        length = m.length
        blocks = None if offset == 0 and want == length else self._known_blocks(key, m)
        try:
            fd = os.dup(self._fd(key, m.file_ver))
        except OSError:
            return self.read(key, offset, into)
        dfd = -1
        if self.direct_io and want >= DIRECT_READ_MIN_BYTES:
            dfd = self._direct_fd_or_none(key, m.file_ver)
            dfd = os.dup(dfd) if dfd >= 0 else -1
        view = into[:want]

        def work() -> None:
            try:
                if blocks is None:  # whole chunk: the reader checks the whole CRC
                    self._fill(fd, lambda: dfd, view, 0)
                else:
                    self._read_checked(key, fd, lambda: dfd, view, offset, length, blocks, self._thread_scratch())
            finally:
                os.close(fd)
                if dfd >= 0:
                    os.close(dfd)

        await asyncio.get_running_loop().run_in_executor(self._io_pool(), work)
        return want

    async def astage_write(
        self,
        key: ChunkKey,
        version: int,
        offset: int,
        data: memoryview | bytes,
        *,
        data_crc: int | None = None,
        full_replace: bool = False,
        tags: tuple[ChunkTag, ...] | None = None,
        sync: bool = False,
    ) -> ChunkState:
        """``stage_write``; a whole chunk of at least ``OFFLOAD_MIN_BYTES`` is written on an I/O
        thread. ``sync``: start flushing the staged data file at once (``DurableCommits``), so
        ``commit(durable=True)`` mostly finds it done. A cancelled caller still waits for the
        thread (it reads ``data``, which the caller's buffer pool may reuse) before the file
        is dropped."""
        m = self._m(key)
        committed_len = m.length if m else 0
        whole = full_replace or (offset == 0 and len(data) >= committed_len)
        if not whole or len(data) < OFFLOAD_MIN_BYTES:
            st = self.stage_write(key, version, offset, data, data_crc=data_crc, full_replace=full_replace, tags=tags)
            if sync:
                self._start_sync(key)
            return st
        check_range(offset, len(data))
        packed = self._new_tags(key, tags)
        self._begin(key, version)
        fd = self._create(key, version)
        job = asyncio.get_running_loop().run_in_executor(self._io_pool(), self._write_whole, key, version, fd, data)
        try:
            blocks = await asyncio.shield(job)
        except BaseException:
            if not job.done():
                await asyncio.wait({job})
            self._drop_new(key, version, fd)
            raise
        crc = data_crc if data_crc is not None else crc32c.crc32c(data)
        st = self._stage(key, Pending(version, len(data), crc, version, fd, False, blocks, packed))
        if sync:
            self._start_sync(key)
        return st

    def _start_sync(self, key: ChunkKey) -> None:
        p = self._pending[key]
        p.synced = self._durable.start_sync(p.fd)

    def _drop_new(self, key: ChunkKey, file_ver: int, fd: int) -> None:
        os.close(fd)
        try:
            self._file(key, file_ver).unlink()
        except FileNotFoundError:
            pass

    def _write_row(self, key: ChunkKey, p: Pending, fsync: bool) -> None:
        if fsync:
            self._fsync(p.fd)
        self._index.put(key.inode, key.index, p.ver, p.length, p.crc, p.file_ver, p.blocks, p.tags)

    @property
    def durable_commits_total(self) -> int:
        return self._durable.commits_total

    async def commit(self, key: ChunkKey, version: int, *, durable: bool = False) -> ChunkState:
        """Commit; a durable one (``DurableCommits``: data file, directory entry, index row on
        disk) or one of an engine that fsyncs every commit runs to its end on its own task, so
        a cancelled caller never leaves the index ahead of memory."""
        self._check_failed()
        p = self._pending.get(key)
        if p is None or p.ver != version:
            raise no_pending(key, version)
        durable = durable or p.synced is not None  # staged for a durable write: always durable
        del self._pending[key]
        if self._executor is None and not durable:
            try:
                self._write_row(key, p, False)
            except BaseException as exc:
                self._pending.setdefault(key, p)
                if isinstance(exc, IndexSyncError) or getattr(exc, "sqlite_errorname", "").startswith("SQLITE_IOERR"):
                    self._fail(exc)  # the index's WAL checkpoint (or an fsync inside SQLite) failed
                raise
            return self._install(key, p)
        task = asyncio.ensure_future(self._commit_synced(key, p, durable))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                await asyncio.wait({task})
            raise

    async def _commit_synced(self, key: ChunkKey, p: Pending, durable: bool) -> ChunkState:
        try:
            if not durable:  # an engine that fsyncs every commit
                await asyncio.get_running_loop().run_in_executor(self._executor, self._write_row, key, p, True)
            else:  # data (flushed once), directory entry, row, WAL: whatever fsync_on_commit says
                await self._durable.commit(p.fd, p.synced, self._file(key, p.file_ver).parent,
                                           lambda: self._write_row(key, p, False))
        except BaseException as exc:
            if durable:
                p.row_maybe = True  # the row may be in the index: abort must keep the file
            self._pending.setdefault(key, p)
            if isinstance(exc, OSError | sqlite3.Error):
                self._fail(exc)
            raise
        return self._install(key, p)

    def open_region(self, key: ChunkKey) -> tuple[int, int, int] | None:
        m = self._m(key)
        if m is None or m.length == 0 or key in self._pending or self.failed:
            return None  # (a pending update may append to the committed file in place)
        try:
            return os.dup(self._fd(key, m.file_ver)), m.length, m.crc
        except OSError:
            return None

    def pending_durable(self, key: ChunkKey) -> bool:
        p = self._pending.get(key)
        return p is not None and p.synced is not None

    async def make_durable(self, key: ChunkKey) -> None:
        self._check_failed()
        m = self._m(key)
        if m is None:
            return
        try:
            await self._durable.commit(self._fd(key, m.file_ver), None, self._file(key, m.file_ver).parent,
                                       lambda: None)
        except (OSError, sqlite3.Error) as exc:
            self._fail(exc)
            raise

    def _install(self, key: ChunkKey, p: Pending) -> ChunkState:
        """Memory follows the index row just written: ``p`` is the committed version."""
        old = self._m(key)
        if old is not None:
            self._used_bytes -= old.length
            if old.file_ver != p.file_ver:
                self._forget_fd(key, old.file_ver)
                self._file(key, old.file_ver).unlink(missing_ok=True)
        self._used_bytes += p.length
        self._meta.put(key.inode, key.index, Meta(p.ver, p.length, p.crc, p.file_ver, p.blocks, p.tags))
        self._cache_fd((key, p.file_ver), p.fd)
        st = self.get(key)
        assert st is not None
        return st

    def abort(self, key: ChunkKey) -> None:
        p = self._pending.pop(key, None)
        if p is None:
            return
        if p.row_maybe:  # a failed durable commit may have left its row: keep what it names
            os.close(p.fd)
            logger.error("chunk %s: pending v%d dropped after a failed durable commit; its file is kept "
                         "(the index may name it)", key, p.ver)
        elif p.in_place:
            m = self._m(key)
            if m is not None:
                os.ftruncate(p.fd, m.length)
            os.close(p.fd)
        else:
            self._drop_new(key, p.file_ver, p.fd)

    async def remove_range(self, inode: int, index_begin: int = 0, index_end: int = INDEX_END) -> int:
        for key in [k for k in self._pending if k.inode == inode and index_begin <= k.index < index_end]:
            self.abort(key)
        doomed = self._meta.inode_range(inode, index_begin, index_end)
        if not doomed:
            return 0
        args = (inode, index_begin, min(index_end, INDEX_END))
        if self._executor is not None:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._index.delete_range, *args)
        else:
            self._index.delete_range(*args)
        for idx, m in doomed:
            self._meta.pop(inode, idx)
            key = ChunkKey(inode, idx)
            self._forget_fd(key, m.file_ver)
            self._file(key, m.file_ver).unlink(missing_ok=True)
            self._used_bytes -= m.length
        return len(doomed)

    def list_chunks(
        self,
        inode: int = 0,
        index_begin: int = 0,
        index_end: int = INDEX_END,
        limit: int = 10000,
        *,
        after: ChunkKey | None = None,
    ) -> list[ChunkState]:
        """Committed keys come in order from the index; the few pending-only ones (in-flight
        first writes) are sorted per call and merged in."""
        keys = (k for k, _ in self._meta.scan(after, inode, index_begin, index_end))
        extra = sorted(
            k for k in self._pending
            if self._m(k) is None
            and (after is None or k > after)
            and (not inode or (k.inode == inode and index_begin <= k.index < index_end))
        )
        out = []
        for k in islice(merge(keys, extra) if extra else keys, max(0, limit)):
            st = self.get(k)
            if st is not None:
                out.append(st)
        return out

    def usage(self) -> Usage:
        vfs = os.statvfs(self.path)
        return Usage(self._used_bytes, len(self._meta), vfs.f_blocks * vfs.f_frsize)

    def close(self) -> None:
        for key in list(self._pending):
            self.abort(key)
        self._release()

    def simulate_crash(self) -> None:
        """Tests: drop everything as a killed process would (pending files stay on disk);
        open a new engine on the same directory to "restart"."""
        for p in self._pending.values():
            os.close(p.fd)
        self._pending.clear()
        self._release()

    def _release(self) -> None:
        self._stop_verify.set()
        if self._verifier is not None:
            self._verifier.join(MARKER_WAIT_S)  # it stops at its next chunk (the index must outlive it)
            if self._verifier.is_alive():  # a read hangs on the failing disk: do not hang with it
                logger.error("engine %s: verification still stuck on the disk after %.0fs: closing without it "
                             "(the index stays open until the process exits)", self.path, MARKER_WAIT_S)
                self._close_fds()
                return
        marker: threading.Thread | None = getattr(self, "_marker", None)
        if marker is not None:
            marker.join(MARKER_WAIT_S)
        self._close_fds()
        for pool in (self._io, self._hasher):
            if pool is not None:
                pool.shutdown(wait=True)
        self._io = self._hasher = None
        self._durable.close()  # before the index it writes to
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        self._index.close()

    def __repr__(self) -> str:
        return f"FileEngine({self.path} chunks={len(self._meta)} used={self._used_bytes}B pending={len(self._pending)})"
