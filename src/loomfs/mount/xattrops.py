# pyfuse3's stubs type inodes, handles and names as NewTypes; the handlers take plain ints
# mypy: disable-error-code="override"
"""The mount's extended attribute handlers: stored ``user.*`` attributes by inode, the
virtual ``user.loomfs.layout`` (``loomfs.mount.xattrs``) and the root's ``user.loomfs.stats``.
Mixed into ``LoomOperations`` (``loomfs.mount.ops``)."""

from __future__ import annotations

import errno
from collections.abc import Coroutine
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

import pyfuse3

from loomfs.client import xattrs
from loomfs.client.core import AsyncClient
from loomfs.meta.ops.xattrs import check_name
from loomfs.mount.edge import fuse_errors
from loomfs.mount.inodes import ROOT_INODE
from loomfs.mount.options import MountOptions
from loomfs.mount.stats import STATS_XATTR, MountStats
from loomfs.mount.xattrs import LAYOUT_XATTR, XattrProbes, decode_layout, encode_layout
from loomfs.wire.types import Attr, FileType

T = TypeVar("T")
_XATTR_HOLDERS = (FileType.FILE, FileType.DIRECTORY)  # what user.* attributes live on (Linux)


class XattrOps:
    client: AsyncClient
    options: MountOptions
    stats: MountStats
    xattr_probes: XattrProbes

    if TYPE_CHECKING:  # LoomOperations's
        async def call(self, coro: Coroutine[Any, Any, T]) -> T: ...
        async def _attr(self, path: str) -> Attr: ...
        def _dir_change(self, *inodes: int | None) -> AbstractContextManager[None]: ...
        async def _attr_of(self, inode: int) -> Attr: ...
        def _inode_path(self, inode: int) -> str: ...
        def _label(self, inode: int) -> str: ...

    @fuse_errors
    async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
        if name == STATS_XATTR and inode == ROOT_INODE:
            return self.stats.as_json()
        # meta's answer for a name it never stores, without asking it: the kernel asks for
        # security.capability before the first write of every open file
        check_name(name)
        if name != LAYOUT_XATTR:  # stored (user.*): by inode (also a file open here whose name went)
            try:
                value = await self.call(xattrs.getxattr_inode(self.client, inode, name, path=self._label(inode)))
            except OSError as exc:
                if exc.errno == errno.ENODATA:
                    self.xattr_probes.seen(ctx, inode, name, present=False)
                raise
            self.xattr_probes.seen(ctx, inode, name, present=True)
            return value
        attr = await self._attr_of(inode)
        if attr.type not in _XATTR_HOLDERS:  # symlinks, FIFOs, sockets, devices: no user attributes
            raise pyfuse3.FUSEError(errno.ENODATA)
        return encode_layout(attr.layout)

    @fuse_errors
    async def listxattr(self, inode: int, ctx: Any) -> list[bytes]:
        attr = await self._attr_of(inode)
        if attr.type not in _XATTR_HOLDERS:
            return []
        # the virtual layout attribute is not listed (as CephFS hides its ceph.* ones): listed,
        # tools that copy attributes would copy it out of the mount as a stored attribute, and
        # `rsync -X` into the mount would try to remove it from every file (EPERM, exit 23)
        stored = await self.call(xattrs.listxattr_inode(self.client, inode, path=self._label(inode)))
        return [n for n in stored if n != LAYOUT_XATTR]

    @fuse_errors
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: Any) -> None:
        with self._dir_change(inode):
            # pyfuse3 does not pass XATTR_CREATE / XATTR_REPLACE: it checks them with a getxattr
            # first, in this request; what that check found says which flag it was, and meta
            # applies that flag in its own transaction (two clients creating one name at once:
            # one gets EEXIST). The kernel checked the caller's permission (default_permissions)
            # and meta checks the mount's.
            if self.options.read_only:
                raise pyfuse3.FUSEError(errno.EROFS)
            check_name(name)  # ENOTSUP for trusted.*, security.*, system.* (cp -a, tar --xattrs)
            if name != LAYOUT_XATTR:
                flags = self.xattr_probes.flags_for(ctx, inode, name)
                await self.call(xattrs.setxattr_inode(self.client, inode, name, value, flags, path=self._label(inode)))
                return
            path = self._inode_path(inode)
            attr = await self._attr(path)
            if attr.type != FileType.DIRECTORY:
                raise pyfuse3.FUSEError(errno.EPERM)  # a file's layout is fixed when it is created
            if ctx is not None and ctx.uid != 0 and self.options.uid_map.cluster(ctx.uid) != attr.uid:
                raise pyfuse3.FUSEError(errno.EPERM)  # like chmod: the owner's (or root's) to change
            await self.call(self.client.set_layout(path, decode_layout(value, attr.layout)))

    @fuse_errors
    async def removexattr(self, inode: int, name: bytes, ctx: Any) -> None:
        with self._dir_change(inode):
            if name == LAYOUT_XATTR:
                raise pyfuse3.FUSEError(errno.EPERM)
            if self.options.read_only:
                raise pyfuse3.FUSEError(errno.EROFS)
            check_name(name)
            await self.call(xattrs.removexattr_inode(self.client, inode, name, path=self._label(inode)))
