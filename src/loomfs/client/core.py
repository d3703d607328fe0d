"""The async core: one ``AsyncClient`` per process (per event loop).

It owns the RPC connection pool, routing (refreshed in the background), the meta client
and the storage client; every front end (blocking API, fsspec, FUSE, PyTorch) is a thin
layer over it. Data path objects are passed in, so tests run it against in-memory fakes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import random
import time
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import Any

from loomfs.client import locks, paths
from loomfs.client.cache import Absent
from loomfs.client.consistency import ClientCaches
from loomfs.client.file import AsyncFile, parse_mode
from loomfs.client.inline import check_crc
from loomfs.client.lazy import LazyCreates
from loomfs.client.meta_client import MetaClient
from loomfs.client.session_ids import session_ids
from loomfs.client.storage_client import ChunkStore, StorageClient, note_grant
from loomfs.client.writeback import ByteBudget
from loomfs.common import grants, malloc_tune
from loomfs.common.routing import RoutingClient, parse_addresses
from loomfs.config import ClientConfig
from loomfs.errors import IsADirectory, LoomError, NotADirectory, NotFound
from loomfs.net.auth import from_rpc_config, process_auth
from loomfs.net.buffers import DEFAULT_POOL, BufferPool
from loomfs.net.rpc import RetryPolicy, RpcClient
from loomfs.net.tcp import default_transport
from loomfs.net.transport import Address
from loomfs.wire.meta import (
    MKNOD,
    RENAME,
    RENEW_SESSIONS,
    RENEW_SESSIONS_MAX,
    MknodReq,
    OpenRsp,
    ReadRsp,
    RenameReq,
    RenewSessionsReq,
    RenewSessionsRsp,
    SetattrReq,
    StatfsRsp,
)
from loomfs.wire.types import Attr, DirEntry, FileType, Layout

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class _Granted:
    write_grant: bytes  # a grant from a renewal, shaped like an open reply for note_grant

READDIR_PAGE = 1024
LAZY_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC  # mode "w"/"wb": the create waits for the bytes
INLINE_PUT_CAP_BYTES = 1 << 20  # meta's cap on any inline limit
RMTREE_PARALLEL = 32
TYPE_NAMES = {FileType.FILE: "file", FileType.DIRECTORY: "directory", FileType.SYMLINK: "link"}


def info_of(path: str, attr: Attr) -> dict[str, Any]:
    """fsspec-style info dict for one entry."""
    d: dict[str, Any] = {
        "name": path,
        "size": attr.size,
        "type": TYPE_NAMES.get(FileType(attr.type), "other"),
        "inode": attr.inode,
        "mode": attr.mode,
        "nlink": attr.nlink,
        "uid": attr.uid,
        "gid": attr.gid,
        "atime_ns": attr.atime_ns,
        "mtime_ns": attr.mtime_ns,
        "ctime_ns": attr.ctime_ns,
    }
    if attr.type == FileType.SYMLINK:
        d["destination"] = attr.symlink_target
    return d


class _WriteFile(AsyncFile):
    """A file this client opened for writing: each flush, fsync, truncate and close drops
    what the caches hold for its path and inode (relaxed mode reads this client's own writes)."""

    def __init__(self, *, caches: ClientCaches, **kw: Any):
        super().__init__(**kw)
        self._caches = caches

    def _changed(self) -> None:
        self._caches.changed(self.path, inode=self.inode)

    async def flush(self) -> None:
        try:
            await super().flush()
        finally:
            self._changed()

    async def fsync(self) -> None:
        try:
            await super().fsync()
        finally:
            self._changed()

    async def truncate(self, size: int | None = None) -> int:
        try:
            return await super().truncate(size)
        finally:
            self._changed()

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            self._changed()


class AsyncClient:
    def __init__(
        self,
        meta: MetaClient,
        storage: ChunkStore,
        *,
        config: ClientConfig | None = None,
        client_id: int = 0,
        pool: BufferPool = DEFAULT_POOL,
        rpc: RpcClient | None = None,
        routing: RoutingClient | None = None,
        caches: ClientCaches | None = None,
    ):
        self.config = config or ClientConfig()
        # attribute, entry and data caches, used as each path's consistency mode allows
        self.caches = caches if caches is not None else ClientCaches.from_config(self.config)
        self.meta = meta
        self.storage = storage
        self.client_id = client_id or random.getrandbits(63) or 1
        self.pool = pool
        self.rpc = rpc
        self.routing = routing
        self.budget = ByteBudget(self.config.write_buffer_bytes_max)
        self._open_files: weakref.WeakSet[AsyncFile] = weakref.WeakSet()
        self._background: set[asyncio.Task[Any]] = set()  # fire-and-forget meta calls in flight
        self._routing_task: asyncio.Task[None] | None = None
        self._renew_task: asyncio.Task[None] | None = None
        self._session_lease_s = 0.0  # the shortest lease meta gave our write sessions
        self.sessions_lost_total = 0  # write sessions meta no longer held at a renewal
        self.lazy = LazyCreates()  # "w" files not created yet: made before our calls on their paths
        self.closed = False

    @classmethod
    async def connect(
        cls, mgmtd: str | Sequence[Address | str], config: ClientConfig | None = None
    ) -> AsyncClient:
        """Connect to a cluster through its mgmtd(s): ``'host:port'``, a comma list, or Addresses."""
        config = config or ClientConfig()
        malloc_tune.tune(library=True)  # only with LOOMFS_MALLOC_TUNE=1: the host process's allocator
        if isinstance(mgmtd, str):
            addrs = parse_addresses(mgmtd)
        else:
            addrs = [a if isinstance(a, Address) else Address.parse(a) for a in mgmtd]
        rc = config.rpc
        # credentials: the config's token (or secret, TLS), else the process's ($LOOMFS_TOKEN_FILE)
        auth = from_rpc_config(rc, name="client") if (
            rc.token_file or rc.secret_file or rc.tls_ca_file or rc.tls_cert_file) else process_auth()
        rpc = RpcClient(
            default_transport(max_payload_bytes=rc.max_payload_bytes, auth=auth),
            connect_timeout_s=rc.connect_timeout_s,
            call_timeout_s=rc.call_timeout_s,
            retry=RetryPolicy(attempts_max=rc.retry_attempts_max),
        )
        routing = RoutingClient(rpc, addrs, refresh_s=config.routing_refresh_s)
        try:
            await routing.refresh()
        except BaseException:
            await rpc.close()
            raise
        client_id = random.getrandbits(63) or 1
        storage = StorageClient(rpc, routing, client_id, call_timeout_s=rc.call_timeout_s)
        caches = ClientCaches.from_config(config, namespace=",".join(map(str, addrs)))
        self = cls(MetaClient(rpc, routing), storage, config=config, client_id=client_id, rpc=rpc,
                   routing=routing, caches=caches)
        if auth is not None and auth.credential is not None and getattr(storage, "read_grants", None) is not None:
            from loomfs.client.readgrants import meta_fetcher  # a token: storage wants read grants

            storage.read_grants.fetch_many = meta_fetcher(self.meta)
        self._routing_task = asyncio.get_running_loop().create_task(routing.run())
        logger.info("client %#x connected to %s (%r)", client_id, ",".join(map(str, addrs)), routing.current)
        return self

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for f in list(self._open_files):
            try:
                await f.close()
            except Exception as exc:
                logger.warning("closing %s: %s", f.path, exc)
                f.close_error = exc  # the file's own close raises it
        while self._background:  # write sessions still closing
            await asyncio.gather(*list(self._background), return_exceptions=True)
        if self._renew_task is not None:
            self._renew_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renew_task
        if self._routing_task is not None:
            self._routing_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._routing_task
        await locks.close_client(self)  # its cluster locks go now, not a lease later (none: nothing)
        if self.rpc is not None:
            await self.rpc.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- attributes -------------------------------------------------------------------

    async def stat(self, path: str) -> Attr:
        return await self._stat(paths.normalize(path), True)

    async def lstat(self, path: str) -> Attr:
        return await self._stat(paths.normalize(path), False)

    async def info(self, path: str) -> dict[str, Any]:
        p = paths.normalize(path)
        return info_of(p, await self._stat(p, False))

    async def exists(self, path: str) -> bool:
        try:
            await self._stat(paths.normalize(path), True)
        except NotFound:
            return False
        return True

    def cached_attr(self, p: str, follow_symlinks: bool = True) -> Attr | None:
        """Attributes of normalised ``p`` from the caches, where its mode allows (relaxed);
        raises ENOENT for a cached negative answer; None: ask meta."""
        hit = self.caches.attr(p, follow_symlinks)
        if isinstance(hit, Absent):
            raise NotFound(path=p)
        return hit

    async def _stat(self, p: str, follow_symlinks: bool) -> Attr:
        if self.lazy:
            await self.lazy.settle(p)
        hit = self.cached_attr(p, follow_symlinks)
        if hit is not None:
            return hit
        return await self.stat_meta(p, follow_symlinks)

    async def stat_meta(self, p: str, follow_symlinks: bool) -> Attr:
        """Ask meta (whatever the mode) and let the caches learn the answer."""
        asked = self.caches.now()
        try:
            attr = await self.meta.stat(p, follow_symlinks)
        except NotFound:
            self.caches.learn_absent(p, follow_symlinks, asked_at=asked)
            raise
        self.caches.learn_attr(p, follow_symlinks, attr, asked_at=asked)
        return attr

    async def isdir(self, path: str) -> bool:
        try:
            return (await self.stat(path)).type == FileType.DIRECTORY
        except NotFound:
            return False

    async def isfile(self, path: str) -> bool:
        try:
            return (await self.stat(path)).type == FileType.FILE
        except NotFound:
            return False

    # --- directories ------------------------------------------------------------------

    async def scandir(self, path: str, *, with_attrs: bool = False) -> list[DirEntry]:
        """All entries of a directory (pages through READDIR; relaxed: a cached listing)."""
        p = paths.normalize(path)
        if self.lazy:
            await self.lazy.settle(p, children=True)
        hit = self.caches.listing(p, with_attrs)
        if hit is not None:
            return hit
        asked = self.caches.now()
        out = await self._scandir_meta(p, with_attrs)
        self.caches.learn_listing(p, out, with_attrs, asked_at=asked)
        return out

    async def _scandir_meta(self, p: str, with_attrs: bool = False) -> list[DirEntry]:
        out: list[DirEntry] = []
        async for page in self.readdir_pages(p, with_attrs=with_attrs):
            out.extend(page)
        return out

    async def readdir_pages(
        self, path: str, *, with_attrs: bool = False, page_size: int = READDIR_PAGE, after: str = "",
        dir_inode: int = 0,
    ) -> AsyncIterator[list[DirEntry]]:
        """A directory's entries a page at a time, in name order (a huge directory streams:
        one READDIR per page, entries with their attributes when ``with_attrs``). Every page
        comes from one directory (``dir_inode``, else the one the first page came from): when
        ``path`` leads to another by then, the next page raises FileNotFoundError."""
        p = paths.normalize(path)
        if self.lazy:
            await self.lazy.settle(p, children=True)
        while True:
            rsp = await self.meta.readdir(p, after, page_size, with_attrs, dir_inode)
            dir_inode = dir_inode or rsp.dir_inode
            if rsp.entries:
                yield rsp.entries
            if not rsp.more or not rsp.entries:
                return
            after = rsp.entries[-1].name

    async def listdir(self, path: str) -> list[str]:
        """Entry names, sorted, like ``os.listdir`` (ENOTDIR on a file)."""
        return [e.name for e in await self.scandir(paths.normalize(path))]

    async def ls(self, path: str, detail: bool = False) -> list[Any]:
        """Full paths of a directory's entries (sorted), or fsspec-style info dicts."""
        p = paths.normalize(path)
        try:
            entries = await self.scandir(p, with_attrs=detail)
        except NotADirectory:
            attr = await self._stat(p, False)
            return [info_of(p, attr)] if detail else [p]
        if not detail:
            return [paths.join(p, e.name) for e in entries]
        out = []
        for e in entries:
            child = paths.join(p, e.name)
            attr = e.attr if e.attr is not None else await self._stat(child, False)
            out.append(info_of(child, attr))
        return out

    async def mkdir(self, path: str, mode: int = 0o755, *, parents: bool = False, exist_ok: bool = False) -> Attr:
        p = paths.normalize(path)
        if self.lazy:
            await self.lazy.settle(p)
        try:
            return await self.meta.mkdir(p, mode, parents, exist_ok)
        finally:
            self.caches.created(p, parents=parents)

    async def makedirs(self, path: str, exist_ok: bool = False, mode: int = 0o755) -> Attr:
        return await self.mkdir(path, mode, parents=True, exist_ok=exist_ok)

    async def rmdir(self, path: str) -> None:
        p = paths.normalize(path)
        if self.lazy:
            await self.lazy.settle(p, subtree=True)
        try:
            await self.meta.rmdir(p)
        finally:
            self.caches.changed(p, tree=True)

    async def rm(self, path: str, recursive: bool = False) -> None:
        """Remove a file or symlink (like ``os.remove``); a directory needs ``recursive``."""
        p = paths.normalize(path)
        try:
            await self.unlink(p)  # one round trip for the common case
        except IsADirectory:
            if not recursive:
                raise
            await self.rmtree(p)

    async def unlink(self, path: str) -> None:
        p = paths.normalize(path)
        if self.lazy:
            await self.lazy.settle(p)
        try:
            await self.meta.unlink(p)
        finally:
            self.caches.changed(p)

    async def rmtree(self, path: str) -> None:
        top = paths.normalize(path)
        if self.lazy:
            await self.lazy.settle(top, subtree=True)
        try:
            await self._rmtree(top)
        finally:
            self.caches.changed(top, tree=True)

    async def _rmtree(self, top: str) -> None:
        entries = await self._scandir_meta(top)  # what is there now, not a cached listing
        sem = asyncio.Semaphore(RMTREE_PARALLEL)

        async def unlink(child: str) -> None:
            async with sem:
                await self.meta.unlink(child)

        files = [paths.join(top, e.name) for e in entries if e.type != FileType.DIRECTORY]
        await asyncio.gather(*(unlink(c) for c in files))
        for e in entries:
            if e.type == FileType.DIRECTORY:
                await self._rmtree(paths.join(top, e.name))
        if top != "/":
            await self.meta.rmdir(top)

    async def walk(self, path: str, topdown: bool = True) -> AsyncIterator[tuple[str, list[str], list[str]]]:
        """Like ``os.walk``: (dirpath, dirnames, filenames); symlinks are not followed."""
        top = paths.normalize(path)
        entries = await self.scandir(top)
        dirs = [e.name for e in entries if e.type == FileType.DIRECTORY]
        files = [e.name for e in entries if e.type != FileType.DIRECTORY]
        if topdown:
            yield top, dirs, files
        for d in dirs:
            async for item in self.walk(paths.join(top, d), topdown):
                yield item
        if not topdown:
            yield top, dirs, files

    async def rename(self, src: str, dst: str, *, no_replace: bool = False,
                     expect: tuple[int, int, int] | None = None) -> None:
        """``expect`` (inode, size, mtime_ns): replace ``dst`` only if it is still that file,
        unchanged and not open for writing anywhere, else EBUSY (one meta transaction)."""
        s, d = paths.normalize(src), paths.normalize(dst)
        if self.lazy:
            await self.lazy.settle(s, d, subtree=True)
        try:
            await self.meta.rename(s, d, no_replace, expect)
        finally:
            self.caches.renamed(s, d)

    mv = rename

    async def exchange(self, a: str, b: str) -> None:
        """renameat2(RENAME_EXCHANGE): ``a`` and ``b`` (both existing) swap, atomically."""
        s, d = paths.normalize(a), paths.normalize(b)
        if self.lazy:
            await self.lazy.settle(s, d, subtree=True)
        try:
            await self.meta.call(RENAME, RenameReq(src=s, dst=d, exchange=True))
        finally:
            self.caches.renamed(s, d)

    async def symlink(self, target: str, path: str) -> None:
        """Create ``path`` pointing at ``target`` (stored as given; UTF-8 text, else EINVAL)."""
        p = paths.normalize(path)
        paths.check_utf8(target, "symlink target")
        if self.lazy:
            await self.lazy.settle(p)
        try:
            await self.meta.symlink(target, p)
        finally:
            self.caches.created(p)

    async def mknod(self, path: str, type: FileType, mode: int = 0o644, rdev: int = 0, *,
                    uid: int = 0, gid: int = 0) -> Attr | None:
        """A FIFO, socket or device node (no data: the kernel that opens one serves it)."""
        p = paths.normalize(path)
        if self.lazy:
            await self.lazy.settle(p)
        try:
            req = MknodReq(path=p, type=int(type), mode=mode & 0o7777, rdev=rdev, uid=uid, gid=gid)
            rsp = await self.meta.call(MKNOD, req)
            return rsp.attr
        finally:
            self.caches.created(p)

    async def readlink(self, path: str) -> str:
        return await self.meta.readlink(paths.normalize(path))

    async def link(self, src: str, dst: str) -> None:
        s, d = paths.normalize(src), paths.normalize(dst)
        if self.lazy:
            await self.lazy.settle(s, d)
        try:
            await self.meta.link(s, d)
        finally:
            self.caches.changed(s)  # its link count and ctime
            self.caches.created(d)

    # --- attributes that change -------------------------------------------------------

    async def _setattr(self, req: SetattrReq) -> Any:
        if self.lazy:
            await self.lazy.settle(req.path)
        try:
            rsp = await self.meta.setattr(req)
        except BaseException:
            self.caches.changed(req.path)
            raise
        self.caches.changed(req.path, inode=rsp.attr.inode if rsp.attr is not None else 0)
        return rsp

    async def chmod(self, path: str, mode: int) -> Attr | None:
        rsp = await self._setattr(SetattrReq(path=paths.normalize(path), mode=mode & 0o7777))
        return rsp.attr

    async def chown(self, path: str, uid: int = -1, gid: int = -1) -> Attr | None:
        rsp = await self._setattr(SetattrReq(path=paths.normalize(path), uid=uid, gid=gid))
        return rsp.attr

    async def utime(
        self, path: str, times: tuple[float, float] | None = None, *, ns: tuple[int, int] | None = None
    ) -> Attr | None:
        """Like ``os.utime``: (atime_s, mtime_s), or ``ns=(atime_ns, mtime_ns)``, or now."""
        if ns is not None:
            atime_ns, mtime_ns = ns
        elif times is not None:
            atime_ns, mtime_ns = int(times[0] * 1e9), int(times[1] * 1e9)
        else:  # "now" by meta's clock: allowed to anyone with write permission (explicit times: the owner)
            req = SetattrReq(path=paths.normalize(path), times_now=True)
            return (await self._setattr(req)).attr
        req = SetattrReq(path=paths.normalize(path), atime_ns=atime_ns, mtime_ns=mtime_ns)
        return (await self._setattr(req)).attr

    async def truncate(self, path: str, size: int) -> None:
        """Set a file's length; meta cuts the data beyond it from storage before it answers
        (crash-safe: a durable trim entry, see ``loomfs.meta.trim``). A negative size is EINVAL."""
        p = paths.normalize(path)
        if size < 0:
            from loomfs.errors import InvalidArgument

            raise InvalidArgument(f"negative size {size}", path=p)
        await self._setattr(SetattrReq(path=p, size=size))

    async def set_layout(self, path: str, layout: Layout) -> Attr | None:
        p = paths.normalize(path)
        try:
            return await self.meta.set_layout(p, layout)
        finally:
            self.caches.changed(p)

    async def get_layout(self, path: str) -> Layout | None:
        return (await self.stat(path)).layout

    async def statfs(self) -> StatfsRsp:
        return await self.meta.statfs()

    # --- data -------------------------------------------------------------------------

    def _file_args(self, p: str, flags: int) -> dict[str, Any]:
        """What every file object of this client is built with."""
        return dict(background=self._background, path=p, flags=flags, storage=self.storage, meta=self.meta,
                    config=self.config, pool=self.pool, budget=self.budget)

    async def open(self, path: str, mode: str = "rb", *, perm: int = 0o644) -> AsyncFile:
        flags, _binary = parse_mode(mode)
        p = paths.normalize(path)
        if self.lazy:
            await self.lazy.settle(p)
        if flags == os.O_RDONLY:
            return await self._open_read(p)
        # write opens name their session, so a re-sent OPEN (reply lost) is applied once
        session_id = session_ids.take()  # the proof of an open file: unguessable
        common = {**self._file_args(p, flags), "caches": self.caches}
        self.caches.changed(p)  # whatever it was, this client is changing it
        if flags == LAZY_FLAGS and self.config.inline_put_max_bytes > 0:
            # "w": created at close with its bytes (one round trip for a small file)
            async def opener(data: bytes | None, chunked: bool) -> OpenRsp:
                self.lazy.discard(p, f)
                rsp = await self.meta.open(p, flags, perm, self.client_id, session_id, data=data, chunked=chunked)
                note_grant(self.storage, self._check_opened(p, rsp).inode, rsp)
                if rsp.session_id:
                    self._keep_sessions(rsp.session_lease_s)
                return rsp

            f: AsyncFile = _WriteFile(attr=None, session_id=0, opener=opener,
                                      lazy_max_bytes=min(self.config.inline_put_max_bytes, INLINE_PUT_CAP_BYTES),
                                      **common)
            self._open_files.add(f)
            self.lazy.add(p, f)
            return f
        try:
            rsp = await self.meta.open(p, flags, perm, self.client_id, session_id)
        except BaseException:
            self.caches.changed(p)  # it may have been applied: forget what was learned meanwhile
            raise
        attr = self._check_opened(p, rsp)
        note_grant(self.storage, attr.inode, rsp)
        self.caches.changed(p, inode=attr.inode)
        # O_TRUNC: meta cut the old chunks before it answered (a replayed open too)
        f = _WriteFile(attr=attr, session_id=rsp.session_id, trunc_epoch=rsp.trunc_epoch,
                       inline_data=self._inline_bytes(p, rsp.data, rsp.data_crc), **common)
        self._open_files.add(f)
        if rsp.session_id:
            self._keep_sessions(rsp.session_lease_s)
        return f

    async def _open_read(self, p: str) -> AsyncFile:
        """A read-only open: no write session, so nothing to close at meta. Relaxed: served
        from the caches when they hold the file's attributes and its whole content. Strict:
        an OPEN, whose reply may name a version the data cache holds (a revalidated hit)."""
        attr = self.cached_attr(p, True)
        if attr is not None:
            if attr.type == FileType.DIRECTORY:
                raise IsADirectory(path=p)
            data = self.cached_data(attr)
            if data is not None:
                f = self._file_of(p, attr, data)
                if f is not None:
                    return f
        asked = self.caches.now()
        try:
            rsp = await self.meta.open(p, os.O_RDONLY, 0, self.client_id, 0)
        except NotFound:
            self.caches.learn_absent(p, True, asked_at=asked)
            raise
        attr = self._check_opened(p, rsp)
        self.caches.learn_attr(p, True, attr, asked_at=asked)
        if rsp.read_grant:
            note_grant(self.storage, attr.inode, rsp)
        if rsp.data is not None:
            data = check_crc(p, rsp.data, rsp.data_crc)
            if self.caches.relaxed(p):  # strict reads get inline bytes with every OPEN/READ
                self.caches.learn_data(attr, data)
        else:
            data = self.cached_data(attr, revalidated=True)
            f = self._file_of(p, attr, data) if data is not None else None
            if f is not None:
                return f
        f = AsyncFile(attr=attr, session_id=0, inline_data=data, **self._file_args(p, os.O_RDONLY))
        self._open_files.add(f)
        return f

    def file_from_open(self, path: str, rsp: OpenRsp) -> AsyncFile:
        """The read-only file an OPEN reply the caller sent itself describes (a read hold's,
        ``loomfs.checkpoint._holds``), made as ``open`` makes one: attributes, read grant,
        inline bytes (CRC checked). ``path``: normalised."""
        attr = self._check_opened(path, rsp)
        if rsp.read_grant:
            note_grant(self.storage, attr.inode, rsp)
        data = check_crc(path, rsp.data, rsp.data_crc) if rsp.data is not None else None
        f = AsyncFile(attr=attr, session_id=0, inline_data=data, **self._file_args(path, os.O_RDONLY))
        self._open_files.add(f)
        return f

    def cached_data(self, attr: Attr, *, revalidated: bool = False) -> bytes | None:
        """The whole content of the version ``attr`` names, if cached (an empty file always)."""
        if attr.type == FileType.FILE and attr.size == 0:
            return b""
        return self.caches.data_for(attr, revalidated=revalidated)

    def _file_of(self, p: str, attr: Attr, data: bytes) -> AsyncFile | None:
        """A read-only file object over a cached copy of one whole version (read as an
        inline file is: from memory, no storage round trip)."""
        if attr.type != FileType.FILE or attr.layout is None or not attr.layout.chains:
            return None
        f = AsyncFile(attr=dataclasses.replace(attr, inline=True), session_id=0, inline_data=data,
                      **self._file_args(p, os.O_RDONLY))
        self._open_files.add(f)
        return f

    @staticmethod
    def _check_opened(p: str, rsp: OpenRsp) -> Attr:
        attr = rsp.attr
        if attr is None:
            raise NotFound("open returned no attributes", path=p)
        if attr.type == FileType.DIRECTORY:
            raise IsADirectory(path=p)
        return attr

    @staticmethod
    def _inline_bytes(p: str, data: bytes | None, crc: int) -> bytes | None:
        return None if data is None else check_crc(p, data, crc)

    # --- write-session leases ---------------------------------------------------------

    def _write_sessions(self) -> list[int]:
        return sorted(f.session_id for f in self._open_files if f.session_id and not f.closed)

    def _keep_sessions(self, lease_s: float) -> None:
        """A write session with a lease was opened: renew this client's sessions in the
        background (every third of the lease) while any is open."""
        if lease_s <= 0 or self.closed:
            return
        if not self._session_lease_s or lease_s < self._session_lease_s:
            self._session_lease_s = lease_s
        if self._renew_task is None or self._renew_task.done():
            self._renew_task = asyncio.get_running_loop().create_task(self._renew_loop(), name="loomfs-renew")

    async def renew_sessions(self) -> int:
        """Renew the write sessions of this client's open files now; returns how many meta
        still held. Fewer than open means some expired (this client could not reach meta for
        a lease): the files are fine, but an unlinked one may have been collected."""
        held = self._write_sessions()
        if not held:
            return 0
        stale = self._grants_to_renew()
        if stale:  # some write grants run out within half their life: fresh ones with the renewal
            renewed = await self._renew_with_grants(stale)
            renewed += await self.meta.renew_sessions(self.client_id, sorted(set(held) - set(stale)))
        else:
            renewed = await self.meta.renew_sessions(self.client_id, held)
        if renewed < len(held):
            self.sessions_lost_total += len(held) - renewed
            logger.warning("client %#x: meta held %d of our %d write sessions (the others expired)",
                           self.client_id, renewed, len(held))
        return renewed

    def _grants_to_renew(self) -> dict[int, int]:
        """session id -> inode of open files whose write grant is past half its life."""
        kept = getattr(self.storage, "write_grants", None)
        if not kept:
            return {}
        soon = time.time() + grants.DEFAULT_GRANT_TTL_S / 2
        return {f.session_id: f.inode for f in self._open_files
                if f.session_id and not f.closed and f.inode in kept and grants.expires_at_s(kept[f.inode]) < soon}

    async def _renew_with_grants(self, sessions: dict[int, int]) -> int:
        """Renew ``sessions`` asking meta for fresh write grants of their inodes."""
        renewed = 0
        items = sorted(sessions.items())
        for i in range(0, len(items), RENEW_SESSIONS_MAX):
            part = items[i:i + RENEW_SESSIONS_MAX]
            req = RenewSessionsReq(client_id=self.client_id, session_ids=[s for s, _ in part],
                                   inodes=[n for _, n in part])
            rsp: RenewSessionsRsp = await self.meta.call(RENEW_SESSIONS, req)
            renewed += rsp.renewed
            for (_, inode), grant in zip(part, rsp.write_grants, strict=False):
                if grant:
                    note_grant(self.storage, inode, _Granted(grant))
        return renewed

    async def _renew_loop(self) -> None:
        while not self.closed:
            await asyncio.sleep(self._session_lease_s / 3)
            if not self._write_sessions():
                return  # the next write open starts a new loop
            try:
                await self.renew_sessions()
            except (LoomError, OSError) as exc:  # meta down: try again next period
                logger.warning("client %#x: renewing write sessions failed: %s", self.client_id, exc)

    async def cat(self, path: str) -> bytes:
        """A whole file: one meta round trip (READ) for an inline file; a file in chunks is
        then read from storage without an OPEN. Relaxed: no round trip when the caches hold
        the file's attributes and content."""
        p = paths.normalize(path)
        if self.lazy:
            await self.lazy.settle(p)
        data = self.cached_content(p)
        if data is not None:
            return data
        rsp = await self.read_meta(p)
        return await self.cat_from(p, rsp)

    def cached_content(self, p: str) -> bytes | None:
        """Relaxed: the whole content of normalised ``p`` when the caches hold both its
        attributes and that version's bytes (ENOENT/EISDIR from cached attributes); else None."""
        attr = self.cached_attr(p, True)
        if attr is None:
            return None
        if attr.type == FileType.DIRECTORY:
            raise IsADirectory(path=p)
        return self.cached_data(attr)

    async def read_meta(self, p: str) -> ReadRsp:
        """READ ``p`` from meta; the caches learn its attributes (and ENOENT)."""
        asked = self.caches.now()
        try:
            rsp = await self.meta.read(p)
        except NotFound:
            self.caches.learn_absent(p, True, asked_at=asked)
            raise
        self.learn_read(p, rsp, asked)
        return rsp

    def learn_read(self, p: str, rsp: ReadRsp, asked_at: float) -> None:
        """Let the caches learn a READ reply for ``p`` (sent at ``asked_at``), and the storage
        client its read grant (a chunked file: no READ_GRANTS round trip before its chunks)."""
        if rsp.attr is not None:
            self.caches.learn_attr(p, True, rsp.attr, asked_at=asked_at)
            if rsp.read_grant:
                note_grant(self.storage, rsp.attr.inode, rsp)

    def content_of_read(self, p: str, rsp: ReadRsp) -> bytes | None:
        """What a READ reply gives without storage: an inline file's bytes (checked), or the
        data cache's copy of the version the reply names; None: read the chunks."""
        attr = rsp.attr
        if attr is None:
            raise NotFound("read returned no attributes", path=p)
        if attr.type == FileType.DIRECTORY:
            raise IsADirectory(path=p)
        if rsp.data is not None:
            data = check_crc(p, rsp.data, rsp.data_crc)
            if self.caches.relaxed(p):  # strict reads get inline bytes with every READ
                self.caches.learn_data(attr, data)
            return data
        return self.cached_data(attr, revalidated=True)

    async def cat_from(self, p: str, rsp: ReadRsp) -> bytes:
        """The bytes of a file given its READ reply (a file in chunks: from the data cache
        when it holds the version the reply names)."""
        data = self.content_of_read(p, rsp)
        if data is not None:
            return data
        attr = rsp.attr
        assert attr is not None
        f = AsyncFile(attr=attr, session_id=0, **self._file_args(p, os.O_RDONLY))
        try:
            data = await f.read()
        finally:
            await f.close()
        if len(data) == attr.size and self.caches.wants_data(attr.size):
            self.caches.learn_data(attr, data)
        return data

    async def finish_put(self, p: str, rsp: OpenRsp, data: bytes) -> None:
        """A put that meta answered as an ordinary write open (too big for the directory's
        inline limit): write the bytes and close."""
        attr = self._check_opened(p, rsp)
        note_grant(self.storage, attr.inode, rsp)
        f = _WriteFile(attr=attr, session_id=rsp.session_id, trunc_epoch=rsp.trunc_epoch,
                       inline_data=self._inline_bytes(p, rsp.data, rsp.data_crc), caches=self.caches,
                       **self._file_args(p, LAZY_FLAGS))
        self._open_files.add(f)
        if rsp.session_id:
            self._keep_sessions(rsp.session_lease_s)
        try:
            await f.write(data)
        finally:
            await f.close()

    async def pipe(self, path: str, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` as the whole content of ``path``."""
        f = await self.open(path, "wb")
        try:
            await f.write(data)
        finally:
            await f.close()

    # --- batches: one meta round trip for many paths (``loomfs.client.batch``) ----------

    async def read_many(self, paths_: Sequence[str]) -> list[bytes | OSError]:
        """The contents of many files; a failed item is its ``OSError`` (the batch goes on).
        Relaxed paths whose attributes and content are cached are answered from the caches."""
        from loomfs.client import batch

        await self._settle_many(paths_)
        if not self.caches.policy.any_relaxed:
            return await batch.read_many(self, paths_)
        out, todo = self._from_caches(paths_, self.cached_content)
        if todo:
            rest = await batch.read_many(self, [paths_[i] for i in todo])
            for i, r in zip(todo, rest, strict=True):
                out[i] = r
        return out

    async def stat_many(self, paths_: Sequence[str], *, follow_symlinks: bool = True) -> list[Attr | OSError]:
        """Attributes of many paths; relaxed paths are answered from (and teach) the caches."""
        from loomfs.client import batch

        await self._settle_many(paths_)
        if not self.caches.policy.any_relaxed:
            return await batch.stat_many(self, paths_, follow_symlinks=follow_symlinks)
        out, todo = self._from_caches(paths_, lambda p: self.cached_attr(p, follow_symlinks))
        if todo:
            asked = self.caches.now()
            rest = await batch.stat_many(self, [paths_[i] for i in todo], follow_symlinks=follow_symlinks)
            for i, r in zip(todo, rest, strict=True):
                out[i] = r
                p = paths.normalize(paths_[i])
                if isinstance(r, Attr):
                    self.caches.learn_attr(p, follow_symlinks, r, asked_at=asked)
                elif isinstance(r, FileNotFoundError):
                    self.caches.learn_absent(p, follow_symlinks, asked_at=asked)
        return out

    @staticmethod
    def _from_caches(paths_: Sequence[str], lookup: Any) -> tuple[list[Any], list[int]]:
        """Per path the cached answer (a value, or the ``OSError`` a cached answer means);
        the indexes left for meta (not cached, or not a valid path: the batch reports it)."""
        out: list[Any] = [None] * len(paths_)
        todo: list[int] = []
        for i, raw in enumerate(paths_):
            try:
                p = paths.normalize(raw)
            except (LoomError, OSError):
                todo.append(i)
                continue
            try:
                hit = lookup(p)
            except OSError as exc:  # ENOENT / EISDIR from cached attributes
                hit = exc
            if hit is None:
                todo.append(i)
            else:
                out[i] = hit
        return out, todo

    async def put_many(self, items: dict[str, bytes] | Sequence[tuple[str, bytes]]) -> list[OSError | None]:
        """Write many whole files (like ``pipe`` each); per item None or its ``OSError``."""
        from loomfs.client import batch

        names = list(items.keys() if isinstance(items, dict) else (p for p, _ in items))
        await self._settle_many(names)
        try:
            return await batch.put_many(self, items)
        finally:
            self._changed_many(names)

    async def rm_many(self, paths_: Sequence[str]) -> list[OSError | None]:
        """Unlink many files (not directories); per item None or its ``OSError``."""
        from loomfs.client import batch

        await self._settle_many(paths_)
        try:
            return await batch.rm_many(self, paths_)
        finally:
            self._changed_many(paths_)

    async def _settle_many(self, names: Sequence[str]) -> None:
        """This client's pending "w" creates at any of ``names`` are made first."""
        if not self.lazy:
            return
        norm = []
        for name in names:
            try:
                norm.append(paths.normalize(name))
            except (LoomError, OSError):
                continue  # the batch reports it
        await self.lazy.settle(*norm)

    def _changed_many(self, names: Sequence[str]) -> None:
        for name in names:
            try:
                self.caches.changed(paths.normalize(name))
            except (LoomError, OSError):
                pass  # not a valid path: nothing of it is cached

    def __repr__(self) -> str:
        return f"AsyncClient(id={self.client_id:#x} open={len(self._open_files)} {self.budget!r})"
