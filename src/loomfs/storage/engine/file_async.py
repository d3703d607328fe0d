"""The file engine's off-loop variants: the disk I/O of big requests (``aread``, and
``astage_write`` of a whole chunk) runs in a small thread pool, so the event loop keeps
receiving and sending while a 4 MiB pread/pwrite is in the kernel. Only I/O on a private dup of
the fd (and hashing) runs in a thread; all state changes stay on the loop.

A small read (under ``OFFLOAD_MIN_BYTES``) is served on the loop when its range is in the page
cache (a thread hop costs more than copying it), and on a pool of its own (``COLD_THREADS``)
when it is not (session 16): read on the loop, a cold read waited for the disk with the whole
process stopped (every other request, heartbeats, chain forwards), and concurrent cold reads,
say a DataLoader's workers reading 100 KiB records of cold shards, went to the disk one at a
time. Residency is asked with non-blocking one-byte reads (``RWF_NOWAIT``) of the range's
first, middle and last byte, as ``storage.hotchunks`` does; a kernel or file system that cannot
say keeps every small read on the loop, as before."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor

import crc32c

from loomfs.storage.engine.blocks import check_range
from loomfs.storage.engine.file_io import (  # in_page_cache: tests patch it here
    DIRECT_READ_MIN_BYTES,
    IO_THREADS,
    OFFLOAD_MIN_BYTES,
    in_page_cache,
)
from loomfs.storage.engine.file_rows import Pending
from loomfs.storage.engine.file_stage import Staging
from loomfs.storage.engine.types import ChunkKey, ChunkState, ChunkTag

COLD_THREADS = 8  # small reads that would wait for the disk: this many at once (queue depth)

class Offload(Staging):
    """Mixin of ``FileEngine``: ``aread`` and ``astage_write`` on its I/O threads."""

    _io: ThreadPoolExecutor | None
    _cold: ThreadPoolExecutor | None = None
    cold_reads_offloaded = 0  # small reads sent to the cold pool (their range not in the page cache)

    def _io_pool(self) -> ThreadPoolExecutor:
        if self._io is None:
            self._io = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="chunk-io")
        return self._io

    def _cold_pool(self) -> ThreadPoolExecutor:
        if self._cold is None:
            self._cold = ThreadPoolExecutor(COLD_THREADS, thread_name_prefix="chunk-cold")
        return self._cold

    async def aread(self, key: ChunkKey, offset: int, into: memoryview) -> int:
        m = self._m(key)
        if m is None or key in self._pending:
            return self.read(key, offset, into)
        small = len(into) < OFFLOAD_MIN_BYTES
        if small:
            want = min(len(into), m.length - offset)
            if want <= 0 or in_page_cache(self._fd(key, m.file_ver), offset, want) is not False:
                return self.read(key, offset, into)  # resident (or cannot tell): on the loop
            self.cold_reads_offloaded += 1
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

        await asyncio.get_running_loop().run_in_executor(self._cold_pool() if small else self._io_pool(), work)
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
