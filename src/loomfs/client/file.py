"""An open LoomFS file on the async core: chunked reads with fan-out and read-ahead,
write-back buffering per chunk with background flushes.

Semantics: reads stop at the length this file object knows (the length at open, grown by
its own writes); holes and short chunks read as zeros; reads see this file's own buffered
writes (pending data is flushed first). ``flush``/``fsync``/``close`` wait for every
in-flight chunk write and raise the first error one of them hit. ``close`` reports the
highest written offset to meta, which sets the exact length.

Truncates go to meta, which cuts the chunks before it answers. A length report carries the
file's truncate epoch this object knows; if another client truncated the file since, meta
does not grow the length from it (and cuts what this object wrote past the end), and the
reply's newer epoch makes this object count only what it writes from then on.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any

from loomfs.client.layout import chunk_count, chunk_range, split_range
from loomfs.client.readahead import CachedChunk, ReadAheadCache
from loomfs.client.storage_client import ChunkStore
from loomfs.client.writeback import ByteBudget, ChunkBuffer
from loomfs.config import ClientConfig
from loomfs.errors import InvalidArgument, LoomError
from loomfs.net.buffers import BufferPool
from loomfs.wire.meta import SetattrReq
from loomfs.wire.types import Attr, Layout

if TYPE_CHECKING:
    from loomfs.client.meta_client import MetaClient

logger = logging.getLogger(__name__)

_MODES = {
    "r": os.O_RDONLY,
    "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL,
}
READLINE_BLOCK_BYTES = 64 << 10


def parse_mode(mode: str) -> tuple[int, bool]:
    """``'r+b'`` -> (os.O_RDWR, binary=True). Raises ValueError for bad modes."""
    kinds = [c for c in mode if c in "rwax"]
    if len(kinds) != 1 or any(c not in "rwax+bt" for c in mode) or len(set(mode)) != len(mode):
        raise ValueError(f"invalid mode {mode!r}")
    if "b" in mode and "t" in mode:
        raise ValueError(f"invalid mode {mode!r}: both binary and text")
    flags = _MODES[kinds[0]]
    if "+" in mode:
        flags = (flags & ~(os.O_WRONLY | os.O_RDONLY)) | os.O_RDWR
    return flags, "b" in mode


class AsyncFile:
    def __init__(
        self,
        *,
        path: str,
        attr: Attr,
        flags: int,
        session_id: int,
        storage: ChunkStore,
        meta: MetaClient,
        config: ClientConfig,
        pool: BufferPool,
        budget: ByteBudget,
        background: set[asyncio.Task[Any]] | None = None,
        trunc_epoch: int = 0,
    ):
        if attr.layout is None or not attr.layout.chains:
            raise LoomError(f"{path}: file has no layout", path=path)
        self.path = path
        self.inode = attr.inode
        self.layout: Layout = attr.layout
        self.session_id = session_id
        acc = flags & (os.O_RDONLY | os.O_WRONLY | os.O_RDWR)
        self.readable = acc in (os.O_RDONLY, os.O_RDWR)
        self.writable = acc in (os.O_WRONLY, os.O_RDWR)
        self.append = bool(flags & os.O_APPEND)
        self._storage = storage
        self._meta = meta
        self._config = config
        self._pool = pool
        self._budget = budget
        self._background = background  # where an untouched file's CLOSE may finish
        self._chunk_size = self.layout.chunk_size
        self._length = attr.size
        self._pos = 0
        self._written_end = -1  # highest byte written + 1 (since the last epoch change), reported
        self._trunc_epoch = trunc_epoch  # the file's truncate epoch as this object knows it
        self._cur: ChunkBuffer | None = None
        self._flushes: set[asyncio.Task[None]] = set()
        self._last_flush: dict[int, asyncio.Task[None]] = {}  # per chunk: keeps same-chunk order
        self._error: BaseException | None = None
        self._cache = ReadAheadCache(pool, max(4, 2 * config.readahead_chunks))
        self._seq_next = 0
        self._streak = 0
        self.closed = False
        self.bytes_read = 0
        self.bytes_written = 0

    @property
    def length(self) -> int:
        return self._length

    @property
    def cache(self) -> ReadAheadCache:
        return self._cache

    def _check(self, *, read: bool = False, write: bool = False) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        if read and not self.readable:
            raise LoomError("file not open for reading", errno=9, path=self.path)
        if write and not self.writable:
            raise LoomError("file not open for writing", errno=9, path=self.path)

    def _raise_pending(self) -> None:
        if self._error is not None:
            exc, self._error = self._error, None
            raise exc

    # --- writing ----------------------------------------------------------------------

    async def write(self, b: bytes | bytearray | memoryview) -> int:
        self._check(write=True)
        self._raise_pending()
        data = memoryview(b)
        if data.ndim != 1 or data.itemsize != 1:
            data = data.cast("B")
        total = len(data)
        if total == 0:
            return 0
        if self.append:
            self._pos = self._length
        cs = self._chunk_size
        self._cache.drop_range(chunk_range(self.layout, self._pos, total))
        done = 0
        while done < total:
            index, off = divmod(self._pos, cs)
            cur = self._cur
            if cur is not None and (cur.index != index or cur.end != off):
                await self._dispatch()
                cur = None
            if cur is None:
                cur = self._cur = ChunkBuffer(index, self._pool.acquire(cs), off, off)
            n = min(cs - off, total - done)
            cur.buf[off : off + n] = data[done : done + n]
            cur.end += n
            done += n
            self._pos += n
            if self._pos > self._length:
                self._length = self._pos
            if self._pos > self._written_end:
                self._written_end = self._pos
            if cur.end == cs:
                await self._dispatch()
        self.bytes_written += total
        return total

    async def _dispatch(self) -> None:
        """Send the pending chunk buffer in the background (waits for budget first)."""
        cur, self._cur = self._cur, None
        if cur is None:
            return
        if cur.dirty_bytes == 0:
            self._pool.release(cur.buf)
            return
        try:
            await self._budget.acquire(self._chunk_size)
        except BaseException:
            self._pool.release(cur.buf)
            raise
        prev = self._last_flush.get(cur.index)
        task = asyncio.get_running_loop().create_task(self._flush_one(cur, prev))
        self._last_flush[cur.index] = task
        self._flushes.add(task)
        index = cur.index
        task.add_done_callback(lambda t: self._flush_done(t, index))

    async def _flush_one(self, cur: ChunkBuffer, prev: asyncio.Task[None] | None) -> None:
        try:
            if prev is not None and not prev.done():
                await asyncio.wait([prev])  # same chunk: the earlier write lands first
            view = memoryview(cur.buf)[cur.start : cur.end]
            await self._storage.write_chunk(self.layout, self.inode, cur.index, cur.start, view)
        except Exception as exc:
            logger.warning("%s: write of chunk %d failed: %s", self.path, cur.index, exc)
            if self._error is None:
                self._error = exc
        finally:
            self._pool.release(cur.buf)
            self._budget.release(self._chunk_size)

    def _flush_done(self, task: asyncio.Task[None], index: int) -> None:
        self._flushes.discard(task)
        if self._last_flush.get(index) is task:
            del self._last_flush[index]

    async def flush(self) -> None:
        """Send buffered data and wait for every in-flight chunk write."""
        if self.closed:
            return
        await self._dispatch()
        while pending := [t for t in self._flushes if not t.done()]:
            await asyncio.wait(pending)
        self._raise_pending()

    @property
    def dirty(self) -> bool:
        return self._cur is not None or any(not t.done() for t in self._flushes)

    async def fsync(self) -> None:
        self._check()
        await self.flush()
        if self.writable:
            rsp = await self._meta.sync(self.inode, self._written_end, trunc_epoch=self._trunc_epoch)
            if rsp.trunc_epoch > self._trunc_epoch:
                # truncated by someone else since we last heard: what we wrote before this
                # reply was not counted; the length is meta's, and only new writes count
                self._trunc_epoch = rsp.trunc_epoch
                self._written_end = -1
                self._cache.clear()
                if rsp.attr is not None:
                    self._length = rsp.attr.size

    async def truncate(self, size: int | None = None) -> int:
        self._check(write=True)
        size = self._pos if size is None else size
        if size < 0:
            raise InvalidArgument("negative size", path=self.path)
        await self.flush()
        rsp = await self._meta.setattr(SetattrReq(path=self.path, size=size))  # meta cuts the chunks
        self._trunc_epoch = max(self._trunc_epoch, rsp.trunc_epoch)
        self._cache.clear()
        self._length = size
        if self._written_end >= 0:
            self._written_end = size
        return size

    # --- reading ----------------------------------------------------------------------

    async def read(self, n: int | None = -1) -> bytes:
        self._check(read=True)
        avail = max(0, self._length - self._pos)
        if n is None or n < 0 or n > avail:
            n = avail
        if n == 0:
            if self.dirty:
                await self.flush()
            return b""
        buf = self._pool.acquire(n)
        view = memoryview(buf)[:n]
        got = await self._pread_into(self._pos, view)
        self._pos += got
        out = bytes(view[:got])
        view.release()
        self._pool.release(buf)
        return out

    async def readinto(self, b: bytearray | memoryview) -> int:
        self._check(read=True)
        view = memoryview(b)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        got = await self._pread_into(self._pos, view)
        self._pos += got
        return got

    async def readline(self, limit: int = -1) -> bytes:
        self._check(read=True)
        out = bytearray()
        buf = self._pool.acquire(READLINE_BLOCK_BYTES)
        view = memoryview(buf)
        while limit < 0 or len(out) < limit:
            want = READLINE_BLOCK_BYTES if limit < 0 else min(READLINE_BLOCK_BYTES, limit - len(out))
            n = await self._pread_into(self._pos, view[:want])
            if n == 0:
                break
            i = buf.find(b"\n", 0, n)
            take = n if i < 0 else i + 1
            out += view[:take]
            self._pos += take
            if i >= 0:
                break
        self._seq_next = self._pos  # the next read continues the sequential streak
        view.release()
        self._pool.release(buf)
        return bytes(out)

    async def pread(self, offset: int, into: memoryview) -> int:
        """Positional read into ``into``; does not move the file position."""
        self._check(read=True)
        return await self._pread_into(offset, into)

    async def _fetch_chunk(self, index: int, into: memoryview) -> int:
        return await self._storage.read_chunk(self.layout, self.inode, index, 0, len(into), into)

    async def _pread_into(self, pos: int, view: memoryview) -> int:
        if self.dirty:
            await self.flush()  # reads see this file's own writes
        n = min(len(view), self._length - pos)
        if n <= 0:
            return 0
        view = view[:n]
        self._streak = self._streak + 1 if pos == self._seq_next else 0
        self._seq_next = pos + n
        cs = self._chunk_size
        # read-ahead serves streams of small reads; a request of a chunk or more already fans
        # out over the stripe straight into the caller's buffer, and staging it through the
        # cache would cost a copy of every byte
        use_cache = self._streak >= 2 and self._config.readahead_chunks > 0 and n < cs
        pieces = list(split_range(self.layout, pos, n))
        sem = asyncio.Semaphore(max(1, self._config.parallel_chunks_max))

        async def one(index: int, off: int, length: int, boff: int) -> None:
            target = view[boff : boff + length]
            entry: CachedChunk | None = self._cache.get(index)
            if entry is None and use_cache and length < cs:
                entry = self._cache.start(index, self._chunk_length(index), self._fetch_chunk)
            if entry is not None:
                try:
                    await asyncio.shield(entry.task)
                    if off + length <= entry.length:
                        target[:] = memoryview(entry.buf)[off : off + length]
                        return
                except (LoomError, OSError) as exc:
                    logger.debug("%s: read-ahead of chunk %d failed (%s); reading directly", self.path, index, exc)
                    self._cache.drop(index)
            async with sem:
                await self._storage.read_chunk(self.layout, self.inode, index, off, length, target)

        if len(pieces) == 1:
            p = pieces[0]
            await one(p.index, p.offset, p.length, p.buffer_offset)
        else:
            await asyncio.gather(*(one(p.index, p.offset, p.length, p.buffer_offset) for p in pieces))
        if use_cache:
            self._cache.drop_below(pieces[0].index)
            self._read_ahead(pieces[-1].index + 1)
        self.bytes_read += n
        return n

    def _chunk_length(self, index: int) -> int:
        return max(0, min(self._chunk_size, self._length - index * self._chunk_size))

    def _read_ahead(self, first: int) -> None:
        last_chunk = chunk_count(self.layout, self._length)
        for index in range(first, min(first + self._config.readahead_chunks, last_chunk)):
            if index not in self._cache and self._cache.start(index, self._chunk_length(index), self._fetch_chunk) is None:
                break

    # --- position, lifetime -----------------------------------------------------------

    def tell(self) -> int:
        return self._pos

    async def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._check()
        if whence == os.SEEK_SET:
            new = offset
        elif whence == os.SEEK_CUR:
            new = self._pos + offset
        elif whence == os.SEEK_END:
            new = self._length + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if new < 0:
            raise InvalidArgument(f"negative seek position {new}", path=self.path)
        cur = self._cur
        if cur is not None and new != cur.index * self._chunk_size + cur.end:
            await self._dispatch()  # non-contiguous: send the partial range now
        self._pos = new
        return new

    async def close(self) -> None:
        if self.closed:
            return
        err: BaseException | None = None
        try:
            await self.flush()
        except Exception as exc:
            err = exc
        self.closed = True
        self._cache.clear()
        if self.session_id:
            if self._written_end < 0 and err is None and self._background is not None:
                # nothing was written: attributes do not change, only the write session
                # ends, so the CLOSE need not be waited for (creates cost one round trip)
                task = asyncio.get_running_loop().create_task(self._close_session())
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            else:
                await self._meta.close(self.inode, self.session_id, self._written_end,
                                       trunc_epoch=self._trunc_epoch)
        if err is not None:
            raise err

    async def _close_session(self) -> None:
        try:
            await self._meta.close(self.inode, self.session_id, -1, trunc_epoch=self._trunc_epoch)
        except (LoomError, OSError) as exc:
            logger.warning("%s: closing the write session failed: %s", self.path, exc)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"pos={self._pos}"
        return (
            f"AsyncFile({self.path} inode={self.inode} len={self._length} {state} "
            f"inflight={len(self._flushes)})"
        )
