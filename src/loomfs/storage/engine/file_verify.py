"""The file engine's start-up and its verification after a failed fsync: loading the index into
memory (and deleting the data files it does not name), and, when the last process saw an fsync
fail here (``diskfail``'s marker) or mgmtd says so, reading every committed chunk back on a
thread, out of service meanwhile, to find the chunks the disk lost (``file`` explains the
engine; ``_fail``, which takes a target out of service, is there)."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

from loomfs.storage.engine.base import ChunkEngine
from loomfs.storage.engine.blocks import block_count
from loomfs.storage.engine.chunkmap import ChunkMap
from loomfs.storage.engine.diskfail import (
    Fsync,
    bad_chunks,
    clear_marker,
    drop_index_cache,
    fsync_path,
)
from loomfs.storage.engine.durable import DurableCommits
from loomfs.storage.engine.file_fds import FdCache
from loomfs.storage.engine.file_index import ChunkIndex
from loomfs.storage.engine.file_rows import Meta, Pending
from loomfs.storage.engine.tags import tags_ok
from loomfs.storage.engine.types import ChunkKey

logger = logging.getLogger(__name__)

VERIFYING = "verifying after a failed fsync"  # ``failed`` while the check runs (out of service)


class Verification(FdCache, ChunkEngine):
    """Mixin of ``FileEngine``: loading its index, and checking its files after a failed fsync."""

    path: Path
    fsync_on_commit: bool
    _fsync: Fsync
    _index: ChunkIndex
    _meta: ChunkMap[Meta]
    _pending: dict[ChunkKey, Pending]
    _used_bytes: int
    _durable: DurableCommits
    _stop_verify: threading.Event
    _verifier: threading.Thread | None
    _fail: Callable[[BaseException], None]  # ``FileEngine._fail``

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
