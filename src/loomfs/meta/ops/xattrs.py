"""Extended attributes: the ``user.*`` namespace, with Linux's rules and limits.

* Names: 1..255 bytes (ERANGE otherwise, as the syscalls answer), no NUL (EINVAL); only
  ``user.<something>`` is stored (another namespace: ENOTSUP; ``user.`` alone: EINVAL).
* Values: at most 64 KiB (E2BIG); a listing (names with their NULs) at most 64 KiB, and an
  inode's values at most ``XATTR_INODE_BYTES_MAX`` in all (ENOSPC), so one inode stays small.
* ``XATTR_CREATE``: EEXIST if the name is there; ``XATTR_REPLACE``: ENODATA if it is not;
  other flag bits: EINVAL. Removing or reading a missing name: ENODATA.
* Like Linux's ``xattr_permission``: user attributes live on regular files and directories
  only (setting one elsewhere: EPERM; reading: ENODATA); in a sticky directory only its owner
  (or root) sets them (EPERM); reading and listing need read permission on the inode,
  setting and removing write permission (EACCES), for the caller of the running call
  (``loomfs.meta.caller``; root passes).
* A change moves the inode's ctime; the attributes go when the inode goes (the store).

By inode: every call also takes ``inode`` (non-zero: the path is only a label in errors), so
a file open somewhere whose last name went (an orphan, ``loomfs.meta.orphans``) keeps its
attributes reachable, and a mount names the inode the kernel means, whatever names it has now
(as SETATTR by inode). Only the inode's own permission checks apply then: the caller reached
the inode already (it holds it open, or the kernel walked to it).

Virtual attributes (``user.loomfs.layout``) are the mount's (``loomfs.mount.xattrs``), not
stored here.
"""

from __future__ import annotations

import dataclasses
import os

from loomfs.errors import StatusError
from loomfs.meta import perm
from loomfs.meta.caller import caller
from loomfs.meta.ops.base import NamespaceBase
from loomfs.meta.ops.walk import walk
from loomfs.meta.paths import split_path
from loomfs.meta.store.base import MetaTxn
from loomfs.wire.status import Status
from loomfs.wire.types import Attr, FileType

XATTR_NAME_MAX_BYTES = 255  # Linux XATTR_NAME_MAX
XATTR_VALUE_MAX_BYTES = 64 << 10  # Linux XATTR_SIZE_MAX
XATTR_LIST_MAX_BYTES = 64 << 10  # Linux XATTR_LIST_MAX: every name with its NUL
XATTR_INODE_BYTES_MAX = 1 << 20  # names and values of one inode, in all
XATTR_CREATE = os.XATTR_CREATE
XATTR_REPLACE = os.XATTR_REPLACE
USER_PREFIX = b"user."

_HOLDERS = frozenset({int(FileType.FILE), int(FileType.DIRECTORY)})


def check_name(name: bytes) -> None:
    """A name this store keeps, or the errno Linux gives for it."""
    if not name or len(name) > XATTR_NAME_MAX_BYTES:
        raise StatusError(Status.ERANGE, f"xattr name of {len(name)} bytes (1..{XATTR_NAME_MAX_BYTES})")
    if b"\x00" in name:
        raise StatusError(Status.EINVAL, "xattr name with a NUL byte")
    if not name.startswith(USER_PREFIX):
        raise StatusError(Status.ENOTSUP, f"xattr namespace of {name[:32]!r}: only user.* is supported")
    if name == USER_PREFIX:
        raise StatusError(Status.EINVAL, "xattr name 'user.' names no attribute")


def check_value(value: bytes) -> None:
    if len(value) > XATTR_VALUE_MAX_BYTES:
        raise StatusError(Status.E2BIG, f"xattr value of {len(value)} bytes (max {XATTR_VALUE_MAX_BYTES})")


