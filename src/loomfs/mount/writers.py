"""The write files of a mount: every write open of a file here shares one client file (and
its lock), so each descriptor reads, sizes and appends what the others wrote, as with one
kernel inode. Mixed into ``FileOps`` (``loomfs.mount.files``)."""

from __future__ import annotations

import errno
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from loomfs.client.core import AsyncClient
from loomfs.mount.dirs import DirStream
from loomfs.mount.edge import Handle
from loomfs.mount.inodes import InodeTable
from loomfs.wire.meta import SetattrReq

T = TypeVar("T")


class WriterOps:
    client: AsyncClient
    inodes: InodeTable
    handles: dict[int, Handle | DirStream]

    if TYPE_CHECKING:  # LoomOperations's
        async def call(self, coro: Coroutine[Any, Any, T]) -> T: ...
        def _inode_path(self, inode: int) -> str: ...

    def _writers(self, inode: int) -> list[Handle]:
        """Write handles of ``inode`` with an open client file (not one a close(2) closed)."""
        return [h for h in self.handles.values()
                if isinstance(h, Handle) and h.inode == inode and h.writable and not h.file.closed]

    def _writer(self, inode: int) -> Handle | None:
        """A write handle of ``inode``: every write open of a file here shares one client
        file (and its lock), so each descriptor reads, sizes and appends what the others
        wrote, as with one kernel inode."""
        for h in self.handles.values():
            if isinstance(h, Handle) and h.inode == inode and h.writable and not h.file.closed:
                return h
        return None

    async def _usable(self, h: Handle) -> None:
        """Reopen ``h``'s client file when the close(2) of its only descriptor closed it
        (``flush``) and the open file is used again: a dup'd descriptor, or the writeback
        of a shared mapping made before the close; or a lock's revalidation could not open
        it again. Every descriptor that shared the closed file shares the new one."""
        if h.file.closed:
            async with h.lock:
                await self._usable_locked(h)

    async def _usable_locked(self, h: Handle) -> None:
        """``_usable`` under ``h.lock`` (what a WRITE or READ that waited for the lock checks)."""
        old = h.file
        if not old.closed:
            return
        if not self.inodes.has_name(h.inode):
            raise OSError(errno.ENOENT, "the file's last name went after its close", old.path)
        f = await self.call(self.client.open(self._inode_path(h.inode), "r+b"))
        if f.inode != h.inode:  # the name is another file's now
            await self.call(f.close())
            raise OSError(errno.ENOENT, "the file's name went to another file", f.path)
        for o in self.handles.values():
            if isinstance(o, Handle) and o.file is old:
                o.file = f
        h.file = f  # (released meanwhile: no longer in the table)

    async def _sync_writers(self, inode: int) -> None:
        """A new open sees what this mount's open writer wrote (close-to-open at meta)."""
        w = self._writer(inode)
        if w is not None:
            async with w.lock:
                if not w.file.closed:  # closed while this waited (a lock's reopen): synced
                    await self.call(w.file.fsync())

    async def _synced(self, h: Handle, *, close: bool = False) -> None:
        async with h.lock:
            await self._synced_locked(h, close=close)

    async def _synced_locked(self, h: Handle, *, close: bool = False) -> None:
        if h.file.closed:  # by another descriptor's close(2), or a lock's reopen, meanwhile: synced
            return
        await self.call(h.file.close() if close else h.file.fsync())
        if h.times_ns is not None:  # by inode: also after its last name went
            path = self._path_of(h) or h.file.path
            req = SetattrReq(path=path, inode=h.inode, follow_symlinks=False,
                             atime_ns=h.times_ns[0], mtime_ns=h.times_ns[1])
            await self.call(self.client._setattr(req))

    def _path_of(self, h: Handle) -> str | None:
        """An open file's name now (None when the last one was unlinked)."""
        if self.inodes.has_name(h.inode):
            return self.inodes.path(h.inode)
        return None if self.inodes.lookups(h.inode) else h.file.path
