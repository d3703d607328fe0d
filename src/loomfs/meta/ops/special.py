"""Special files: FIFOs, sockets and device nodes (mknod). They hold no data; the kernel
that opens one serves it. A device's number is ``Attr.rdev`` (stores before the rdev column
kept it as decimal text in ``Attr.symlink_target``, which ``rdev_of`` still reads);
``Attr.size`` stays 0."""

from __future__ import annotations

import dataclasses

from loomfs.errors import StatusError
from loomfs.meta import perm
from loomfs.meta.caller import caller
from loomfs.meta.ops.base import NamespaceBase
from loomfs.meta.ops.walk import walk
from loomfs.meta.paths import split_path
from loomfs.wire.status import Status
from loomfs.wire.types import Attr, FileType

SPECIAL_TYPES = frozenset({FileType.FIFO, FileType.SOCKET, FileType.CHAR_DEVICE, FileType.BLOCK_DEVICE})
DEVICE_TYPES = frozenset({FileType.CHAR_DEVICE, FileType.BLOCK_DEVICE})


def rdev_of(attr: Attr) -> int:
    """A device node's number (0 for anything else)."""
    if attr.type not in DEVICE_TYPES:
        return 0
    if attr.rdev:
        return attr.rdev
    return int(attr.symlink_target) if attr.symlink_target.isdigit() else 0


class SpecialOps(NamespaceBase):
    async def mknod(self, path: str, *, type: int, mode: int = 0o644, rdev: int = 0, uid: int = 0,
                    gid: int = 0) -> Attr:
        if type not in SPECIAL_TYPES:
            raise StatusError(Status.EINVAL, f"mknod of type {type}: FIFO, socket or device only")
        if rdev < 0:
            raise StatusError(Status.EINVAL, f"device number {rdev}")
        parts = split_path(path)
        async with self.store.write() as txn:
            r = await walk(txn, parts, follow_last=False)
            if r.inode is not None or r.parent is None or r.name is None:
                raise StatusError(Status.EEXIST, path)
            who = caller()
            parent = await self._attr(txn, r.parent)
            perm.may_create(parent, who, path)
            if type in DEVICE_TYPES and who.uid != 0:
                raise StatusError(Status.EPERM, f"{path}: only root makes device nodes")
            uid, gid, mode = self._owner(parent, who, type, mode, uid, gid)
            attr = await self._new_inode(
                txn, r.parent, r.name, type=type, mode=mode, uid=uid, gid=gid, layout=None,
                now=self.clock.now_ns(),
            )
            if type in DEVICE_TYPES and rdev:
                attr = dataclasses.replace(attr, rdev=rdev)
                await txn.put_inode(attr)
            return attr
