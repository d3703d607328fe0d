"""File objects of the fsspec layer.

``LoomBufferedFile`` is what ``fs.open()`` returns: the blocking client's own file object
(``loomfs.client.syncfile.LoomFile``: one OPEN, then chunk reads straight from storage with
the client's read-ahead, or write-back of whole chunks), with the attributes fsspec users
expect (``fs``, ``path``, ``size``, ``details``, ``loc``) and transactions: a new file ("w",
"x") opened with ``autocommit=False`` is written under a temporary name that ``commit()``
renames into place in one step (readers never see half a file; "x" refuses to replace a
file) and ``discard()`` removes; "a" and "r+" change the file in place, as in fsspec's
local filesystem.

``AsyncLoomFile`` is what ``await fs.open_async()`` returns: the async core's file, usable
from any event loop.
"""

from __future__ import annotations

import asyncio
import io
import os
import posixpath
import secrets
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from loomfs.client.file import AsyncFile

if TYPE_CHECKING:
    from loomfs.fsspec._filesystem import LoomFileSystem

T = TypeVar("T")

TEMP_INFIX = ".loomfs-"  # a transaction's file is ".<name>.loomfs-<12 hex digits>" until commit


def temp_name(path: str) -> str:
    """Where a transaction writes ``path`` until its commit (same directory, hidden name;
    ``loomfs.torch.files`` leaves such names out of a dataset)."""
    head, name = posixpath.split(path)
    return posixpath.join(head, f".{name}{TEMP_INFIX}{secrets.token_hex(6)}")


class LoomBufferedFile(io.BufferedIOBase):
    """A binary LoomFS file opened through fsspec (see the module docstring)."""

    cache: Any  # set only with a cache_type, or by a caching layer: reads go through it

    def __init__(self, fs: LoomFileSystem, path: str, mode: str, raw: Any, *,
                 autocommit: bool = True, temp_path: str | None = None):
        super().__init__()
        self.fs = fs
        self.path = path
        self.mode = mode
        self.autocommit = autocommit
        self.blocksize = fs.blocksize
        self._raw = raw  # loomfs.client.syncfile.LoomFile
        self._temp_path = temp_path  # written here until commit() (autocommit=False)
        self._details: dict[str, Any] | None = None
        self._pid = os.getpid()  # a forked child's copy of this object never touches the file

    # what fsspec's AbstractBufferedFile offers
    @property
    def name(self) -> str:
        return self.path

    @property
    def size(self) -> int:
        """The file's length as this object knows it (at open, grown by its writes)."""
        length = getattr(self._raw, "length", None)
        if length is None:  # a relaxed read served from the caches (an in-memory file)
            with self._raw.getbuffer() as view:
                return int(view.nbytes)
        return int(length)

    @property
    def details(self) -> dict[str, Any]:
        if self._details is None:
            self._details = self.fs.info(self.path if self._temp_path is None else self._temp_path)
        return self._details

    @property
    def loc(self) -> int:
        return self.tell()

    @property
    def full_name(self) -> str:
        return str(self.fs.unstrip_protocol(self.path))

    def info(self) -> dict[str, Any]:
        return self.details

    @property
    def closed(self) -> bool:
        return bool(io.BufferedIOBase.closed.__get__(self))

    @closed.setter
    def closed(self, value: bool) -> None:
        """fsspec's caching layers set ``f.closed = True`` after closing (a file of theirs)."""
        if value and not self.closed:
            LoomBufferedFile.close(self)

    # io capabilities
    def readable(self) -> bool:
        return bool(self._raw.readable())

    def writable(self) -> bool:
        return bool(self._raw.writable())

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        raise io.UnsupportedOperation("LoomFS files have no OS file descriptor")

    def isatty(self) -> bool:
        return False

    @property
    def _io(self) -> Any:
        """The raw file to use in this process: a forked child (a DataLoader worker given a
        file its parent opened, inside a pyarrow ParquetFile say) cannot use the parent's
        handle, so a file open for reading opens the path again at the same position (as
        fsspec's buffered files, which hold no handle, just work); a written one raises the
        client's error (its bytes are the parent's to write)."""
        if self._pid != os.getpid() and self._read_only and not self.closed:
            pos = self._raw.tell()  # the position is kept locally
            raw = self.fs.loom.open(self.path, self.mode)
            try:
                raw.seek(pos)
            except BaseException:
                raw.close()
                raise
            self._raw, self._pid = raw, os.getpid()  # the parent's handle: never closed here
        return self._raw

    @property
    def _read_only(self) -> bool:
        return "r" in self.mode and "+" not in self.mode

    # what fsspec's caching layers use (``blockcache::loom://...`` sets ``f.cache`` to an
    # MMapCache over ``_fetch_range`` and reads through it)
    def _fetch_range(self, start: int, end: int) -> bytes:
        return bytes(self.fs.cat_file(self.path, start, end))

    def _cached_read(self, cache: Any, size: int | None) -> bytes:
        pos = self.tell()
        end = self.size if size is None or size < 0 else min(self.size, pos + size)
        if end <= pos:
            return b""
        data = bytes(cache._fetch(pos, end))
        self._io.seek(pos + len(data))
        return data

    # reading
    def read(self, size: int | None = -1) -> bytes:
        cache = self.__dict__.get("cache")
        if cache is not None:
            return self._cached_read(cache, size)
        return bytes(self._io.read(size))

    def read1(self, size: int = -1) -> bytes:
        return self.read(size)

    def readinto(self, b: Any) -> int:
        if self.__dict__.get("cache") is not None:
            view = memoryview(b).cast("B")
            data = self.read(len(view))
            view[:len(data)] = data
            return len(data)
        return int(self._io.readinto(b))

    def readinto1(self, b: Any) -> int:
        return self.readinto(b)

    def readline(self, size: int | None = -1) -> bytes:
        if self.__dict__.get("cache") is not None:  # through the cache, as read() goes
            line = self.readuntil(b"\n")
            if size is not None and 0 <= size < len(line):
                self.seek(self.tell() - len(line) + size)
                return line[:size]
            return line
        return bytes(self._io.readline(size))

    def readuntil(self, char: bytes = b"\n", blocks: int | None = None) -> bytes:
        """Read up to and including ``char`` (fsspec's AbstractBufferedFile has it)."""
        out = bytearray()
        step = blocks or self.blocksize
        while True:
            start = self.tell()
            part = self.read(step)
            if not part:
                return bytes(out)
            i = part.find(char)
            if i >= 0:
                out += part[: i + len(char)]
                self.seek(start + i + len(char))
                return bytes(out)
            out += part

    # writing
    def write(self, b: Any) -> int:
        return int(self._raw.write(b))

    def truncate(self, size: int | None = None) -> int:
        return int(self._raw.truncate(size))

    def flush(self) -> None:
        # close() closes the raw file first, then io's close flushes: a closed raw file
        # (a relaxed read's in-memory CachedFile raises on flush once closed) has nothing to flush
        if not self.closed and not self._raw.closed:
            self._raw.flush()

    def fsync(self) -> None:
        self._raw.fsync()

    # position
    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return int(self._io.seek(offset, whence))

    def tell(self) -> int:
        return int(self._raw.tell())  # kept locally: no need to reopen in a forked child

    # lifetime
    def close(self) -> None:
        if self.closed:
            return
        try:
            self._raw.close()
        finally:
            super().close()

    def commit(self) -> None:
        """Move a transaction's file into place (one rename; for "x", one that refuses to
        replace a file made since the open: FileExistsError, and the temporary file goes)."""
        if self._temp_path is None:
            return
        self.close()
        try:
            self.fs.loom.rename(self._temp_path, self.path, no_replace="x" in self.mode)
        except FileExistsError:
            self.discard()
            raise
        self._temp_path = None
        self._details = None

    def discard(self) -> None:
        """Drop a transaction's file."""
        if self._temp_path is None:
            return
        try:
            self.close()
        finally:
            try:
                self.fs.loom.unlink(self._temp_path)
            except FileNotFoundError:
                pass
            self._temp_path = None

    def __del__(self) -> None:
        temp = getattr(self, "_temp_path", None)
        # uncommitted, and no one can commit it now: remove the temporary, best effort, and only
        # in the process that opened it (a forked child's copy is the parent's file, which the
        # parent may still commit), never at interpreter exit, and never through a new client
        # (``fs.loom`` reconnects a closed shared client: at exit that blocked for ever)
        if temp is not None and getattr(self, "_pid", None) == os.getpid() and not sys.is_finalizing():
            loom = self.fs._loom
            if not loom.closed:
                try:
                    self.close()
                    loom.unlink(temp)
                except Exception:  # noqa: S110 - best effort (on the loop thread, gone already...)
                    pass
                self._temp_path = None
        super().__del__()

    def __reduce__(self) -> Any:
        """A file open for reading pickles as (filesystem, path, position), as fsspec's
        AbstractBufferedFile does: the copy (a DataLoader worker's) opens the file again and
        seeks there. A file open for writing does not pickle."""
        if not self._read_only:
            raise TypeError(f"a LoomFS file open for writing (mode {self.mode!r}) cannot be pickled")
        if self.closed:
            raise ValueError("a closed LoomFS file cannot be pickled")
        return _reopen, (self.fs, self.path, self.mode, self.tell())

    def __repr__(self) -> str:
        return f"<LoomBufferedFile {self.fs.unstrip_protocol(self.path)} mode={self.mode!r} closed={self.closed}>"


