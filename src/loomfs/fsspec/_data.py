"""Reading and writing through ``LoomFileSystem``: whole files, byte ranges, transfers to
and from local disk, file objects.

Multi-path calls use the client's batch requests: ``cat`` of many files is READ_MANY,
``pipe`` of many is PUT_MANY, ``cat_ranges`` over many files asks STAT_MANY which are small
and reads those whole in one READ_MANY. Big files move in ``_transfer.BLOCK_BYTES`` steps.
"""

from __future__ import annotations

import asyncio
import errno
import os
import posixpath
from glob import has_magic
from typing import Any

from fsspec.callbacks import DEFAULT_CALLBACK
from fsspec.utils import isfilelike

from loomfs.errors import IsADirectory
from loomfs.fsspec import _transfer as xfer
from loomfs.fsspec._base import LoomBase, on_core_loop
from loomfs.fsspec._file import AsyncLoomFile, LoomBufferedFile, temp_name
from loomfs.wire.types import FileType

FILES_INFLIGHT = 64  # files opened at once by one cat_ranges


class DataOps(LoomBase):
    # --- reading ------------------------------------------------------------------------

    @on_core_loop
    async def _cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        p = self._strip_protocol(path)
        if not start and end is None:
            return await self.core.cat(p)  # one READ for an inline file
        got = (await xfer.read_ranges(self.core, p, [(start, end)]))[0]
        if isinstance(got, BaseException):
            raise got
        return bytes(got)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        if not start and end is None:
            return self.loom.cat(self._strip_protocol(path))  # on the caller's thread when it can
        return self.loom.run(self._cat_file(path, start, end, **kwargs))

    @on_core_loop
    async def _cat(self, path: Any, recursive: bool = False, on_error: str = "raise",
                   batch_size: int | None = None, **kwargs: Any) -> Any:
        """Whole files by READ_MANY (one meta round trip for any number of small files)."""
        if isinstance(path, list) and not recursive and not any(has_magic(p) for p in path):
            paths = list(dict.fromkeys(self._strip_protocol(path)))  # no expansion to do
        else:
            paths = await self._expand_path(path, recursive=recursive)
        if kwargs.get("start") is not None or kwargs.get("end") is not None:
            out: list[Any] = await self._cat_ranges(paths, kwargs.get("start"), kwargs.get("end"))
        elif len(paths) == 1:
            try:
                out = [await self.core.cat(paths[0])]
            except OSError as exc:
                out = [exc]
        else:
            out = list(await self.core.read_many(paths))
        if recursive:  # directories the expansion listed are not files to read
            keep = [i for i, r in enumerate(out) if not isinstance(r, IsADirectoryError)]
            paths, out = [paths[i] for i in keep], [out[i] for i in keep]
        if on_error == "raise":
            for r in out:
                if isinstance(r, BaseException):
                    raise r
        if not paths or len(paths) > 1 or isinstance(path, list) or paths[0] != self._strip_protocol(path):
            return {k: v for k, v in zip(paths, out, strict=True)
                    if on_error != "omit" or not isinstance(v, BaseException)}
        return out[0]

    @on_core_loop
    async def _cat_ranges(self, paths: list[str], starts: Any, ends: Any, max_gap: int | None = None,
                          batch_size: int | None = None, on_error: str = "return", **kwargs: Any) -> list[Any]:
        """Byte ranges of one or many files. Each file is opened once and its ranges read
        concurrently; with many files, one STAT_MANY finds the small ones, which come whole
        in one READ_MANY and are sliced here."""
        if not isinstance(paths, list):
            raise TypeError("paths must be a list")
        n = len(paths)
        starts = list(starts) if isinstance(starts, list | tuple) else [starts] * n
        ends = list(ends) if isinstance(ends, list | tuple) else [ends] * n
        if len(starts) != n or len(ends) != n:
            raise ValueError("paths, starts and ends must have the same length")
        ps = self._strip_protocol(paths)
        by_path: dict[str, list[int]] = {}
        for i, p in enumerate(ps):
            by_path.setdefault(p, []).append(i)
        out: list[Any] = [None] * n
        opened = list(by_path)
        if len(by_path) > 1:
            small = []
            opened = []
            attrs = await self.core.stat_many(list(by_path))
            for p, a in zip(by_path, attrs, strict=True):
                if isinstance(a, BaseException):
                    for i in by_path[p]:
                        out[i] = a
                elif a.type == FileType.FILE and a.size <= xfer.WHOLE_READ_MAX_BYTES:
                    small.append(p)
                else:
                    opened.append(p)
            if small:
                for p, data in zip(small, await self.core.read_many(small), strict=True):
                    for i in by_path[p]:
                        if isinstance(data, BaseException):
                            out[i] = data
                        else:
                            s, e = xfer.clamp_range(starts[i], ends[i], len(data))
                            out[i] = data[s:e]
        slots = asyncio.Semaphore(FILES_INFLIGHT)

        async def one_file(p: str) -> None:
            idx = by_path[p]
            async with slots:
                got = await xfer.read_ranges(self.core, p, [(starts[i], ends[i]) for i in idx])
            for i, r in zip(idx, got, strict=True):
                out[i] = r

        await asyncio.gather(*(one_file(p) for p in opened))
        if on_error != "return":
            for r in out:
                if isinstance(r, BaseException):
                    raise r
        return out

    @on_core_loop
    async def _get_file(self, rpath: str, lpath: Any, callback: Any = DEFAULT_CALLBACK,
                        outfile: Any = None, **kwargs: Any) -> None:
        rp = self._strip_protocol(rpath)
        out = lpath if isfilelike(lpath) else (outfile if outfile is not None else str(lpath))

        def progress(n: int, size: int) -> None:
            callback.set_size(size)
            callback.relative_update(n)

        try:
            await xfer.get_file(self.core, rp, out, progress)
        except IsADirectory:  # the remote path (a local EISDIR is the builtin error)
            if isinstance(out, str):  # a directory in a recursive get
                await asyncio.to_thread(os.makedirs, out, exist_ok=True)
                return
            raise

    # --- writing ------------------------------------------------------------------------

    @staticmethod
    def _write_mode(mode: str) -> str:
        if mode not in ("overwrite", "create"):
            raise ValueError(f"mode must be 'overwrite' or 'create', not {mode!r}")
        return "xb" if mode == "create" else "wb"

    @on_core_loop
    async def _pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        p = self._strip_protocol(path)
        wmode = self._write_mode(mode)
        await self._with_parent(p, lambda: xfer.write_whole(self.core, p, value, wmode))

    @on_core_loop
    async def _pipe(self, path: Any, value: Any = None, batch_size: int | None = None,
                    mode: str = "overwrite", **kwargs: Any) -> None:
        """Many files in PUT_MANY requests (one round trip for many small ones)."""
        items = {path: value} if isinstance(path, str) else dict(path)
        if len(items) == 1 or mode != "overwrite":
            await asyncio.gather(*(self._pipe_file(k, v, mode=mode) for k, v in items.items()))
            return
        todo = [(self._strip_protocol(k), v) for k, v in items.items()]
        results = await self.core.put_many(todo)
        missing = [(p, v) for (p, v), r in zip(todo, results, strict=True) if isinstance(r, FileNotFoundError)]
        if missing and self.auto_mkdir:
            parents = sorted({posixpath.dirname(p) for p, _ in missing})
            await asyncio.gather(*(self.core.makedirs(d, exist_ok=True) for d in parents))
            again = await self.core.put_many(missing)
            results = [r for r in results if not isinstance(r, FileNotFoundError)] + list(again)
        for r in results:
            if r is not None:
                raise r

    @on_core_loop
    async def _put_file(self, lpath: str, rpath: str, mode: str = "overwrite",
                        callback: Any = DEFAULT_CALLBACK, **kwargs: Any) -> None:
        rp = self._strip_protocol(rpath)
        wmode = self._write_mode(mode)
        size, content = await asyncio.to_thread(xfer.load_local, os.fspath(lpath))
        if content is None:  # a directory
            await self.core.makedirs(rp, exist_ok=True)
            return
        callback.set_size(size)
        if isinstance(content, bytes):
            await self._with_parent(rp, lambda: xfer.write_whole(self.core, rp, content, wmode))
            callback.relative_update(len(content))
            return
        try:
            await self._parent_made(rp)
        except BaseException:
            await asyncio.to_thread(content.close)
            raise
        await xfer.put_file(self.core, content, rp, wmode, lambda n, _s: callback.relative_update(n))

    @on_core_loop
    async def _cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        src, dst = self._strip_protocol(path1), self._strip_protocol(path2)
        try:
            await self._with_parent(dst, lambda: xfer.copy_file(self.core, src, dst))
        except IsADirectory:
            if await self._type(src) != FileType.DIRECTORY:
                raise
            await self.core.makedirs(dst, exist_ok=True)  # a directory in a recursive copy

    @on_core_loop
    async def _touch(self, path: str, truncate: bool = True, **kwargs: Any) -> None:
        p = self._strip_protocol(path)
        if not truncate and await self._exists(p):
            await self.core.utime(p)
            return
        await self._pipe_file(p, b"")

    def touch(self, path: str, truncate: bool = True, **kwargs: Any) -> None:
        self.loom.run(self._touch(path, truncate=truncate, **kwargs))

    # --- file objects -------------------------------------------------------------------

    def _open(self, path: str, mode: str = "rb", block_size: int | None = None, autocommit: bool = True,
              cache_options: dict[str, Any] | None = None, **kwargs: Any) -> LoomBufferedFile:
        """A file object. In a transaction (``autocommit=False``) a new file ("w" and "x"
        modes) is written under a temporary name that ``commit()`` renames into place ("x":
        only if the target still does not exist); other modes ("a", "r+") change the file
        in place at once, as fsspec's local filesystem does.

        ``block_size`` and ``cache_type`` (with ``cache_options``) are honoured as fsspec's
        buffered files honour them: without a ``cache_type`` (or with "none") reads go
        straight through the client's file, with its own read-ahead (the fast path); with one
        (``"readahead"``, ``"bytes"``, ``"first"``, ``"all"``, ``"blockcache"``, ...) a read-only
        file reads through that fsspec cache of ``block_size`` blocks fetched with ranged
        ``cat_file`` calls (a pyarrow footer cached by ``"first"``, say)."""
        p = self._strip_protocol(path)
        if block_size is not None and (not isinstance(block_size, int) or block_size <= 0):
            raise ValueError(f"block_size must be a positive number of bytes, not {block_size!r}")
        cache_type = kwargs.get("cache_type")
        cache_class = None
        if cache_type not in (None, "none"):
            from fsspec.caching import caches
            cache_class = caches.get(cache_type)
            if cache_class is None:
                raise ValueError(f"cache_type {cache_type!r} is not one of fsspec's: {sorted(k for k in caches if k)}")
        temp = None
        if "r" not in mode:
            if self.auto_mkdir:
                self.loom.run(self._parent_made(p))
            if not autocommit and ("w" in mode or "x" in mode):
                if "x" in mode and self.loom.exists(p):
                    raise FileExistsError(errno.EEXIST, "file exists", p)
                temp = temp_name(p)
        raw = self.loom.open(p if temp is None else temp, mode)
        if "a" in mode:
            try:
                raw.seek(0, os.SEEK_END)  # tell() is the file's size, as with open()
            except BaseException:
                raw.close()
                raise
        f = LoomBufferedFile(self, p, mode, raw, autocommit=autocommit, temp_path=temp)
        if block_size is not None:
            f.blocksize = block_size
        if cache_class is not None and f._read_only:  # noqa: SLF001  (this layer's own file)
            try:
                f.cache = cache_class(f.blocksize, f._fetch_range, f.size, **(cache_options or {}))  # noqa: SLF001
            except BaseException:
                f.close()
                raise
        return f

    async def open_async(self, path: str, mode: str = "rb", **kwargs: Any) -> AsyncLoomFile:
        if "b" not in mode or kwargs.get("compression"):
            raise ValueError("open_async supports binary modes without compression")
        return await self._open_async(self._strip_protocol(path), mode)

    @on_core_loop
    async def _open_async(self, p: str, mode: str) -> AsyncLoomFile:
        if "r" not in mode:
            await self._parent_made(p)
        af = await self.core.open(p, mode)
        if "a" in mode:
            try:
                await af.seek(0, os.SEEK_END)  # tell() is the file's size, as with open()
            except BaseException:
                await af.close()
                raise
        return AsyncLoomFile(self, p, mode, af)