class XattrOps(NamespaceBase):
    async def getxattr(self, path: str, name: bytes, *, follow_symlinks: bool = True, inode: int = 0) -> bytes:
        check_name(name)
        async with self.store.read() as txn:
            attr = await self._xattr_holder(txn, path, follow_symlinks, inode)
            if attr.type not in _HOLDERS:
                raise StatusError(Status.ENODATA, f"{path}: no user attributes on this file type")
            perm.need(attr, caller(), perm.R, f"getxattr {path}")
            value = await txn.get_xattr(attr.inode, name)
        if value is None:
            raise StatusError(Status.ENODATA, f"{path}: no attribute {name[:64]!r}")
        return value

    async def listxattr(self, path: str, *, follow_symlinks: bool = True, inode: int = 0) -> list[bytes]:
        """The names (byte order). Linux lists names without a read check on the inode."""
        async with self.store.read() as txn:
            attr = await self._xattr_holder(txn, path, follow_symlinks, inode)
            return [n for n, _ in await txn.list_xattrs(attr.inode)]

    async def setxattr(self, path: str, name: bytes, value: bytes, *, flags: int = 0,
                       follow_symlinks: bool = True, inode: int = 0) -> Attr:
        """Set ``name`` to ``value``; returns the inode's attributes after (a new ctime)."""
        if flags & ~(XATTR_CREATE | XATTR_REPLACE):
            raise StatusError(Status.EINVAL, f"setxattr flags {flags:#x}")
        check_name(name)
        check_value(value)
        async with self.store.write() as txn:
            attr = await self._xattr_holder(txn, path, follow_symlinks, inode)
            self._may_change(attr, path, "setxattr")
            listed = await txn.list_xattrs(attr.inode)
            sizes = dict(listed)
            old = sizes.get(name)
            if old is not None and flags & XATTR_CREATE:
                raise StatusError(Status.EEXIST, f"{path}: attribute {name[:64]!r} exists")
            if old is None and flags & XATTR_REPLACE:
                raise StatusError(Status.ENODATA, f"{path}: no attribute {name[:64]!r}")
            if old is None:
                names_bytes = sum(len(n) + 1 for n in sizes) + len(name) + 1
                if names_bytes > XATTR_LIST_MAX_BYTES:
                    raise StatusError(Status.ENOSPC, f"{path}: attribute names would exceed {XATTR_LIST_MAX_BYTES} bytes")
            total = sum(len(n) + s for n, s in listed) - (len(name) + old if old is not None else 0)
            if total + len(name) + len(value) > XATTR_INODE_BYTES_MAX:
                raise StatusError(Status.ENOSPC, f"{path}: attributes would exceed {XATTR_INODE_BYTES_MAX} bytes")
            await txn.put_xattr(attr.inode, name, value)
            return await self._changed(txn, attr)

    async def removexattr(self, path: str, name: bytes, *, follow_symlinks: bool = True, inode: int = 0) -> Attr:
        check_name(name)
        async with self.store.write() as txn:
            attr = await self._xattr_holder(txn, path, follow_symlinks, inode)
            self._may_change(attr, path, "removexattr")
            if not await txn.delete_xattr(attr.inode, name):
                raise StatusError(Status.ENODATA, f"{path}: no attribute {name[:64]!r}")
            return await self._changed(txn, attr)

    # -- helpers --------------------------------------------------------------------------

    async def _xattr_holder(self, txn: MetaTxn, path: str, follow_symlinks: bool, inode: int = 0) -> Attr:
        if inode:
            await self._confine(txn, inode)  # by inode number: only inodes of the caller's tenant
            attr = await txn.get_inode(inode)
            if attr is None:
                raise StatusError(Status.ENOENT, f"{path or 'inode'} (inode {inode})")
            return attr
        r = await walk(txn, split_path(path), follow_last=follow_symlinks)
        if r.inode is None:
            raise StatusError(Status.ENOENT, path)
        return await self._attr(txn, r.inode)

    @staticmethod
    def _may_change(attr: Attr, path: str, what: str) -> None:
        if attr.type not in _HOLDERS:
            raise StatusError(Status.EPERM, f"{what} {path}: user attributes only on files and directories")
        who = caller()
        if attr.type == FileType.DIRECTORY and attr.mode & 0o1000 and not perm.is_owner(attr, who):
            raise StatusError(Status.EPERM, f"{what} {path}: sticky directory, not the owner")
        perm.need(attr, who, perm.W, f"{what} {path}")

    async def _changed(self, txn: MetaTxn, attr: Attr) -> Attr:
        attr = dataclasses.replace(attr, ctime_ns=max(self.clock.now_ns(), attr.ctime_ns))
        await txn.put_inode(attr)
        return attr
