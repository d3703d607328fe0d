"""Directories, listings, removes and renames of ``LoomFileSystem``.

Listings come with attributes in the same READDIR pages; ``find`` lists each level's
directories concurrently; ``rm`` of many files is one UNLINK_MANY; ``mv`` is a native
rename (a directory moves in one step, whatever it holds).
"""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import AsyncIterator
from glob import has_magic
from typing import Any

from loomfs.errors import IsADirectory
from loomfs.fsspec._base import LoomBase, on_core_loop

LIST_INFLIGHT = 32  # directory listings in flight in one find
RMTREE_INFLIGHT = 64  # directory trees removed at once by one rm


class NamespaceOps(LoomBase):
    # --- directories --------------------------------------------------------------------

    @on_core_loop
    async def _ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        p = self._strip_protocol(path)
        try:
            entries = await self.core.scandir(p, with_attrs=detail)
        except NotADirectoryError:  # a file lists as itself
            attr = await self.core.lstat(p)
            return (await self._resolve_links([self._info_of(p, attr)])) if detail else [p]
        base = p if p.endswith("/") else p + "/"
        if not detail:
            return [base + e.name for e in entries]
        infos = []
        for e in entries:
            child = base + e.name
            attr = e.attr if e.attr is not None else await self.core.lstat(child)
            infos.append(self._info_of(child, attr))
        return await self._resolve_links(infos)

    async def _walk(self, path: str, maxdepth: int | None = None, topdown: bool = True,
                    on_error: Any = "omit", **kwargs: Any) -> AsyncIterator[Any]:
        """Like fsspec's walk; symlinked directories are listed, not descended into."""
        if maxdepth is not None and maxdepth < 1:
            raise ValueError("maxdepth must be at least 1")
        detail = kwargs.pop("detail", False)
        top = self._strip_protocol(path)
        try:
            listing = await self._ls(top, detail=True)
        except OSError as exc:
            if on_error == "raise":
                raise
            if callable(on_error):
                on_error(exc)
            yield (top, {}, {}) if detail else (top, [], [])
            return
        dirs: dict[str, Any] = {}
        files: dict[str, Any] = {}
        for info in listing:
            name = info["name"].rsplit("/", 1)[-1]
            if info["name"] == top:
                files[""] = info
            elif info["type"] == "directory":
                dirs[name] = info
            else:
                files[name] = info
        item = (top, dirs, files) if detail else (top, list(dirs), list(files))
        if topdown:
            yield item
        if maxdepth is None or maxdepth > 1:
            for info in dirs.values():
                if info["islink"]:
                    continue
                async for sub in self._walk(info["name"], None if maxdepth is None else maxdepth - 1,
                                            topdown, on_error, detail=detail):
                    yield sub
        if not topdown:
            yield item

    @on_core_loop
    async def _find(self, path: str, maxdepth: int | None = None, withdirs: bool = False, **kwargs: Any) -> Any:
        """Everything below ``path``, listing each level's directories concurrently."""
        if maxdepth is not None and maxdepth < 1:
            raise ValueError("maxdepth must be at least 1")
        detail = kwargs.pop("detail", False)
        top = self._strip_protocol(path)
        out: dict[str, dict[str, Any]] = {}
        try:
            info = await self._info(top)
        except (FileNotFoundError, NotADirectoryError):
            info = None
        if info is not None and info["type"] != "directory":
            out[top] = info
        elif info is not None:
            if withdirs:
                out[top] = info
            level, depth = [top], 1
            slots = asyncio.Semaphore(LIST_INFLIGHT)

            async def listing(d: str) -> list[dict[str, Any]]:
                async with slots:
                    try:
                        return await self._ls(d, detail=True)
                    except (FileNotFoundError, NotADirectoryError):
                        return []  # gone meanwhile

            while level and (maxdepth is None or depth <= maxdepth):
                below = []
                for infos in await asyncio.gather(*(listing(d) for d in level)):
                    for i in infos:
                        if i["type"] == "directory":
                            if withdirs:
                                out[i["name"]] = i
                            if not i["islink"]:
                                below.append(i["name"])
                        else:
                            out[i["name"]] = i
                level, depth = below, depth + 1
        names = sorted(out)
        return {n: out[n] for n in names} if detail else names

    @on_core_loop
    async def _du(self, path: str, total: bool = True, maxdepth: int | None = None,
                  withdirs: bool = False, **kwargs: Any) -> Any:
        found = await self._find(path, maxdepth=maxdepth, withdirs=withdirs, detail=True)
        sizes = {n: i["size"] for n, i in found.items()}
        return sum(sizes.values()) if total else sizes

    @on_core_loop
    async def _mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        p = self._strip_protocol(path)
        await self.core.mkdir(p, parents=create_parents, exist_ok=False)

    @on_core_loop
    async def _makedirs(self, path: str, exist_ok: bool = False) -> None:
        await self.core.makedirs(self._strip_protocol(path), exist_ok=exist_ok)

    @on_core_loop
    async def _rmdir(self, path: str) -> None:
        await self.core.rmdir(self._strip_protocol(path))

    def rmdir(self, path: str) -> None:
        self.loom.rmdir(self._strip_protocol(path))

    # --- removing and moving ------------------------------------------------------------

    @on_core_loop
    async def _rm_file(self, path: str, **kwargs: Any) -> None:
        await self.core.unlink(self._strip_protocol(path))

    @on_core_loop
    async def _rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None, **kwargs: Any) -> None:
        """Remove files (one UNLINK_MANY for all of them) and, with ``recursive``,
        directories with everything in them; with ``maxdepth`` too, only what ``find``
        lists to that depth, directories with rmdir from the deepest up (one that still
        holds deeper entries raises ``OSError(ENOTEMPTY)``, as in fsspec's memory
        filesystem)."""
        if isinstance(path, str) and recursive and maxdepth is None and not has_magic(path):
            await self.core.rm(self._strip_protocol(path), recursive=True)  # native rmtree
            return
        paths = await self._expand_path(path, recursive=recursive, maxdepth=maxdepth)
        results = await self.core.rm_many(paths)
        dirs = []
        for p, r in zip(paths, results, strict=True):
            if isinstance(r, IsADirectoryError):
                dirs.append(p)
            elif isinstance(r, FileNotFoundError) and recursive:
                continue  # under a directory removed with it, or gone meanwhile
            elif r is not None:
                raise r
        if dirs and not recursive:
            raise IsADirectory("is a directory (use recursive=True)", path=dirs[0])
        if maxdepth is not None:
            for d in sorted(dirs, reverse=True):  # children sort after their parents
                try:
                    await self.core.rmdir(d)
                except FileNotFoundError:
                    pass
            return
        tops: list[str] = []
        for d in sorted(dirs):  # parents sort before their children
            if not any(d.startswith(t.rstrip("/") + "/") for t in tops):
                tops.append(d)
        slots = asyncio.Semaphore(RMTREE_INFLIGHT)

        async def rmtree(d: str) -> None:
            async with slots:
                try:
                    await self.core.rmtree(d)
                except FileNotFoundError:
                    pass

        await asyncio.gather(*(rmtree(d) for d in tops))

    @on_core_loop
    async def _mv(self, path1: Any, path2: Any, recursive: bool = False, maxdepth: int | None = None,
                  **kwargs: Any) -> None:
        """Native renames (a directory moves with one rename, whatever its size): onto
        ``path2``, or into it when it is an existing directory or ends with '/'; a directory
        named with a trailing '/' moves its contents into ``path2`` (as fsspec's ``cp``); a
        glob or list of sources moves each into the directory ``path2``."""
        if isinstance(path1, list) and isinstance(path2, list):
            pairs = list(zip(self._strip_protocol(path1), self._strip_protocol(path2), strict=True))
        elif isinstance(path1, str) and not has_magic(path1):
            src, dst = self._strip_protocol(path1), self._strip_protocol(path2)
            if src == dst:
                return
            if str(path1).endswith("/") and src != "/" and await self._isdir(src):
                await self._mv_contents(src, dst)
                return
            if str(path2).endswith("/") or await self._isdir(dst):
                dst = posixpath.join(dst, posixpath.basename(src))
            pairs = [(src, dst)]
        else:
            srcs = await self._glob(path1) if isinstance(path1, str) else self._strip_protocol(list(path1))
            if not srcs:
                raise FileNotFoundError(path1)
            dst_dir = self._strip_protocol(path2)
            await self.core.makedirs(dst_dir, exist_ok=True)
            pairs = [(s, posixpath.join(dst_dir, posixpath.basename(s))) for s in srcs]
        for src, dst in pairs:
            await self._with_parent(dst, lambda s=src, d=dst: self.core.rename(s, d))  # type: ignore[misc]

    async def _mv_contents(self, src: str, dst: str) -> None:
        """``mv("a/", dst)``: what directory ``a`` holds moves into ``dst`` (made when
        missing), one rename per entry, and ``a`` goes, as fsspec's copy-then-remove does
        with a source that ends with '/'."""
        names = await self._ls(src, detail=False)
        await self.core.makedirs(dst, exist_ok=True)
        for name in names:
            await self.core.rename(name, posixpath.join(dst, posixpath.basename(name)))
        await self.core.rmdir(src)

    def mv(self, path1: Any, path2: Any, recursive: bool = False, maxdepth: int | None = None,
           **kwargs: Any) -> None:
        self.loom.run(self._mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs))

    @on_core_loop
    async def _mv_file(self, path1: str, path2: str) -> None:
        await self._mv(path1, path2)
