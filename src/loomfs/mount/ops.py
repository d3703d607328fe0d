# pyfuse3's stubs type inodes, handles and names as NewTypes; the handlers take plain ints
# mypy: disable-error-code="override"
"""pyfuse3 ``Operations`` over the async client core: inode requests -> path calls.

Each handler resolves inodes to paths through the :class:`InodeTable`, runs the client call
(on the client's loop: directly when FUSE shares it, else bridged, see ``call``) and answers
with kernel attributes. Errors are ``OSError``s with an errno; they become ``FUSEError`` here,
at the edge, with the cause kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import os
import stat
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import pyfuse3

from loomfs.client.core import AsyncClient
from loomfs.client.file import AsyncFile
from loomfs.meta.ops.special import rdev_of
from loomfs.mount.dirs import DirStream, Pages
from loomfs.mount.inodes import ROOT_INODE, InodeTable
from loomfs.mount.options import MountOptions
from loomfs.mount.xattrs import LAYOUT_XATTR, decode_layout, encode_layout
from loomfs.wire.meta import SetattrReq
from loomfs.wire.types import Attr, FileType

logger = logging.getLogger(__name__)
T = TypeVar("T")
P = ParamSpec("P")
BLKSIZE_BYTES = 1 << 20  # st_blksize: tools size their buffers by it
STATFS_FREE_BYTES = 1 << 50  # meta does not know the storage capacity yet
READ_BUFFERS_KEPT = 16  # per request size: read replies reuse them

_TYPE_BITS = {FileType.FILE: stat.S_IFREG, FileType.DIRECTORY: stat.S_IFDIR, FileType.SYMLINK: stat.S_IFLNK,
              FileType.FIFO: stat.S_IFIFO, FileType.SOCKET: stat.S_IFSOCK, FileType.CHAR_DEVICE: stat.S_IFCHR,
              FileType.BLOCK_DEVICE: stat.S_IFBLK}
_SPECIAL_OF_BITS = {stat.S_IFIFO: FileType.FIFO, stat.S_IFSOCK: FileType.SOCKET, stat.S_IFCHR: FileType.CHAR_DEVICE,
                    stat.S_IFBLK: FileType.BLOCK_DEVICE}


def _fuse_errors(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kw: P.kwargs) -> T:
        try:
            return await fn(*args, **kw)
        except pyfuse3.FUSEError:
            raise
        except OSError as exc:
            logger.debug("%s%r: %s", fn.__name__, args[1:], exc)
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from exc
        except ValueError as exc:
            raise pyfuse3.FUSEError(errno.EINVAL) from exc
    return wrapper


def _join(parent: str, name: bytes) -> str:
    n = os.fsdecode(name)
    if "/" in n or n in ("", ".", ".."):
        raise OSError(errno.EINVAL, "bad name", n)
    return f"/{n}" if parent == "/" else f"{parent}/{n}"


@dataclass(eq=False)
class Handle:
    """One open file: the client's file object and what the kernel opened it as."""

    inode: int
    file: AsyncFile
    writable: bool
    append: bool = False  # O_APPEND: every write goes to the end this mount knows
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # utimens while open for writing (cp -a, tar x): meta stamps mtime at sync and close,
    # so the times are set again after those
    times_ns: tuple[int, int] | None = None


