# pyfuse3's stubs type inodes, handles and names as NewTypes; the handlers take plain ints
# mypy: disable-error-code="override"
"""The mount's handlers that make, remove and rename names (mkdir, rmdir, unlink, rename,
symlink, mknod, link, readlink) and the owner of what a caller creates. Mixed into
``LoomOperations`` (``loomfs.mount.ops``), whose state and path helpers they use."""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Coroutine
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

import pyfuse3

from loomfs.client.core import AsyncClient
from loomfs.mount.dirs import DirStream
from loomfs.mount.edge import Handle, fuse_errors, join
from loomfs.mount.inodes import InodeTable
from loomfs.mount.names import AbsentNames
from loomfs.mount.options import MountOptions
from loomfs.wire.meta import SetattrReq
from loomfs.wire.types import Attr, FileType

T = TypeVar("T")
_SPECIAL_OF_BITS = {stat.S_IFIFO: FileType.FIFO, stat.S_IFSOCK: FileType.SOCKET, stat.S_IFCHR: FileType.CHAR_DEVICE,
                    stat.S_IFBLK: FileType.BLOCK_DEVICE}


class NameOps:
    client: AsyncClient
    options: MountOptions
    inodes: InodeTable
    handles: dict[int, Handle | DirStream]
    absent: AbsentNames
    _dirs: dict[int, tuple[int, int]]  # directory inode -> (mode, gid) last seen

    if TYPE_CHECKING:  # LoomOperations's
        async def call(self, coro: Coroutine[Any, Any, T]) -> T: ...
        async def _attr(self, path: str) -> Attr: ...
        def _dir_change(self, *inodes: int | None) -> AbstractContextManager[None]: ...
        def _dir_changed(self, *inodes: int | None) -> None: ...
        def _known(self, attr: Attr, path: str) -> pyfuse3.EntryAttributes: ...

    @fuse_errors
    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: Any) -> pyfuse3.EntryAttributes:
        with self._dir_change(parent_inode):
            path = join(self.inodes.path(parent_inode), name)
            if self._setgid(parent_inode):
                mode |= stat.S_ISGID  # a set-group-ID directory's subdirectories are too
            self.absent.adding(parent_inode, os.fsdecode(name))
            asked = time.monotonic()
            attr = await self.call(self.client.mkdir(path, mode & 0o7777))
            self.absent.listed(attr.inode, (), asked, set())  # new: empty (nothing here knew its inode)
            attr = await self._owned(path, attr, ctx, parent_inode)
            return self._known(attr, path)

    def _setgid(self, dir_inode: int) -> bool:
        mode_gid = self._dirs.get(dir_inode)
        return mode_gid is not None and bool(mode_gid[0] & stat.S_ISGID)

    def _owner(self, ctx: Any, parent_inode: int) -> tuple[int, int]:
        """(uid, gid) as meta stores them for what ``ctx``'s caller creates in the directory:
        the caller's, but the directory's group when it is set-group-ID (Linux)."""
        uid, gid = (ctx.uid, ctx.gid) if ctx is not None else (os.getuid(), os.getgid())
        uid, gid = self.options.uid_map.cluster(uid), self.options.gid_map.cluster(gid)
        if self._setgid(parent_inode):
            gid = self._dirs[parent_inode][1]
        return uid, gid

    async def _owned(self, path: str, attr: Attr, ctx: Any, parent_inode: int) -> Attr:
        """New objects belong to the caller (meta creates them as this process's user)."""
        if ctx is None:
            return attr
        uid, gid = self._owner(ctx, parent_inode)
        if (attr.uid, attr.gid) != (uid, gid):
            req = SetattrReq(path=path, follow_symlinks=False, uid=uid, gid=gid)
            rsp = await self.call(self.client._setattr(req))
            return rsp.attr if rsp.attr is not None else await self._attr(path)
        return attr

    @fuse_errors
    async def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        with self._dir_change(parent_inode):
            path = join(self.inodes.path(parent_inode), name)
            await self.call(self.client.rmdir(path))
            self.absent.removed(parent_inode, os.fsdecode(name))
            self.inodes.unlinked(path)

    @fuse_errors
    async def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        with self._dir_change(parent_inode):
            path = join(self.inodes.path(parent_inode), name)
            # a file open here (or anywhere) stays usable without a name: meta keeps it while
            # held (loomfs.meta.orphans; read-only opens here hold it, loomfs.mount.holds)
            await self.call(self.client.unlink(path))
            self.absent.removed(parent_inode, os.fsdecode(name))
            self.inodes.unlinked(path)

    @fuse_errors
    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int,
                     name_new: bytes, flags: int, ctx: Any) -> None:
        with self._dir_change(parent_inode_old, parent_inode_new):
            src = join(self.inodes.path(parent_inode_old), name_old)
            dst = join(self.inodes.path(parent_inode_new), name_new)
            self._dir_changed(self.inodes.inode_of(src), self.inodes.inode_of(dst))  # moved ones: new ctime
            exchange = bool(flags & pyfuse3.RENAME_EXCHANGE)
            no_replace = bool(flags & pyfuse3.RENAME_NOREPLACE)
            self.absent.adding(parent_inode_new, os.fsdecode(name_new))
            self.absent.adding(parent_inode_old, os.fsdecode(name_old))  # an exchange keeps both
            if exchange:
                await self.call(self.client.exchange(src, dst))
            else:  # an open file replaced lives on at meta while held (loomfs.meta.orphans)
                await self.call(self.client.rename(src, dst, no_replace=no_replace))
                if src != dst:
                    self.absent.removed(parent_inode_old, os.fsdecode(name_old))
            self.inodes.renamed(src, dst, exchange=exchange)
            moves = [(src, dst), (dst, src)] if exchange else [(src, dst)]
            for h in self.handles.values():  # open files (and listings) under the old names go by the new ones
                for a, b in moves:
                    if isinstance(h, Handle) and (h.file.path == a or h.file.path.startswith(a + "/")):
                        h.file.path = b + h.file.path[len(a):]
                        break
                    if isinstance(h, DirStream) and (h.path == a or h.path.startswith(a + "/")):
                        h.path = b + h.path[len(a):]
                        break

    @fuse_errors
    async def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: Any) -> pyfuse3.EntryAttributes:
        with self._dir_change(parent_inode):
            path = join(self.inodes.path(parent_inode), name)
            self.absent.adding(parent_inode, os.fsdecode(name))
            await self.call(self.client.symlink(os.fsdecode(target), path))
            return self._known(await self._owned(path, await self._attr(path), ctx, parent_inode), path)

    @fuse_errors
    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: Any) -> pyfuse3.EntryAttributes:
        with self._dir_change(parent_inode):
            path = join(self.inodes.path(parent_inode), name)
            self.absent.adding(parent_inode, os.fsdecode(name))
            kind = _SPECIAL_OF_BITS.get(stat.S_IFMT(mode))
            if kind is None:
                if stat.S_IFMT(mode) not in (0, stat.S_IFREG):
                    raise pyfuse3.FUSEError(errno.EINVAL)
                f = await self.call(self.client.open(path, "xb", perm=mode & 0o7777))  # mknod of a regular file
                await self.call(f.close())
                attr = await self._owned(path, await self._attr(path), ctx, parent_inode)
            else:
                uid, gid = self._owner(ctx, parent_inode)
                made = await self.call(self.client.mknod(path, kind, mode & 0o7777, rdev, uid=uid, gid=gid))
                attr = made if made is not None else await self._attr(path)
            return self._known(attr, path)

    @fuse_errors
    async def readlink(self, inode: int, ctx: Any) -> bytes:
        return os.fsencode(await self.call(self.client.readlink(self.inodes.path(inode))))

    @fuse_errors
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Any) -> pyfuse3.EntryAttributes:
        with self._dir_change(new_parent_inode):
            src = self.inodes.path(inode)
            dst = join(self.inodes.path(new_parent_inode), new_name)
            self.absent.adding(new_parent_inode, os.fsdecode(new_name))
            await self.call(self.client.link(src, dst))
            return self._known(await self._attr(dst), dst)
