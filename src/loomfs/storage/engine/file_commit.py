"""The file engine's commits: a pending version's index row written (an engine that fsyncs
every commit, and durable commits through ``durable``, on their own task so a cancelled caller
never leaves the index ahead of memory), then installed in memory; aborts of pending versions
(``file`` explains the engine; ``_fail`` is there)."""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from loomfs.storage.engine.blocks import no_pending
from loomfs.storage.engine.diskfail import Fsync
from loomfs.storage.engine.file_index import IndexSyncError
from loomfs.storage.engine.file_rows import Meta, Pending
from loomfs.storage.engine.file_stage import Staging
from loomfs.storage.engine.types import ChunkKey, ChunkState

logger = logging.getLogger(__name__)


class Commits(Staging):
    """Mixin of ``FileEngine``: ``commit``, ``abort`` and durability of committed versions."""

    _fsync: Fsync
    _used_bytes: int
    _executor: ThreadPoolExecutor | None  # fsyncs every commit (``fsync_on_commit``)
    _fail: Callable[[BaseException], None]  # ``FileEngine._fail``
    _check_failed: Callable[[], None]  # ``FileEngine._check_failed``

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
