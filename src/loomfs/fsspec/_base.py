"""The base of ``LoomFileSystem``: the client it runs on, ``loom://`` URLs, attributes.

Every coroutine runs on the event loop of the blocking client (``LoomFS``, thread
``loomfs-io``) that the filesystem wraps: ``fs.loop`` is that loop, so the sync twins
submit there (``loomfs.fsspec._bridge``), and a coroutine awaited on another loop
(``asynchronous=True``) hops to it (``on_core_loop``). The loop and client are looked up on
each use, so after ``os.fork`` (DataLoader workers) the child's first call starts its own
(``LoomFS._ensure``).
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import hashlib
import posixpath
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Self, TypeVar

from fsspec.asyn import AsyncFileSystem
from fsspec.utils import stringify_path

from loomfs.client.core import TYPE_NAMES, AsyncClient, info_of
from loomfs.client.sync import LoomFS, resolve_mgmtd
from loomfs.config import ClientConfig
from loomfs.fsspec import _bridge
from loomfs.fsspec import _transfer as xfer
from loomfs.fsspec._urls import (
    PREFIX,
    PROTOCOL,
    resolve_cluster,
    shared_client,
    strip_path,
    url_options,
)
from loomfs.wire.types import Attr, FileType

F = TypeVar("F", bound=Callable[..., Coroutine[Any, Any, Any]])



def on_core_loop(fn: F) -> F:
    """Run the coroutine on the client's loop; awaited from another loop, hop there."""

    @functools.wraps(fn)
    async def run(self: LoomBase, *args: Any, **kwargs: Any) -> Any:
        loop = self.loop
        if asyncio.get_running_loop() is loop:
            return await fn(self, *args, **kwargs)
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(fn(self, *args, **kwargs), loop))

    return run  # type: ignore[return-value]


