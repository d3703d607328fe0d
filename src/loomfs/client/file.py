"""An open LoomFS file on the async core: chunked reads with fan-out and read-ahead,
write-back buffering per chunk with background flushes.

Semantics: reads stop at the length this file object knows (the length at open, grown by
its own writes); holes and short chunks read as zeros; reads see this file's own buffered
writes (pending data is flushed first). ``flush``/``fsync``/``close`` wait for every
in-flight chunk write and raise the first error one of them hit. ``close`` reports the
highest written offset to meta, which sets the exact length; after a failed chunk write the
reported length stops before it, and ``fsync``/``close`` keep failing (EIO, or ENOSPC) until
the program writes that range again, so they never succeed with written bytes left out.
Writes, seeks, truncates, flushes, fsyncs and closes of one file object run one at a time
(tasks or threads sharing it): each is atomic to the others, as POSIX has it.

Truncates go to meta, which cuts the chunks before it answers. A length report carries the
file's truncate epoch this object knows; if another client truncated the file since, meta
does not grow the length from it (and cuts what this object wrote past the end), and the
reply's newer epoch makes this object count only what it writes from then on.

Inline files (``Attr.inline``: the bytes live in meta) are read from the copy the open
reply carried and written through meta (``loomfs.client.inline``); a write past the file's
inline limit moves it to chunks first (MIGRATE). A new file opened with "w" (no "+") is
created *lazily*: its bytes are buffered and the create carries them at close, one round
trip for a small file (a put). Until then other clients do not see the file (nor the
truncation of an old one), and an error of the create (ENOENT parent, EISDIR, ...) is raised
by ``close``, ``fsync`` or the write that outgrows the buffer; a write past
``lazy_max_bytes`` creates the file in chunks. This client's own calls on the path (stat,
open, rename, unlink, a listing of the directory, ...) create it first (``create_now``,
``loomfs.client.lazy``), so a program sees its own files as POSIX says.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from loomfs.client.ec_file import EcFileIO
from loomfs.client.inline import INLINE_CAP_BYTES, PATCHES_MAX, InlineContent
from loomfs.client.layout import chunk_count, chunk_range, split_range
from loomfs.client.readahead import CachedChunk, ReadAheadCache
from loomfs.client.storage_client import ChunkStore
from loomfs.client.writeback import ByteBudget, ChunkBuffer
from loomfs.config import ClientConfig
from loomfs.errors import InvalidArgument, LoomError, NotFound, error_for_errno
from loomfs.net.buffers import BufferPool
from loomfs.wire.meta import OpenRsp, SetattrReq
from loomfs.wire.types import FILE_BYTES_MAX, Attr, Layout

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
# chunk writes one file keeps in flight (within the client's dirty budget): enough to keep
# every chain of a stripe busy, few enough that a stream cycles a few pooled buffers instead
# of first-touching the whole 256 MiB budget (fresh memory costs 3-5 us per 4 KiB page here)
FLUSHES_INFLIGHT_MAX = 8
# a file opened with "w" but not created yet: OPEN with (data, chunked) -> the reply
Opener = Callable[[bytes | None, bool], Awaitable[OpenRsp]]


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
        attr: Attr | None,
        flags: int,
        session_id: int,
        storage: ChunkStore,
        meta: MetaClient,
        config: ClientConfig,
        pool: BufferPool,
        budget: ByteBudget,
        background: set[asyncio.Task[Any]] | None = None,
        trunc_epoch: int = 0,
        inline_data: bytes | None = None,
        opener: Opener | None = None,
        lazy_max_bytes: int = 0,
    ):
        self.path = path
        self.inode = 0
        self.layout = Layout()
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
        self._length = 0
        self._pos = 0
        self._written_end = -1  # highest byte written + 1 (since the last epoch change), reported
        self._trunc_epoch = trunc_epoch  # the file's truncate epoch as this object knows it
        self._inline: InlineContent | None = None  # the bytes, while the file is inline
        self._ec: EcFileIO | None = None  # an erasure-coded file's data path (loomfs.client.ec_file)
        self._opener = opener  # set while a "w" file waits to be created (lazy)
        self._create_lock = asyncio.Lock()  # one creation, whoever asks first
        # one write, seek, truncate, flush, fsync or close at a time: calls from several tasks (or
        # threads of the blocking API) share the position and the chunk buffer, and each
        # may wait (for write budget) half-way; POSIX has them atomic to each other
        self._io_lock = asyncio.Lock()
        self.opened_attr = attr  # as meta answered the open (its version: size, mtime, ctime)
        if attr is not None:
            self._adopt(attr, inline_data)
        elif opener is not None:
            self._inline = InlineContent(b"", min(lazy_max_bytes, INLINE_CAP_BYTES))
        else:
            raise LoomError(f"{path}: no attributes", path=path)
        self._cur: ChunkBuffer | None = None
        self._flushes: set[asyncio.Task[None]] = set()
        self._last_flush: dict[int, asyncio.Task[None]] = {}  # per chunk: keeps same-chunk order
        self._error: BaseException | None = None
        # lowest file offset whose stripe write failed (an EC file's, set by ``EcFileIO``): the
        # length this object reports never claims bytes from there on, which may never have
        # been written
        # the file ranges whose chunk writes failed (ENOSPC, EIO, a timeout) and were not
        # written since: the reported length stops at the first; a later write of a range that
        # goes through takes it out again (the program wrote those bytes anew)
        self._failed: list[tuple[int, int]] = []
        self._failed_errno = errno.EIO  # what a close/fsync short of the written end raises
        self._cache = ReadAheadCache(pool, max(4, 2 * config.readahead_chunks))
        self._seq_next = 0
        self._streak = 0
        self.closed = False
        # the error of a close made for its owner (``AsyncClient.close`` closing the files left
        # open): raised by the owner's own close later, once, not only logged
        self.close_error: BaseException | None = None
        self._close_unsent = False  # meta's CLOSE not answered yet: a later close() sends it again
        self.bytes_read = 0
        self.bytes_written = 0

    def _adopt(self, attr: Attr, inline_data: bytes | None) -> None:
        if attr.layout is None or not attr.layout.chains:
            raise LoomError(f"{self.path}: file has no layout", path=self.path)
        self.inode = attr.inode
        self.layout = attr.layout
        self._chunk_size = attr.layout.chunk_size
        self._length = attr.size
        self._inline = None
        self._ec = EcFileIO(self) if attr.layout.ec_k and not attr.inline else None
        if attr.inline:
            limit = max(attr.layout.inline_max_bytes, 0)
            self._inline = InlineContent(inline_data if inline_data is not None else b"", limit)
            self._length = len(self._inline)

    @property
    def inline(self) -> bool:
        """Whether this object reads and writes the file through meta (or a "w" buffer)."""
        return self._inline is not None

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

    def _reported_end(self) -> int:
        """The end of what this object wrote, as reported to meta: not past a failed write."""
        if self._failed:
            cap = min(s for s, _ in self._failed)
            if self._written_end > cap:
                return cap
        return self._written_end

    def _note_failed(self, start: int, end: int, exc: BaseException) -> None:
        self._failed.append((start, end))
        code = getattr(exc, "errno", None)
        self._failed_errno = code if code in (errno.ENOSPC, errno.EDQUOT) else errno.EIO

    def _note_written(self, start: int, end: int) -> None:
        """[start, end) was stored: no longer a failed range (a same-chunk write lands after
        the earlier ones, so this is the newest content there)."""
        if self._failed:
            self._failed = [(s, e) for a, b in self._failed for s, e in ((a, min(b, start)), (max(a, end), b))
                            if s < e]

    def _forget_failed_from(self, size: int) -> None:
        """The file was cut to ``size``: failed writes past it no longer matter."""
        self._failed = [(s, min(e, size)) for s, e in self._failed if s < size]

    def _short_error(self) -> OSError | None:
        """An error when the length this object reports leaves out bytes it was asked to
        write (a failed chunk or stripe write, not written again since): a close or fsync
        must not then succeed, whether or not the write's own error was raised already. Also
        when another client's truncate (a newer epoch) reset what this object counts: a failed
        range below the new size holds other bytes than the program wrote (review 16)."""
        end = self._reported_end()
        if end < self._written_end:
            return error_for_errno(self._failed_errno, f"bytes from offset {end} to {self._written_end} were not "
                                   "stored (a write of them failed); the file's length stops before them", self.path)
        if self._failed:
            at = min(s for s, _ in self._failed)
            return error_for_errno(self._failed_errno, f"bytes from offset {at} were not stored (a write of them "
                                   "failed) and not written since", self.path)
        return None

    def _raise_pending(self) -> None:
        if self._error is not None:
            exc, self._error = self._error, None
            raise exc

    # --- writing ----------------------------------------------------------------------

    async def write(self, b: bytes | bytearray | memoryview) -> int:
        self._check(write=True)
        async with self._io_lock:
            return await self._write(b)

    async def _write(self, b: bytes | bytearray | memoryview) -> int:
        self._check(write=True)  # (again: closed while this write waited for the lock)
        self._raise_pending()
        data = memoryview(b)
        if data.ndim != 1 or data.itemsize != 1:
            data = data.cast("B")
        total = len(data)
        if total == 0:
            return 0
        if self.append:
            self._pos = self._length
        _check_length(self._pos + total, self.path)
        if self._inline is not None:
            end = self._pos + total
            if self._inline.fits(end):
                if len(self._inline.patches) >= PATCHES_MAX and self._opener is None:
                    await self._flush()  # many scattered writes: send them before more pile up
                if self._inline is not None:
                    self._inline.write(self._pos, data)
                    self._pos = end
                    self._length = max(self._length, end)
                    self.bytes_written += total
                    return total
            if self._inline is not None:
                await self._leave_inline()
        await self._write_chunks(data)
        self.bytes_written += total
        return total

    async def _write_chunks(self, data: memoryview) -> None:
        """Buffer ``data`` at the position into chunk buffers, sending full ones."""
        total = len(data)
        if self._ec is not None:
            await self._ec.write(self._pos, data, self._length)
            self._pos += total
            self._length = max(self._length, self._pos)
            self._written_end = max(self._written_end, self._pos)
            return
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

    # --- inline files and lazy creates -----------------------------------------------------

    async def _create(self, data: bytes | None, chunked: bool) -> OpenRsp:
        """Create the lazily opened file now (``data``: as a put)."""
        assert self._opener is not None
        rsp = await self._opener(data, chunked)
        self._opener = None
        if rsp.attr is None:
            raise LoomError("open returned no attributes", path=self.path)
        self.session_id = rsp.session_id
        self._trunc_epoch = rsp.trunc_epoch
        return rsp

    async def _to_chunks(self, content: InlineContent) -> None:
        """This object now writes chunks: send its writes there that meta does not have
        (a lazy file's are all of them; holes stay holes)."""
        self._inline = None
        saved = self._pos
        try:
            for off, piece in content.patches:
                if not piece:  # a lazy file's extending truncate: only the length grows
                    self._length = max(self._length, off)
                    self._written_end = max(self._written_end, off)
                    continue
                self._pos = off
                await self._write_chunks(memoryview(piece))
        finally:
            self._pos = saved

    async def _leave_inline(self) -> None:
        """A write goes past the inline limit: continue in chunks."""
        content = self._inline
        assert content is not None
        if self._opener is not None:  # lazy: create it in chunks, then write the buffer
            async with self._create_lock:
                if self._opener is not None:
                    rsp = await self._create(None, True)
                    assert rsp.attr is not None
                    self._adopt(rsp.attr, rsp.data)
                    self._length = max(self._length, len(content))
                    if self._inline is not None:  # meta kept it inline after all: migrate it
                        self._inline.buf, self._inline.patches = content.buf, content.patches
                        return await self._leave_inline()
                    await self._to_chunks(content)
                    return
            if self._inline is None:  # created meanwhile (``create_now``), in chunks
                return
            content = self._inline  # created meanwhile, inline: move it like any other
        try:
            moved = await self._meta.migrate(self.inode)  # meta copies its content to chunks
            self._trunc_epoch = max(self._trunc_epoch, moved.trunc_epoch)
        except NotFound:
            # unlinked while open: this object goes on in chunks alone (GC removes them once
            # it closes), starting from everything it has seen and written
            content.patches = [(0, bytearray(content.buf))] if content.buf else []
        await self._to_chunks(content)

    async def _send_inline(self, *, close: bool = False) -> bool:
        """Send this object's unsent writes of an inline file. Returns False when the file
        turned out to be in chunks (the writes were sent there instead, session open)."""
        content = self._inline
        assert content is not None and self._opener is None
        if not content.patches and not close:
            return True
        unsent = list(content.patches)
        patches, crc = content.take_patches()
        try:
            rsp = await self._meta.write_inline(self.inode, self.session_id, patches, crc, close=close)
        except BaseException:
            content.patches = unsent + content.patches
            raise
        if rsp.applied or rsp.attr is None:  # applied, or the file is gone (unlinked)
            return True
        self._trunc_epoch = max(self._trunc_epoch, rsp.trunc_epoch)
        content.patches = unsent + content.patches  # (and any written meanwhile)
        await self._to_chunks(content)
        return False

    async def create_now(self) -> None:
        """A lazy "w" file is created now (with a write session; its bytes are sent at the
        next flush or close), so this client's calls on its path see it: another call on
        the path (stat, rename, unlink, ...) comes first. Under the I/O lock: a create the
        directory answers with chunks writes the buffer into chunk buffers at its offsets
        (moving the position, waiting for budget), which a write meanwhile must not share."""
        if self._opener is None:
            return
        async with self._io_lock:
            if self._opener is not None and not self.closed:
                await self._materialize()

    async def _materialize(self) -> None:
        """Create a lazy file now (with a session); its bytes go at the next flush."""
        async with self._create_lock:
            if self._opener is None:
                return  # created meanwhile
            await self._materialize_locked()

    async def _materialize_locked(self) -> None:
        content = self._inline
        assert content is not None
        rsp = await self._create(None, False)
        assert rsp.attr is not None
        self._adopt(rsp.attr, rsp.data)
        if self._inline is None:
            await self._to_chunks(content)
            return
        self._inline.buf = content.buf
        # the file was emptied by the open: its whole buffer (holes are zeros) is the content
        self._inline.patches = [(0, bytearray(content.buf))] if content.buf else []
        self._length = len(content)

    async def _dispatch(self) -> None:
        """Send the pending chunk buffer in the background (waits for budget first)."""
        if self._ec is not None:
            return await self._ec.dispatch()
        cur, self._cur = self._cur, None
        if cur is None:
            return
        if cur.dirty_bytes == 0:
            self._pool.release(cur.buf)
            return
        try:
            while len(self._flushes) >= FLUSHES_INFLIGHT_MAX:
                await asyncio.wait(list(self._flushes), return_when=asyncio.FIRST_COMPLETED)
            await self._budget.acquire(self._chunk_size)
        except BaseException as exc:
            # cancelled while waiting (a write or seek under asyncio.wait_for, Ctrl-C in the
            # blocking API): the buffer holds bytes of earlier writes that returned, so it is
            # kept to be sent later, not dropped (the length already counts its bytes)
            if self._cur is None:
                self._cur = cur
            else:  # another call buffered meanwhile: never claim these bytes, then
                at = cur.index * self._chunk_size
                self._note_failed(at + cur.start, at + cur.end, exc)
                if self._error is None:
                    self._error = LoomError(f"write of chunk {cur.index} abandoned: {exc!r}", errno=errno.EIO,
                                            path=self.path)
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
            at = cur.index * self._chunk_size
            self._note_written(at + cur.start, at + cur.end)
        except Exception as exc:
            logger.warning("%s: write of chunk %d failed: %s", self.path, cur.index, exc)
            if self._error is None:
                self._error = exc
            at = cur.index * self._chunk_size
            self._note_failed(at + cur.start, at + cur.end, exc)
        finally:
            self._pool.release(cur.buf)
            self._budget.release(self._chunk_size)

    def _flush_done(self, task: asyncio.Task[None], index: int) -> None:
        self._flushes.discard(task)
        if self._last_flush.get(index) is task:
            del self._last_flush[index]

    async def flush(self) -> None:
        """Send buffered data and wait for every in-flight chunk write (a lazy "w" file's
        bytes wait for its close or fsync)."""
        if self.closed:
            return
        async with self._io_lock:  # (an inline file's flush may move it to chunks: a write)
            await self._flush()

    async def _flush(self) -> None:
        if self.closed:
            return
        if self._inline is not None:
            if self._opener is not None or await self._send_inline():
                return
        await self._dispatch()
        while pending := [t for t in self._flushes if not t.done()]:
            await asyncio.wait(pending)
        self._raise_pending()

    @property
    def dirty(self) -> bool:
        if self._inline is not None:
            return bool(self._inline.patches) or self._opener is not None
        return self._cur is not None or any(not t.done() for t in self._flushes) or (
            self._ec is not None and self._ec.buffered)

    async def fsync(self) -> None:
        self._check()
        async with self._io_lock:
            await self._fsync()

    async def _fsync(self) -> None:
        self._check()
        if self._opener is not None:
            await self._materialize()
        await self._flush()
        if self._inline is not None:
            return  # WRITE_INLINE committed the bytes and the length together
        if self.writable:
            rsp = await self._meta.sync(self.inode, self._reported_end(), trunc_epoch=self._trunc_epoch,
                                        session_id=self.session_id)
            if rsp.trunc_epoch > self._trunc_epoch:
                # truncated by someone else since we last heard: what we wrote before this
                # reply was not counted; the length is meta's, and only new writes count
                self._trunc_epoch = rsp.trunc_epoch
                self._written_end = -1
                self._cache.clear()
                if rsp.attr is not None:
                    self._length = rsp.attr.size
                    self._forget_failed_from(rsp.attr.size)
            short = self._short_error()
            if short is not None:
                raise short

    async def truncate(self, size: int | None = None) -> int:
        self._check(write=True)
        async with self._io_lock:
            return await self._truncate(size)

    async def _truncate(self, size: int | None) -> int:
        self._check(write=True)
        size = self._pos if size is None else size
        if size < 0:
            raise InvalidArgument("negative size", path=self.path)
        _check_length(size, self.path)
        if self._opener is not None and self._inline is not None and self._inline.fits(size):
            self._inline.truncate(size, record=True)  # not created yet: the put carries it
            self._length = size
            return size
        if self._opener is not None:
            await self._materialize()
        await self._flush()
        # by inode: this file, whatever its name is now (meta cuts the chunks)
        rsp = await self._meta.setattr(SetattrReq(path=self.path, inode=self.inode, size=size))
        self._trunc_epoch = max(self._trunc_epoch, rsp.trunc_epoch)
        if self._inline is not None:
            if rsp.attr is not None and rsp.attr.inline:
                self._inline.truncate(size)
                self._length = size
                return size
            self._inline = None  # an extend past the limit moved it to chunks
        self._cache.clear()
        self._length = size
        self._forget_failed_from(size)
        if self._written_end >= 0:
            self._written_end = size
        return size

    async def grow(self, size: int) -> int:
        """Make the file at least ``size`` bytes long, writing nothing: fallocate mode 0. Like
        a write that only moves this writer's end (holes read zeros), reported to meta at
        once: meta takes the larger of the file's length and the report, so a file another
        client made longer is not cut and nothing is written over its bytes; a report at an
        older truncate epoch (another client truncated since) does not grow the file (the
        grow then counts as before that truncate) and this writer takes meta's length, as any
        ``fsync`` does. Returns this file's length after."""
        self._check(write=True)
        if size < 0:
            raise InvalidArgument("negative size", path=self.path)
        _check_length(size, self.path)
        async with self._io_lock:
            self._check(write=True)
            if self._inline is not None and not self._inline.fits(size):
                await self._leave_inline()  # past the inline limit: in chunks (no buffer of ``size``)
            if self._inline is not None:
                if size > len(self._inline.buf):  # an empty patch at ``size``: meta's content only grows
                    self._inline.truncate(size, record=True)
            else:
                self._written_end = max(self._written_end, size)
            self._length = max(self._length, size)
        await self.fsync()
        return self._length

    # --- reading ----------------------------------------------------------------------

    async def _flush_for_read(self) -> None:
        """Reads see this file's own writes: what it buffered for chunks is sent first (by
        ``flush``, before the read takes the I/O lock, which ``flush`` takes too)."""
        if self._inline is None and self.dirty:
            await self.flush()

    async def read(self, n: int | None = -1) -> bytes:
        self._check(read=True)
        await self._flush_for_read()
        # under the I/O lock, as writes and seeks: the read starts at the position and moves
        # it, and a write or seek meanwhile must come wholly before or after (session 16 review)
        async with self._io_lock:
            self._check(read=True)
            avail = max(0, self._length - self._pos)
            if n is None or n < 0 or n > avail:
                n = avail
            if n > 0:
                buf = self._pool.acquire(n)
                view = memoryview(buf)[:n]
                got = await self._pread_into(self._pos, view, locked=True)
                self._pos += got
                out = bytes(view[:got])
                view.release()
                self._pool.release(buf)
                return out
            at_end_dirty = self.dirty
        if at_end_dirty:
            await self.flush()
        return b""

    async def readinto(self, b: bytearray | memoryview) -> int:
        self._check(read=True)
        view = memoryview(b)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        await self._flush_for_read()
        async with self._io_lock:
            self._check(read=True)
            got = await self._pread_into(self._pos, view, locked=True)
            self._pos += got
            return got

    async def readline(self, limit: int = -1) -> bytes:
        self._check(read=True)
        await self._flush_for_read()
        async with self._io_lock:
            self._check(read=True)
            return await self._readline(limit)

    async def _readline(self, limit: int) -> bytes:
        out = bytearray()
        buf = self._pool.acquire(READLINE_BLOCK_BYTES)
        view = memoryview(buf)
        while limit < 0 or len(out) < limit:
            want = READLINE_BLOCK_BYTES if limit < 0 else min(READLINE_BLOCK_BYTES, limit - len(out))
            n = await self._pread_into(self._pos, view[:want], locked=True)
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

    async def pread(self, offset: int, into: memoryview, *, readahead: bool = True) -> int:
        """Positional read into ``into``; does not move the file position. ``readahead=False``:
        the read is not taken for part of a sequential stream (many concurrent preads that happen
        to continue each other, e.g. a checkpoint restore, are not staged through read-ahead)."""
        self._check(read=True)
        return await self._pread_into(offset, into, readahead=readahead)

    async def _fetch_chunk(self, index: int, into: memoryview) -> int:
        return await self._storage.read_chunk(self.layout, self.inode, index, 0, len(into), into)

    async def _pread_into(self, pos: int, view: memoryview, *, readahead: bool = True, locked: bool = False) -> int:
        """``locked``: the caller holds the I/O lock (a read at the position)."""
        if self._inline is not None:
            n = self._inline.read_into(pos, view) if pos < self._length else 0
            self.bytes_read += n
            return n
        if self.dirty:  # reads see this file's own writes
            await (self._flush() if locked else self.flush())
        n = min(len(view), self._length - pos)
        if n <= 0:
            return 0
        view = view[:n]
        if self._ec is not None:
            await self._ec.read_into(pos, view)
            self.bytes_read += n
            return n
        if readahead:
            self._streak = self._streak + 1 if pos == self._seq_next else 0
            self._seq_next = pos + n
        cs = self._chunk_size
        # read-ahead serves streams of small reads; a request of a chunk or more already fans
        # out over the stripe straight into the caller's buffer, and staging it through the
        # cache would cost a copy of every byte
        use_cache = readahead and self._streak >= 2 and self._config.readahead_chunks > 0 and n < cs
        pieces = list(split_range(self.layout, pos, n))
        sem = asyncio.Semaphore(max(1, self._config.parallel_chunks_max))

        async def one(index: int, off: int, length: int, boff: int) -> None:
            target = view[boff : boff + length]
            entry: CachedChunk | None = self._cache.get(index)
            if entry is None and use_cache and length < cs:
                entry = self._cache.start(index, self._chunk_length(index), self._fetch_chunk)
            if entry is not None:
                self._cache.hold(entry)  # its buffer stays ours while we wait and copy
                try:
                    await asyncio.shield(entry.task)
                    if off + length <= entry.length:
                        target[:] = memoryview(entry.buf)[off : off + length]
                        return
                except (LoomError, OSError) as exc:
                    logger.debug("%s: read-ahead of chunk %d failed (%s); reading directly", self.path, index, exc)
                    if not entry.dropped:  # (a newer entry of the chunk stays)
                        self._cache.drop(index)
                finally:
                    self._cache.let_go(entry)
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
        async with self._io_lock:
            return await self._seek(offset, whence)

    async def pwrite(self, offset: int, b: bytes | bytearray | memoryview) -> int:
        """A write at ``offset`` (the position ends past it, as ``seek`` then ``write``), in one
        hold of the I/O lock: ``seek`` and ``write`` called one after the other each take it,
        and another task's seek queued on it meanwhile (behind a write waiting for budget)
        came between them, sending this write's bytes to that offset (the mount's WRITEs of
        one file from several descriptors, session 16)."""
        self._check(write=True)
        async with self._io_lock:
            await self._seek(offset, os.SEEK_SET)
            return await self._write(b)

    async def _seek(self, offset: int, whence: int) -> int:
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
        if self.closed and not self._close_unsent:
            self.raise_close_error()
            return
        async with self._io_lock:
            await self._close()

    async def _close(self) -> None:
        if self.closed:
            if self._close_unsent:  # an earlier close stopped before meta's CLOSE answered
                await self._send_close()
                if self.writable and (short := self._short_error()) is not None:
                    raise short
            return  # (closed while this close waited for the lock)
        err: BaseException | None = None
        try:
            if await self._close_inline():
                return
            await self._flush()
        except Exception as exc:
            err = exc
        self.closed = True
        for fetch in self._cache.clear():  # read-ahead still in flight: the client waits for it at close
            if self._background is not None:
                self._background.add(fetch)
                fetch.add_done_callback(self._background.discard)
        if self.session_id:
            if self._written_end < 0 and err is None and self._background is not None:
                # nothing was written: attributes do not change, only the write session
                # ends, so the CLOSE need not be waited for (creates cost one round trip)
                task = asyncio.get_running_loop().create_task(self._close_session())
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            else:
                self._close_unsent = True
                await self._send_close()
        if err is None and self.writable:
            err = self._short_error()
        if err is not None:
            raise err

    @property
    def close_pending(self) -> bool:
        """Closed, but meta's CLOSE (with the length) never answered: ``close()`` sends it again."""
        return self._close_unsent

    async def _send_close(self) -> None:
        """Meta's CLOSE with the length; until it answers, a later ``close()`` sends it again
        (cancelled, or failed: the first one's ``closed`` stops nothing else). A repeated CLOSE
        of a session meta already ended is a length report, which only grows the length."""
        await self._meta.close(self.inode, self.session_id, self._reported_end(), trunc_epoch=self._trunc_epoch)
        self._close_unsent = False

    def raise_close_error(self) -> None:
        """Raise (once) the error the client's close of this file met."""
        if self.close_error is not None:
            exc, self.close_error = self.close_error, None
            raise exc

    async def _close_inline(self) -> bool:
        """Close an inline file in one round trip: a lazy file's put, or the last writes with
        the session's end. Returns True when closed; False: the file is in chunks, close on."""
        content = self._inline
        if content is None:
            return False
        if self._opener is not None:
            async with self._create_lock:
                if self._opener is not None:
                    rsp = await self._create(bytes(content.buf), False)
                    assert rsp.attr is not None
                    if rsp.attr.inline and not rsp.session_id:
                        self._finish_close()
                        return True
                    self._adopt(rsp.attr, rsp.data)  # too big for the directory's limit: chunks
                    self._inline = None
                    await self._to_chunks(content)
                    return False
            content = self._inline  # created meanwhile (``create_now``)
            if content is None:
                return False
        if not self.session_id or not content.patches:
            return False  # nothing to send: the session ends in the background
        if await self._send_inline(close=True):
            self._finish_close()
            return True
        return False

    def _finish_close(self) -> None:
        self.closed = True
        self._cache.clear()
        self._inline = None

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


def _check_length(end: int, path: str) -> None:
    """EFBIG for a write or size past the largest file length (meta refuses it too)."""
    if end > FILE_BYTES_MAX:
        raise LoomError(f"{end} bytes: past the largest file length ({FILE_BYTES_MAX})", errno=errno.EFBIG, path=path)
