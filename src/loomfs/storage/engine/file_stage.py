"""The file engine's updates: staging a write or a truncate as a pending version (a whole chunk
written to a new file with O_DIRECT and hashed on a helper thread meanwhile, an append or a
zero-extension in place past the committed length, any other change copy-on-write to a new file
and checked in one pass), and the files they create (``file`` explains the scheme)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures

import crc32c

from loomfs.storage.engine.base import ChunkEngine
from loomfs.storage.engine.blocks import (
    block_crcs_of,
    check_range,
    check_stage_version,
    crc_zeros,
    extend_blocks,
    joined_block,
    kept_blocks,
    restage_blocks,
)
from loomfs.storage.engine.chunkmap import ChunkMap
from loomfs.storage.engine.durable import DurableCommits
from loomfs.storage.engine.file_crc import BlockChecks
from loomfs.storage.engine.file_io import (
    DIRECT_ALIGN_BYTES,
    DIRECT_WRITE_MIN_BYTES,
    OFFLOAD_MIN_BYTES,
    SCRATCH_BYTES,
    _direct_ok,
    _pwrite_at,
)
from loomfs.storage.engine.file_rows import Meta, Pending
from loomfs.storage.engine.tags import encode_tags
from loomfs.storage.engine.types import ChunkKey, ChunkState, ChunkTag


class Staging(BlockChecks, ChunkEngine):
    """Mixin of ``FileEngine``: its ``stage_*`` and the files they write."""

    _meta: ChunkMap[Meta]
    _pending: dict[ChunkKey, Pending]
    _durable: DurableCommits
    _hasher: ThreadPoolExecutor | None
    _hasher_lock: threading.Lock

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

    def _m(self, key: ChunkKey) -> Meta | None:
        return self._meta.get(key.inode, key.index)

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

    def _drop_new(self, key: ChunkKey, file_ver: int, fd: int) -> None:
        os.close(fd)
        try:
            self._file(key, file_ver).unlink()
        except FileNotFoundError:
            pass
