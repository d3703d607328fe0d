"""Namespace-shape operations: stat, mkdir, readdir, rename, unlink, rmdir, symlinks, links."""

from __future__ import annotations

import dataclasses

from loomfs.common.identity import Identity
from loomfs.errors import StatusError
from loomfs.meta import perm
from loomfs.meta.caller import caller
from loomfs.meta.layout import validate_dir_layout
from loomfs.meta.ops.base import C_BYTES, C_DIRS, C_FILES, DIR, LINK, NamespaceBase
from loomfs.meta.ops.walk import Resolved, walk
from loomfs.meta.paths import check_symlink_target, split_path
from loomfs.meta.store.base import MetaTxn
from loomfs.wire.status import Status
from loomfs.wire.types import ROOT_INODE, Attr, DirEntry, Layout

READDIR_LIMIT_DEFAULT = 1024
READDIR_LIMIT_MAX = 8192


@dataclasses.dataclass(frozen=True, slots=True)
class Statfs:
    files: int
    directories: int
    bytes_used: int
    gc_pending: int
    trims_pending: int = 0


class DirOps(NamespaceBase):
    async def stat(self, path: str, *, follow_symlinks: bool = True) -> Attr:
        parts = split_path(path)
        who = caller()
        if not who.tenant:  # one statement when the engine can (a tenant's root needs a lookup)
            hit = self.store.quick_attr(ROOT_INODE, parts, follow_last=follow_symlinks, perms=who.uid != 0)
            if hit is not None:
                if hit.dirs is not None:
                    perm.search_rows(hit.dirs, who, "path lookup")  # as the walk checks them
                return hit.attr
        async with self.store.read() as txn:
            r = await walk(txn, parts, follow_last=follow_symlinks)
            if r.inode is None:
                raise StatusError(Status.ENOENT, path)
            return await self._attr(txn, r.inode)

    async def gc_queued(self, inodes: list[int]) -> list[int]:
        """The ones of ``inodes`` that wait in the GC queue (fsck: not orphans, just not removed yet)."""
        async with self.store.read() as txn:
            return [i for i in inodes if await txn.gc_get(i) is not None]

    async def live_inodes(self, inodes: list[int]) -> list[int]:
        """The ones of ``inodes`` meta holds (of every tenant): fsck asks before it calls the
        chunks of the others orphans."""
        async with self.store.read() as txn:
            found = await txn.get_inodes(inodes)
        return [i for i in inodes if i in found]

    async def statfs(self) -> Statfs:
        async with self.store.read() as txn:
            c = await txn.counters()
            gc = await txn.gc_count()
            trims = await txn.trim_count()
        # never negative: a counter held at the int64 bound (sizes summing past it) drifts after
        return Statfs(c.get(C_FILES, 0), c.get(C_DIRS, 0), max(0, c.get(C_BYTES, 0)), gc, trims)

    async def mkdir(
        self, path: str, *, mode: int = 0o755, parents: bool = False, exist_ok: bool = False,
        uid: int = 0, gid: int = 0,
    ) -> Attr:
        parts = split_path(path)
        who = caller()
        async with self.store.write() as txn:
            now = self.clock.now_ns()
            if parents:
                for i in range(1, len(parts)):
                    a = await walk(txn, parts[:i], follow_last=True)
                    if a.inode is None:
                        await self._mkdir_at(txn, a, mode, who, uid, gid, now, path)
                    elif not a.is_dir:
                        raise StatusError(Status.ENOTDIR, f"{'/'.join(parts[:i])!r} is not a directory")
            r = await walk(txn, parts, follow_last=False)
            if r.inode is not None:
                if exist_ok:
                    t = r if r.type != LINK else await walk(txn, parts, follow_last=True)
                    if t.is_dir and t.inode is not None:
                        return await self._attr(txn, t.inode)
                raise StatusError(Status.EEXIST, path)
            return await self._mkdir_at(txn, r, mode, who, uid, gid, now, path)

    async def _mkdir_at(self, txn: MetaTxn, r: Resolved, mode: int, who: Identity, uid: int, gid: int, now: int,
                        path: str) -> Attr:
        assert r.parent is not None and r.name is not None
        parent = await self._attr(txn, r.parent)
        perm.may_create(parent, who, path)
        uid, gid, mode = self._owner(parent, who, DIR, mode, uid, gid)
        layout = dataclasses.replace(parent.layout or self.default_layout, chains=[])
        return await self._new_inode(
            txn, r.parent, r.name, type=DIR, mode=mode, uid=uid, gid=gid, layout=layout, now=now
        )

    async def readdir(
        self, path: str, *, after: str = "", limit: int = READDIR_LIMIT_DEFAULT, with_attrs: bool = False
    ) -> tuple[list[DirEntry], bool]:
        entries, more, _ = await self.readdir_in(path, after=after, limit=limit, with_attrs=with_attrs)
        return entries, more

    async def readdir_in(
        self, path: str, *, after: str = "", limit: int = READDIR_LIMIT_DEFAULT, with_attrs: bool = False,
        dir_inode: int = 0,
    ) -> tuple[list[DirEntry], bool, int]:
        """A page of ``path``'s entries after ``after``, whether more follow, and the directory's
        inode. ``dir_inode``: the directory the listing began in; ``path`` leading to another one
        now (renamed away, another made under its name) is ENOENT, as Linux answers getdents of
        a directory removed while open, never the other directory's entries."""
        parts = split_path(path)
        if limit < 0:
            raise StatusError(Status.EINVAL, f"readdir limit {limit}")
        limit = min(limit or READDIR_LIMIT_DEFAULT, READDIR_LIMIT_MAX)
        async with self.store.read() as txn:
            r = await walk(txn, parts, follow_last=True)
            if r.inode is None:
                raise StatusError(Status.ENOENT, path)
            if dir_inode and r.inode != dir_inode:
                raise StatusError(Status.ENOENT, f"{path!r} leads to another directory than the listing's now")
            if not r.is_dir:
                raise StatusError(Status.ENOTDIR, path)
            who = caller()
            if who.uid != 0:
                d_attr = await self._attr(txn, r.inode)
                perm.may_list(d_attr, who, path)
                with_attrs = with_attrs and perm.allowed(d_attr, who, perm.X)  # stat needs search
            rows = await txn.list_dentries(r.inode, after, limit + 1)
            more = len(rows) > limit
            del rows[limit:]
            attrs = await txn.get_inodes([d.inode for d in rows]) if with_attrs else {}
        entries = [DirEntry(name=d.name, inode=d.inode, type=d.type, attr=attrs.get(d.inode)) for d in rows]
        return entries, more, r.inode

    async def rename(self, src: str, dst: str, *, no_replace: bool = False,
                     expect: tuple[int, int, int] | None = None) -> None:
        """``expect`` (inode, size, mtime_ns): ``dst`` must still be that file, unchanged and
        with no write session open, else EBUSY (checked in the rename's transaction)."""
        sp, dp = split_path(src), split_path(dst)
        async with self.store.write() as txn:
            s = await walk(txn, sp, follow_last=False)
            d = await walk(txn, dp, follow_last=False)
            if s.inode is None:
                raise StatusError(Status.ENOENT, src)
            if s.parent is None or s.name is None or d.parent is None or d.name is None:
                raise StatusError(Status.EBUSY, "cannot rename the root")
            if no_replace and d.inode is not None:
                raise StatusError(Status.EEXIST, dst)
            if s.is_dir and s.inode in d.stack:
                raise StatusError(Status.EINVAL, f"cannot move {src!r} into its own subtree")
            if d.inode is not None and d.inode in s.stack:
                raise StatusError(Status.ENOTEMPTY, f"{dst!r} is an ancestor of {src!r}")
            self._same_tenant(s.parent, d.parent)
            if d.inode == s.inode:
                return  # same entry, or a hard link of it
            moved = await self._attr(txn, s.inode)
            replaced = await self._attr(txn, d.inode) if d.inode is not None else None
            if expect is not None:
                if replaced is None or (replaced.inode, replaced.size, replaced.mtime_ns) != expect:
                    raise StatusError(Status.EBUSY, f"{dst!r} changed")
                if await txn.has_session(replaced.inode):
                    raise StatusError(Status.EBUSY, f"{dst!r} is open for writing")
            who = caller()
            if who.uid != 0:
                perm.may_delete(await self._attr(txn, s.parent), moved, who, src)
                d_parent = await self._attr(txn, d.parent)
                if replaced is not None:
                    perm.may_delete(d_parent, replaced, who, dst)
                else:
                    perm.may_create(d_parent, who, dst)
                if s.is_dir and s.parent != d.parent:
                    perm.may_move_dir(moved, who, src)
            if d.inode is not None:
                if s.is_dir and not d.is_dir:
                    raise StatusError(Status.ENOTDIR, dst)
                if not s.is_dir and d.is_dir:
                    raise StatusError(Status.EISDIR, dst)
                if d.is_dir and await txn.has_dentries(d.inode):
                    raise StatusError(Status.ENOTEMPTY, dst)
            now = self.clock.now_ns()
            await txn.delete_dentry(s.parent, s.name)
            await txn.put_dentry(d.parent, d.name, s.inode, s.type)
            if replaced is not None:
                await self._drop_link(txn, replaced, now)
            src_delta = -1 if s.is_dir else 0
            dst_delta = (1 if s.is_dir else 0) - (1 if d.is_dir else 0)
            if s.parent == d.parent:
                await txn.touch_inode(s.parent, mtime_ns=now, ctime_ns=now, nlink_delta=src_delta + dst_delta)
            else:
                await txn.touch_inode(s.parent, mtime_ns=now, ctime_ns=now, nlink_delta=src_delta)
                await txn.touch_inode(d.parent, mtime_ns=now, ctime_ns=now, nlink_delta=dst_delta)
            await txn.put_inode(dataclasses.replace(moved, ctime_ns=now))

    async def unlink(self, path: str) -> tuple[int, bool]:
        parts = split_path(path)
        async with self.store.write() as txn:
            r = await walk(txn, parts, follow_last=False)
            if r.inode is None:
                raise StatusError(Status.ENOENT, path)
            if r.parent is None or r.name is None:
                raise StatusError(Status.EISDIR, path)
            attr = await self._attr(txn, r.inode)
            who = caller()
            if who.uid != 0:
                perm.may_delete(await self._attr(txn, r.parent), attr, who, path)
            if r.is_dir:
                raise StatusError(Status.EISDIR, path)
            now = self.clock.now_ns()
            await txn.delete_dentry(r.parent, r.name)
            await txn.touch_inode(r.parent, mtime_ns=now, ctime_ns=now)
            return attr.inode, await self._drop_link(txn, attr, now)

    async def rmdir(self, path: str) -> tuple[int, bool]:
        parts = split_path(path)
        async with self.store.write() as txn:
            r = await walk(txn, parts, follow_last=False)
            if r.inode is None:
                raise StatusError(Status.ENOENT, path)
            if r.parent is None or r.name is None:
                raise StatusError(Status.EBUSY, "cannot remove the root")
            attr = await self._attr(txn, r.inode)
            who = caller()
            if who.uid != 0:
                perm.may_delete(await self._attr(txn, r.parent), attr, who, path)
            if not r.is_dir:
                raise StatusError(Status.ENOTDIR, path)
            if await txn.has_dentries(r.inode):
                raise StatusError(Status.ENOTEMPTY, path)
            now = self.clock.now_ns()
            await txn.delete_dentry(r.parent, r.name)
            await txn.touch_inode(r.parent, mtime_ns=now, ctime_ns=now, nlink_delta=-1)
            await self._drop_link(txn, attr, now)
            return attr.inode, False

    async def symlink(self, target: str, path: str, *, uid: int = 0, gid: int = 0) -> Attr:
        check_symlink_target(target)
        parts = split_path(path)
        async with self.store.write() as txn:
            r = await walk(txn, parts, follow_last=False)
            if r.inode is not None or r.parent is None or r.name is None:
                raise StatusError(Status.EEXIST, path)
            who = caller()
            parent = await self._attr(txn, r.parent)
            perm.may_create(parent, who, path)
            uid, gid, _ = self._owner(parent, who, LINK, 0o777, uid, gid)
            return await self._new_inode(
                txn, r.parent, r.name, type=LINK, mode=0o777, uid=uid, gid=gid, layout=None,
                symlink_target=target, now=self.clock.now_ns(),
            )

    async def readlink(self, path: str) -> str:
        parts = split_path(path)
        async with self.store.read() as txn:
            r = await walk(txn, parts, follow_last=False)
            if r.inode is None:
                raise StatusError(Status.ENOENT, path)
            if r.type != LINK:
                raise StatusError(Status.EINVAL, f"{path!r} is not a symbolic link")
            return (await self._attr(txn, r.inode)).symlink_target

    async def link(self, src: str, dst: str, *, follow_symlinks: bool = False) -> Attr:
        sp, dp = split_path(src), split_path(dst)
        async with self.store.write() as txn:
            s = await walk(txn, sp, follow_last=follow_symlinks)
            if s.inode is None:
                raise StatusError(Status.ENOENT, src)
            d = await walk(txn, dp, follow_last=False)
            if d.inode is not None or d.parent is None or d.name is None:
                raise StatusError(Status.EEXIST, dst)
            self._same_tenant(s.inode, d.parent)
            attr = await self._attr(txn, s.inode)
            who = caller()
            if who.uid != 0:
                perm.may_link(attr, who, src)
                perm.may_create(await self._attr(txn, d.parent), who, dst)
            if s.type == DIR:
                raise StatusError(Status.EPERM, f"hard link to directory {src!r}")
            now = self.clock.now_ns()
            attr = dataclasses.replace(attr, nlink=attr.nlink + 1, ctime_ns=now)
            await txn.put_inode(attr)
            await txn.put_dentry(d.parent, d.name, attr.inode, attr.type)
            await txn.touch_inode(d.parent, mtime_ns=now, ctime_ns=now)
            return attr

    async def set_layout(self, path: str, layout: Layout | None) -> Attr:
        parts = split_path(path)
        stored = validate_dir_layout(layout)
        async with self.store.write() as txn:
            r = await walk(txn, parts, follow_last=True)
            if r.inode is None:
                raise StatusError(Status.ENOENT, path)
            if not r.is_dir:
                raise StatusError(Status.ENOTDIR, path)
            attr = await self._attr(txn, r.inode)
            if not perm.is_owner(attr, caller()):
                raise StatusError(Status.EPERM, f"{path}: only the owner or root sets a directory's layout")
            attr = dataclasses.replace(attr, layout=stored, ctime_ns=self.clock.now_ns())
            await txn.put_inode(attr)
            return attr