class LoomOperations(pyfuse3.Operations):
    supports_dot_lookup = False

    def __init__(self, client: AsyncClient, client_loop: asyncio.AbstractEventLoop, options: MountOptions):
        super().__init__()
        self.client = client
        self.client_loop = client_loop
        self.options = options
        self.inodes = InodeTable()
        self.handles: dict[int, Handle | DirStream] = {}
        # inode -> the version (size, mtime, ctime) of the file its kernel pages hold
        self._cached: dict[int, tuple[int, int, int] | None] = {}
        self._next_fh = 1
        self._read_buffers: dict[int, list[bytearray]] = {}  # request size -> free reply buffers

    def __repr__(self) -> str:
        return f"LoomOperations({self.inodes!r}, handles={len(self.handles)}, loop={self.options.loop})"

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a client coroutine on the client's loop (a thread hop when FUSE has its own)."""
        if asyncio.get_running_loop() is self.client_loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.client_loop))

    # --- attributes ---------------------------------------------------------------------

    def _writers(self, inode: int) -> list[Handle]:
        return [h for h in self.handles.values() if isinstance(h, Handle) and h.inode == inode and h.writable]

    def entry(self, attr: Attr) -> pyfuse3.EntryAttributes:
        self.inodes.seen(attr)  # kept while open: answers getattr when the last name is gone
        e = pyfuse3.EntryAttributes()
        e.st_ino = attr.inode
        e.generation = 0
        e.st_mode = _TYPE_BITS.get(FileType(attr.type), stat.S_IFREG) | (attr.mode & 0o7777)
        e.st_nlink = attr.nlink
        e.st_uid, e.st_gid = self.options.uid_map.local(attr.uid), self.options.gid_map.local(attr.gid)
        size = attr.size
        writers = self._writers(attr.inode) if attr.type == FileType.FILE else []
        if writers:  # bytes written here and not yet synced to meta
            size = writers[-1].file.length
        if attr.type == FileType.SYMLINK:
            size = len(os.fsencode(attr.symlink_target))
        elif attr.type != FileType.FILE:
            size = 0
            e.st_rdev = rdev_of(attr)
        e.st_size = size
        e.st_blksize = BLKSIZE_BYTES
        e.st_blocks = (size + 511) // 512
        e.st_atime_ns, e.st_mtime_ns, e.st_ctime_ns = attr.atime_ns, attr.mtime_ns, attr.ctime_ns
        e.attr_timeout = self.options.attr_timeout_s
        e.entry_timeout = self.options.entry_timeout_s
        return e

    async def _attr(self, path: str) -> Attr:
        return await self.call(self.client.lstat(path))

    def _known(self, attr: Attr, path: str) -> pyfuse3.EntryAttributes:
        self.inodes.remember(attr.inode, path)
        return self.entry(attr)

    @_fuse_errors
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        path = _join(self.inodes.path(parent_inode), name)
        try:
            attr = await self._attr(path)
        except FileNotFoundError:
            if self.options.negative_timeout_s > 0:
                e = pyfuse3.EntryAttributes()
                e.st_ino = 0
                e.entry_timeout = self.options.negative_timeout_s
                return e
            raise
        return self._known(attr, path)

    async def forget(self, inode_list: list[tuple[int, int]]) -> None:
        for inode, n in inode_list:
            self.inodes.forget(inode, n)
            if not self.inodes.lookups(inode):
                self._cached.pop(inode, None)  # the kernel dropped the inode and its pages

    @_fuse_errors
    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        kept = self.inodes.kept(inode)
        if not self.inodes.has_name(inode) and kept is not None:
            return self.entry(kept)  # open, its last name unlinked: what was seen, the writer's length
        attr = await self._attr(self.inodes.path(inode))
        if attr.inode != inode and kept is not None:
            return self.entry(kept)  # the name went to another file meanwhile
        return self.entry(attr)

    @_fuse_errors
    async def setattr(self, inode: int, attr: Any, fields: Any, fh: int | None, ctx: Any) -> pyfuse3.EntryAttributes:
        # by inode (whatever names it has now, here or at another client); ENOENT once its
        # last name is gone (meta drops an unlinked inode even while it is open)
        path = self.inodes.path(inode)
        c = self.client
        last: Attr | None = None
        if fields.update_size:
            h = self.handles.get(fh) if fh is not None else None
            writers = [h] if isinstance(h, Handle) and h.writable else self._writers(inode)
            if writers:  # through the open file, so its own idea of the length follows
                async with writers[0].lock:
                    writers[0].file.path = path  # the file truncates by path: its name now
                    await self.call(writers[0].file.truncate(attr.st_size))
                    await self.call(writers[0].file.fsync())
            else:
                rsp = await self.call(c._setattr(SetattrReq(path=path, inode=inode, size=attr.st_size)))
                last = rsp.attr
        req = SetattrReq(
            path=path, inode=inode, follow_symlinks=False,  # the kernel resolved the path
            mode=attr.st_mode & 0o7777 if fields.update_mode else -1,
            uid=self.options.uid_map.cluster(attr.st_uid) if fields.update_uid else -1,
            gid=self.options.gid_map.cluster(attr.st_gid) if fields.update_gid else -1,
            atime_ns=attr.st_atime_ns if fields.update_atime else -1,
            mtime_ns=attr.st_mtime_ns if fields.update_mtime else -1,
        )
        if req.atime_ns != -1 or req.mtime_ns != -1:
            for w in self._writers(inode):
                async with w.lock:
                    await self.call(w.file.fsync())
                    w.times_ns = (req.atime_ns, req.mtime_ns)
        if (req.mode, req.uid, req.gid, req.atime_ns, req.mtime_ns) != (-1, -1, -1, -1, -1):
            rsp = await self.call(c._setattr(req))  # one round trip for all of them
            last = rsp.attr
        if last is not None:
            return self.entry(last)
        return self.entry(await self._attr(path))

    async def _keep_if_open(self, path: str) -> None:
        """Before a name goes: the attributes of an open file it names, for getattr after."""
        inode = self.inodes.inode_of(path)
        if inode is not None and self.inodes.is_open(inode):
            with contextlib.suppress(FileNotFoundError):
                self.inodes.seen(await self._attr(path))

    # --- names --------------------------------------------------------------------------

    @_fuse_errors
    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: Any) -> pyfuse3.EntryAttributes:
        path = _join(self.inodes.path(parent_inode), name)
        attr = await self.call(self.client.mkdir(path, mode & 0o7777))
        attr = await self._owned(path, attr, ctx)
        return self._known(attr, path)

    async def _owned(self, path: str, attr: Attr, ctx: Any) -> Attr:
        """New objects belong to the caller (meta creates them as this process's user)."""
        if ctx is None:
            return attr
        uid, gid = self.options.uid_map.cluster(ctx.uid), self.options.gid_map.cluster(ctx.gid)
        if (attr.uid, attr.gid) != (uid, gid):
            req = SetattrReq(path=path, follow_symlinks=False, uid=uid, gid=gid)
            rsp = await self.call(self.client._setattr(req))
            return rsp.attr if rsp.attr is not None else await self._attr(path)
        return attr

    @_fuse_errors
    async def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        path = _join(self.inodes.path(parent_inode), name)
        await self.call(self.client.rmdir(path))
        self.inodes.unlinked(path)

    @_fuse_errors
    async def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        path = _join(self.inodes.path(parent_inode), name)
        await self._keep_if_open(path)
        await self.call(self.client.unlink(path))
        self.inodes.unlinked(path)

    @_fuse_errors
    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int,
                     name_new: bytes, flags: int, ctx: Any) -> None:
        src = _join(self.inodes.path(parent_inode_old), name_old)
        dst = _join(self.inodes.path(parent_inode_new), name_new)
        exchange = bool(flags & pyfuse3.RENAME_EXCHANGE)
        no_replace = bool(flags & pyfuse3.RENAME_NOREPLACE)
        if exchange:
            await self.call(self.client.exchange(src, dst))
        else:
            if not no_replace:
                await self._keep_if_open(dst)
            await self.call(self.client.rename(src, dst, no_replace=no_replace))
        self.inodes.renamed(src, dst, exchange=exchange)
        moves = [(src, dst), (dst, src)] if exchange else [(src, dst)]
        for h in self.handles.values():  # open files under the old names go by the new ones
            if isinstance(h, Handle):
                for a, b in moves:
                    if h.file.path == a or h.file.path.startswith(a + "/"):
                        h.file.path = b + h.file.path[len(a):]
                        break

    @_fuse_errors
    async def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: Any) -> pyfuse3.EntryAttributes:
        path = _join(self.inodes.path(parent_inode), name)
        await self.call(self.client.symlink(os.fsdecode(target), path))
        return self._known(await self._attr(path), path)

    @_fuse_errors
    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: Any) -> pyfuse3.EntryAttributes:
        path = _join(self.inodes.path(parent_inode), name)
        kind = _SPECIAL_OF_BITS.get(stat.S_IFMT(mode))
        if kind is None:
            if stat.S_IFMT(mode) not in (0, stat.S_IFREG):
                raise pyfuse3.FUSEError(errno.EINVAL)
            f = await self.call(self.client.open(path, "xb", perm=mode & 0o7777))  # mknod of a regular file
            await self.call(f.close())
            attr = await self._owned(path, await self._attr(path), ctx)
        else:
            uid, gid = (ctx.uid, ctx.gid) if ctx is not None else (os.getuid(), os.getgid())
            uid, gid = self.options.uid_map.cluster(uid), self.options.gid_map.cluster(gid)
            made = await self.call(self.client.mknod(path, kind, mode & 0o7777, rdev, uid=uid, gid=gid))
            attr = made if made is not None else await self._attr(path)
        return self._known(attr, path)

    @_fuse_errors
    async def readlink(self, inode: int, ctx: Any) -> bytes:
        return os.fsencode(await self.call(self.client.readlink(self.inodes.path(inode))))

    @_fuse_errors
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Any) -> pyfuse3.EntryAttributes:
        src = self.inodes.path(inode)
        dst = _join(self.inodes.path(new_parent_inode), new_name)
        await self.call(self.client.link(src, dst))
        return self._known(await self._attr(dst), dst)

    # --- extended attributes ----------------------------------------------------------------

    @_fuse_errors
    async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
        if name != LAYOUT_XATTR:
            raise pyfuse3.FUSEError(errno.ENODATA)  # meta stores no others (docs/mount.md)
        attr = await self._attr(self.inodes.path(inode))
        if attr.type == FileType.SYMLINK:
            raise pyfuse3.FUSEError(errno.ENODATA)
        return encode_layout(attr.layout)

    @_fuse_errors
    async def listxattr(self, inode: int, ctx: Any) -> list[bytes]:
        attr = await self._attr(self.inodes.path(inode))
        return [] if attr.type == FileType.SYMLINK else [LAYOUT_XATTR]

    @_fuse_errors
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: Any) -> None:
        if name != LAYOUT_XATTR:
            raise pyfuse3.FUSEError(errno.ENOTSUP)
        if self.options.read_only:
            raise pyfuse3.FUSEError(errno.EROFS)
        path = self.inodes.path(inode)
        attr = await self._attr(path)
        if attr.type != FileType.DIRECTORY:
            raise pyfuse3.FUSEError(errno.EPERM)  # a file's layout is fixed when it is created
        if ctx is not None and ctx.uid != 0 and self.options.uid_map.cluster(ctx.uid) != attr.uid:
            raise pyfuse3.FUSEError(errno.EPERM)  # like chmod: the owner's (or root's) to change
        await self.call(self.client.set_layout(path, decode_layout(value, attr.layout)))

    @_fuse_errors
    async def removexattr(self, inode: int, name: bytes, ctx: Any) -> None:
        raise pyfuse3.FUSEError(errno.EPERM if name == LAYOUT_XATTR else errno.ENODATA)

    # --- directories ----------------------------------------------------------------------

    @_fuse_errors
    async def opendir(self, inode: int, ctx: Any) -> int:
        path = self.inodes.path(inode)

        def pages_after(after: str) -> Pages:
            return self.client.readdir_pages(path, with_attrs=True, page_size=self.options.readdir_page,
                                             after=after)
        return self._new_handle(DirStream(path, pages_after, self.call))

    @_fuse_errors
    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        """Entries from offset ``start_id`` (entry i's offset is i + 1), a page at a time."""
        h = self.handles[fh]
        assert isinstance(h, DirStream)
        i = start_id
        base, page = await h.page_at(i)
        while page:
            for e in page[i - base:]:
                path = _join(h.path, os.fsencode(e.name))
                attr = e.attr if e.attr is not None else await self._attr(path)
                if not pyfuse3.readdir_reply(token, os.fsencode(e.name), self.entry(attr), i + 1):
                    return
                self.inodes.remember(attr.inode, path)
                i += 1
            base, page = await h.page_at(i)

    async def releasedir(self, fh: int) -> None:
        h = self.handles.pop(fh, None)
        if isinstance(h, DirStream):
            await h.close()

    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        return None  # meta commits every change before it answers

    @_fuse_errors
    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        rsp = await self.call(self.client.statfs())
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_blocks = (rsp.bytes_used + STATFS_FREE_BYTES) // 4096
        s.f_bfree = s.f_bavail = STATFS_FREE_BYTES // 4096
        s.f_files = rsp.files + rsp.directories + (1 << 32)
        s.f_ffree = s.f_favail = 1 << 32
        s.f_namemax = 255
        return s

    # --- files ----------------------------------------------------------------------------

    def _new_handle(self, h: Handle | DirStream) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self.handles[fh] = h
        return fh

    def _file_info(self, h: Handle, flags: int) -> pyfuse3.FileInfo:
        fi = pyfuse3.FileInfo()
        fi.fh = self._new_handle(h)
        fi.direct_io = self.options.direct_io or bool(flags & os.O_DIRECT)
        fi.keep_cache = self._keep_cache(h)
        return fi

    def _keep_cache(self, h: Handle) -> bool:
        """Whether the kernel's pages of this file stay valid at this open. ``auto``: on a
        relaxed path always; else only when meta's version of the file (size, mtime, ctime)
        is the one the pages were read under (the last open here saw the same) - a file
        another client changed and closed reads afresh (close-to-open). Writes through this
        mount update the pages as they go. (The kernel also drops them when a getattr shows
        a new mtime or size: libfuse asks for auto_inval_data.)"""
        attr = h.file.opened_attr
        version = (attr.size, attr.mtime_ns, attr.ctime_ns) if attr is not None else None
        if h.writable or version is None:
            self._cached.pop(h.inode, None)
            return False
        before = self._cached.get(h.inode)
        self._cached[h.inode] = version
        if self.options.cache == "none":
            return False
        if self.options.cache == "keep" or self.client.caches.relaxed(h.file.path):
            return True
        return before == version

    async def _sync_writers(self, inode: int) -> None:
        """A new open sees what this mount's open writers wrote (close-to-open at meta)."""
        for w in self._writers(inode):
            async with w.lock:
                await self.call(w.file.fsync())

    @_fuse_errors
    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        path = self.inodes.path(inode)
        acc = flags & os.O_ACCMODE
        if acc != os.O_RDONLY and self.options.read_only:
            raise pyfuse3.FUSEError(errno.EROFS)
        await self._sync_writers(inode)
        if acc == os.O_RDONLY:
            f = await self.call(self.client.open(path, "rb"))
        elif flags & os.O_TRUNC:
            f = await self.call(self.client.open(path, "w+b"))
        else:
            f = await self.call(self.client.open(path, "r+b"))
        self.inodes.opened(inode)
        return self._file_info(Handle(inode, f, acc != os.O_RDONLY, append=bool(flags & os.O_APPEND)), flags)

    @_fuse_errors
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: Any) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        if self.options.read_only:
            raise pyfuse3.FUSEError(errno.EROFS)
        path = _join(self.inodes.path(parent_inode), name)
        perm = mode & 0o7777
        c = self.client
        if flags & os.O_EXCL:
            f = await self.call(c.open(path, "x+b", perm=perm))
        else:
            try:
                f = await self.call(c.open(path, "x+b", perm=perm))
            except FileExistsError:
                f = await self.call(c.open(path, "w+b" if flags & os.O_TRUNC else "r+b", perm=perm))
        opened = f.opened_attr  # as meta answered the open (None for a lazy create)
        attr = opened if opened is not None and opened.inode else await self._attr(path)
        attr = await self._owned(path, attr, ctx)
        self.inodes.opened(attr.inode)
        h = Handle(attr.inode, f, True, append=bool(flags & os.O_APPEND))
        fi = self._file_info(h, flags)
        return fi, self._known(attr, path)

    @_fuse_errors
    async def read(self, fh: int, off: int, size: int) -> memoryview:
        h = self.handles[fh]
        assert isinstance(h, Handle)
        free = self._read_buffers.setdefault(size, [])
        buf = free.pop() if free else bytearray(size)  # fresh memory costs a page fault per 4 KiB
        if h.writable:
            async with h.lock:
                n = await self.call(h.file.pread(off, memoryview(buf)))
        else:
            n = await self.call(h.file.pread(off, memoryview(buf)))
        # pyfuse3 copies the reply to the kernel as soon as this returns, before any other
        # request handler runs on this loop: the buffer may go back to the free list now
        # (only after a read that finished: a failed one may still have fetches writing it)
        if len(free) < READ_BUFFERS_KEPT:
            free.append(buf)
        return memoryview(buf)[:n]

    @_fuse_errors
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        h = self.handles[fh]
        assert isinstance(h, Handle)
        if h.append:  # the end as the kernel knows it, or as any of this mount's writers do
            off = max(off, *(w.file.length for w in self._writers(h.inode)))
        async with h.lock:
            return await self.call(self._write_at(h.file, off, buf))

    @staticmethod
    async def _write_at(f: AsyncFile, off: int, buf: bytes) -> int:
        await f.seek(off)
        return await f.write(buf)

    async def _synced(self, h: Handle, *, close: bool = False) -> None:
        async with h.lock:
            await self.call(h.file.close() if close else h.file.fsync())
            path = self._path_of(h)
            if h.times_ns is not None and path is not None:
                req = SetattrReq(path=path, follow_symlinks=False,
                                 atime_ns=h.times_ns[0], mtime_ns=h.times_ns[1])
                await self.call(self.client._setattr(req))

    def _path_of(self, h: Handle) -> str | None:
        """An open file's name now (None when the last one was unlinked)."""
        if self.inodes.has_name(h.inode):
            return self.inodes.path(h.inode)
        return None if self.inodes.lookups(h.inode) else h.file.path

    @_fuse_errors
    async def flush(self, fh: int) -> None:
        """close(2) of a descriptor: the bytes and the length reach meta (close-to-open)."""
        h = self.handles[fh]
        if isinstance(h, Handle) and h.writable:
            await self._synced(h)

    @_fuse_errors
    async def fsync(self, fh: int, datasync: bool) -> None:
        h = self.handles[fh]
        if isinstance(h, Handle) and h.writable:
            await self._synced(h)

    @_fuse_errors
    async def release(self, fh: int) -> None:
        h = self.handles.pop(fh, None)
        if isinstance(h, Handle):
            try:
                if h.writable:
                    await self._synced(h, close=True)
                else:
                    await self.call(h.file.close())
            finally:
                self.inodes.closed(h.inode)

    async def close_all(self) -> None:
        """At unmount: close every open file (their bytes reach storage and meta)."""
        for fh in list(self.handles):
            h = self.handles.pop(fh)
            if isinstance(h, DirStream):
                await h.close()
            elif isinstance(h, Handle):
                try:
                    await self.call(h.file.close())
                except OSError as exc:
                    logger.warning("closing %s at unmount: %s", h.file.path, exc)


assert ROOT_INODE == pyfuse3.ROOT_INODE