def _reopen(fs: LoomFileSystem, path: str, mode: str, loc: int) -> LoomBufferedFile:
    f = fs.open(path, mode)
    f.seek(loc)
    return f


class AsyncLoomFile:
    """``open_async``: the async core's file object, awaited from any event loop (calls hop
    to the client's loop when the caller runs on another one)."""

    def __init__(self, fs: LoomFileSystem, path: str, mode: str, afile: AsyncFile):
        self.fs = fs
        self.path = path
        self.mode = mode
        self._af = afile
        self._loop = fs.loop

    async def _call(self, make: Callable[[], Awaitable[T]]) -> T:
        if asyncio.get_running_loop() is self._loop:
            return await make()

        async def run() -> T:
            return await make()

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run(), self._loop))

    @property
    def size(self) -> int:
        return self._af.length

    @property
    def closed(self) -> bool:
        return self._af.closed

    async def read(self, length: int = -1) -> bytes:
        return await self._call(lambda: self._af.read(length))

    async def readinto(self, b: Any) -> int:
        return await self._call(lambda: self._af.readinto(b))

    async def write(self, data: bytes | bytearray | memoryview) -> int:
        return await self._call(lambda: self._af.write(data))

    async def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return await self._call(lambda: self._af.seek(offset, whence))

    def tell(self) -> int:
        return self._af.tell()

    async def flush(self) -> None:
        await self._call(self._af.flush)

    async def close(self) -> None:
        await self._call(self._af.close)

    async def __aenter__(self) -> AsyncLoomFile:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<AsyncLoomFile {self.path} mode={self.mode!r} closed={self.closed}>"
