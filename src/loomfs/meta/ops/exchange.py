"""RENAME_EXCHANGE: two existing names swap the inodes they name, atomically (renameat2)."""

from __future__ import annotations

import dataclasses

from loomfs.errors import StatusError
from loomfs.meta import perm
from loomfs.meta.caller import caller
from loomfs.meta.ops.base import DIR, NamespaceBase
from loomfs.meta.ops.walk import walk
from loomfs.meta.paths import split_path
from loomfs.wire.status import Status


class ExchangeOps(NamespaceBase):
    async def exchange(self, a: str, b: str) -> None:
        """``a`` names what ``b`` named and the other way round; both must exist (ENOENT).
        Either may be a directory (of any content); neither may hold the other (EINVAL)."""
        pa, pb = split_path(a), split_path(b)
        async with self.store.write() as txn:
            s = await walk(txn, pa, follow_last=False)
            d = await walk(txn, pb, follow_last=False)
            if s.inode is None:
                raise StatusError(Status.ENOENT, a)
            if d.inode is None:
                raise StatusError(Status.ENOENT, b)
            if s.parent is None or s.name is None or d.parent is None or d.name is None:
                raise StatusError(Status.EBUSY, "cannot exchange the root")
            self._same_tenant(s.parent, d.parent)
            if s.inode == d.inode:
                return  # one entry, or two links of one file
            if s.inode in d.stack or d.inode in s.stack:
                raise StatusError(Status.EINVAL, f"{a!r} and {b!r}: one holds the other")
            sa, da = await self._attr(txn, s.inode), await self._attr(txn, d.inode)
            who = caller()
            if who.uid != 0:  # both names leave their directory; a directory changing parent needs write on it
                perm.may_delete(await self._attr(txn, s.parent), sa, who, a)
                perm.may_delete(await self._attr(txn, d.parent), da, who, b)
                if s.parent != d.parent:
                    for dir_attr, name in ((sa, a), (da, b)):
                        if dir_attr.type == DIR:
                            perm.may_move_dir(dir_attr, who, name)
            now = self.clock.now_ns()
            await txn.delete_dentry(s.parent, s.name)
            await txn.delete_dentry(d.parent, d.name)
            await txn.put_dentry(s.parent, s.name, d.inode, d.type)
            await txn.put_dentry(d.parent, d.name, s.inode, s.type)
            if s.parent == d.parent:
                await txn.touch_inode(s.parent, mtime_ns=now, ctime_ns=now)
            else:  # a directory's '..' moves with it: the parents' link counts follow
                moved = int(d.is_dir) - int(s.is_dir)
                await txn.touch_inode(s.parent, mtime_ns=now, ctime_ns=now, nlink_delta=moved)
                await txn.touch_inode(d.parent, mtime_ns=now, ctime_ns=now, nlink_delta=-moved)
            await txn.put_inode(dataclasses.replace(sa, ctime_ns=now))
            await txn.put_inode(dataclasses.replace(da, ctime_ns=now))