class LoomBase(AsyncFileSystem):
    """What every part of ``LoomFileSystem`` builds on (see that class)."""

    protocol = PROTOCOL
    mirror_sync_methods = False  # __init__ makes the sync twins, over LoomFS's bridge
    root_marker = "/"
    sep = "/"
    blocksize = xfer.BLOCK_BYTES

    def __init__(
        self,
        cluster: str | None = None,
        *,
        consistency: str | None = None,
        config: ClientConfig | None = None,
        auto_mkdir: bool = True,
        client: LoomFS | None = None,
        asynchronous: bool = False,
        loop: asyncio.AbstractEventLoop | None = None,
        batch_size: int | None = None,
        **kwargs: Any,
    ):
        self._shared: tuple[str, str | None, ClientConfig | None] | None = None
        if client is None:
            mgmtd = resolve_cluster(cluster)
            self._shared = (mgmtd, consistency, config)
            client = shared_client(*self._shared)
        else:
            try:
                mgmtd = resolve_mgmtd(client.address)
            except ValueError:
                mgmtd = ""
        self._loom: LoomFS = client
        self.mgmtd = mgmtd
        self.auto_mkdir = auto_mkdir
        self._options = {  # what a pickle carries (None: left out)
            "cluster": mgmtd or cluster, "consistency": consistency, "config": config,
            "auto_mkdir": auto_mkdir, "asynchronous": asynchronous or None, "batch_size": batch_size,
        }
        super().__init__(asynchronous=asynchronous, loop=client.loop, batch_size=batch_size, **kwargs)
        _bridge.mirror_sync_methods(self)

    @classmethod
    def from_client(cls, client: LoomFS, **kwargs: Any) -> Self:
        """A filesystem over a ``LoomFS`` the caller already has (not cached; pickles as its
        cluster address)."""
        return cls(client=client, skip_instance_cache=True, **kwargs)

    @property
    def loom(self) -> LoomFS:
        """The blocking client this filesystem runs on (a shared one that was closed, by
        ``close_clients``, is replaced by a fresh one)."""
        fs = self._loom
        if fs.closed and self._shared is not None:
            fs = self._loom = shared_client(*self._shared)
        return fs

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The client's event loop (a fresh one after ``fork``)."""
        return self.loom.loop

    @property
    def core(self) -> AsyncClient:
        """The async client core (use it on ``fs.loop``)."""
        return self.loom.client

    def __reduce__(self) -> Any:
        opts = {k: v for k, v in self._options.items() if v is not None}
        return _rebuild, (type(self), opts)

    def __repr__(self) -> str:
        return f"LoomFileSystem({self.mgmtd!r} {self.loom!r})"

    # --- URLs ---------------------------------------------------------------------------

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        return strip_path(stringify_path(path))

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict[str, Any]:
        return url_options(stringify_path(path))

    def unstrip_protocol(self, name: str) -> str:
        return f"{PREFIX}{self.mgmtd}{strip_path(name)}"

    # --- attributes ---------------------------------------------------------------------

    def _info_of(self, path: str, attr: Attr) -> dict[str, Any]:
        info = info_of(path, attr)  # the client's info dict, plus fsspec's own keys
        info["islink"] = attr.type == FileType.SYMLINK
        info["mtime"] = attr.mtime_ns / 1e9
        return info

    async def _resolve_links(self, infos: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Symlinks report their target's type and size (``islink`` says it is one), as
        fsspec's local filesystem does; a dangling one stays type "link"."""
        links = [i for i in infos if i["islink"]]
        if links:
            attrs = await self.core.stat_many([i["name"] for i in links])
            for info, attr in zip(links, attrs, strict=True):
                if not isinstance(attr, BaseException):
                    info["type"] = TYPE_NAMES.get(FileType(attr.type), "other")
                    info["size"] = attr.size
        return infos

    @on_core_loop
    async def _info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        p = self._strip_protocol(path)
        attr = await self.core.lstat(p)
        return (await self._resolve_links([self._info_of(p, attr)]))[0]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        p = self._strip_protocol(path)
        attr = self.loom.attr(p, follow_symlinks=False)  # on the caller's thread when it can
        info = self._info_of(p, attr)
        if info["islink"]:
            try:
                target = self.loom.attr(p)
            except OSError:
                return info
            info["type"] = TYPE_NAMES.get(FileType(target.type), "other")
            info["size"] = target.size
        return info

    @on_core_loop
    async def _exists(self, path: str, **kwargs: Any) -> bool:
        try:
            await self.core.stat(self._strip_protocol(path))
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    def exists(self, path: str, **kwargs: Any) -> bool:
        try:
            self.loom.attr(self._strip_protocol(path))
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    async def _type(self, path: str) -> int | None:
        try:
            return (await self.core.stat(self._strip_protocol(path))).type
        except (FileNotFoundError, NotADirectoryError):
            return None

    def _type_now(self, path: str) -> int | None:
        try:
            return self.loom.attr(self._strip_protocol(path)).type
        except (FileNotFoundError, NotADirectoryError):
            return None

    @on_core_loop
    async def _isdir(self, path: str) -> bool:
        return await self._type(path) == FileType.DIRECTORY

    def isdir(self, path: str) -> bool:
        return self._type_now(path) == FileType.DIRECTORY

    @on_core_loop
    async def _isfile(self, path: str) -> bool:
        return await self._type(path) == FileType.FILE

    def isfile(self, path: str) -> bool:
        return self._type_now(path) == FileType.FILE

    @on_core_loop
    async def _size(self, path: str) -> int:
        return (await self.core.stat(self._strip_protocol(path))).size

    def size(self, path: str) -> int:
        return self.loom.attr(self._strip_protocol(path)).size  # on the caller's thread when it can

    @on_core_loop
    async def _sizes(self, paths: Sequence[str], batch_size: int | None = None) -> list[int]:
        """Sizes of many files in one STAT_MANY; raises the first item's error."""
        out: list[int] = []
        for r in await self.core.stat_many(self._strip_protocol(list(paths))):
            if isinstance(r, BaseException):
                raise r
            out.append(r.size)
        return out

    def modified(self, path: str) -> datetime.datetime:
        """The last data modification time (UTC)."""
        ns = self.loom.attr(self._strip_protocol(path)).mtime_ns
        return datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.UTC)

    def _version(self, path: str) -> tuple[int, int, int, int]:
        a = self.loom.attr(self._strip_protocol(path))
        return a.inode, a.size, a.mtime_ns, a.ctime_ns

    def checksum(self, path: str) -> int:
        """Changes whenever the file's content may have: its version (inode, size, mtime,
        ctime), the key the client's data caches use. Not a hash of the bytes."""
        return int(self.ukey(path)[:16], 16)

    def ukey(self, path: str) -> str:
        return hashlib.sha256(repr(self._version(path)).encode()).hexdigest()

    async def _parent_made(self, p: str) -> None:
        """auto_mkdir: make ``p``'s parent directories (one round trip; none when this
        client's caches know the parent is a directory)."""
        parent = posixpath.dirname(p)
        if not self.auto_mkdir or parent == "/":
            return
        try:
            known = self.core.cached_attr(parent)
        except FileNotFoundError:
            known = None
        if known is not None and known.type == FileType.DIRECTORY:
            return
        await self.core.makedirs(parent, exist_ok=True)

    async def _with_parent(self, p: str, make: Callable[[], Awaitable[Any]]) -> Any:
        """Run a create; if it fails for a missing parent (and auto_mkdir), make the parent
        and run it again: no extra round trip when the parent exists."""
        try:
            return await make()
        except FileNotFoundError:
            parent = posixpath.dirname(p)
            if not self.auto_mkdir or parent == "/":
                raise
            await self.core.makedirs(parent, exist_ok=True)
            return await make()

    def invalidate_cache(self, path: str | None = None) -> None:
        """Forget what the client's caches hold for ``path`` (and below), or everything."""
        caches = self.core.caches
        if path is None:
            caches.clear()
        else:
            caches.changed(self._strip_protocol(path), tree=True)


def _rebuild(cls: type[LoomBase], options: dict[str, Any]) -> LoomBase:
    return cls(**options)
