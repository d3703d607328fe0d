"""The file engine's open-file caches: a bounded LRU of read-write fds per chunk data file,
and one of O_DIRECT read fds (aligned whole-block reads bypass the page cache)."""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

from loomfs.storage.engine.types import ChunkKey


class FdCache:
    """Mixin of ``FileEngine``: its fds by (chunk, file version)."""

    direct_io: bool
    fd_cache_max: int
    _chunks_dir: Path
    _fds: OrderedDict[tuple[ChunkKey, int], int]
    _direct_fds: OrderedDict[tuple[ChunkKey, int], int]

    def _file(self, key: ChunkKey, file_ver: int) -> Path:
        """A chunk's data file of one version: chunks/<inode's low byte>/<inode>.<index>.<version>."""
        return self._chunks_dir / f"{key.inode & 0xFF:02x}" / f"{key.inode:x}.{key.index:x}.{file_ver:x}"

    def _fd(self, key: ChunkKey, file_ver: int) -> int:
        ck = (key, file_ver)
        fd = self._fds.get(ck)
        if fd is not None:
            self._fds.move_to_end(ck)
            return fd
        fd = os.open(self._file(key, file_ver), os.O_RDWR)
        self._cache_fd(ck, fd)
        return fd

    def _cache_fd(self, ck: tuple[ChunkKey, int], fd: int) -> None:
        old = self._fds.pop(ck, None)
        if old is not None and old != fd:
            os.close(old)
        self._fds[ck] = fd
        while len(self._fds) > self.fd_cache_max:
            os.close(self._fds.popitem(last=False)[1])

    def _forget_fd(self, key: ChunkKey, file_ver: int) -> None:
        for cache in (self._fds, self._direct_fds):
            fd = cache.pop((key, file_ver), None)
            if fd is not None:
                os.close(fd)

    def _direct_fd(self, key: ChunkKey, file_ver: int) -> int:
        ck = (key, file_ver)
        fd = self._direct_fds.get(ck)
        if fd is not None:
            self._direct_fds.move_to_end(ck)
            return fd
        fd = os.open(self._file(key, file_ver), os.O_RDONLY | os.O_DIRECT)
        self._direct_fds[ck] = fd
        while len(self._direct_fds) > self.fd_cache_max:
            os.close(self._direct_fds.popitem(last=False)[1])
        return fd

    def _direct_fd_or_none(self, key: ChunkKey, file_ver: int) -> int:
        """The cached O_DIRECT fd, or -1 when O_DIRECT is off or refused (then off for good)."""
        if not self.direct_io:
            return -1
        try:
            return self._direct_fd(key, file_ver)
        except OSError:
            self.direct_io = False
            return -1

    def _close_fds(self) -> None:
        while self._fds:
            os.close(self._fds.popitem()[1])
        while self._direct_fds:
            os.close(self._direct_fds.popitem()[1])
