"""The write files of a mount: every write open of a file here shares one client file (and
its lock), so each descriptor reads, sizes and appends what the others wrote, as with one
kernel inode. Mixed into ``FileOps`` (``loomfs.mount.files``)."""

from __future__ import annotations

import errno
import logging
import time
import weakref
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from loomfs.client.core import AsyncClient
from loomfs.client.file import AsyncFile
from loomfs.mount.dirs import DirStream
from loomfs.mount.edge import Handle
from loomfs.mount.inodes import InodeTable
from loomfs.mount.options import MountOptions
from loomfs.mount.stats import MountStats
from loomfs.wire.meta import SetattrReq
from loomfs.wire.types import Attr

logger = logging.getLogger(__name__)
T = TypeVar("T")


class WriterOps:
    client: AsyncClient
    options: MountOptions
    inodes: InodeTable
    handles: dict[int, Handle | DirStream]
    stats: MountStats
    # client file -> when its length (a read-only one's version) was last known to be meta's
    _checked_at: weakref.WeakKeyDictionary[AsyncFile, float]

    if TYPE_CHECKING:  # LoomOperations's
        async def call(self, coro: Coroutine[Any, Any, T]) -> T: ...
        def _inode_path(self, inode: int) -> str: ...
        async def _attr(self, path: str) -> Attr: ...

    def _file_opened(self, f: AsyncFile) -> None:
        """``f`` was opened from meta just now: its length is meta's."""
        self._checked_at.setdefault(f, time.monotonic())

    def _is_due(self, f: AsyncFile) -> bool:
        """Whether ``f`` was last compared with meta more than ``attr_timeout`` ago."""
        now = time.monotonic()
        return now - self._checked_at.setdefault(f, now) >= self.options.attr_timeout_s

    def _due(self, f: AsyncFile) -> bool:
        """``_is_due``; then it counts as compared now."""
        if not self._is_due(f):
            return False
        self._checked_at[f] = time.monotonic()
        return True

    async def _catch_up(self, inode: int, seen: Attr | None = None) -> Attr | None:
        """Before ``getattr``/``lookup`` answer with this mount's write file's length: see
        ``_catch_up_locked``. A file still sending what it buffers is left as it is (its
        own length is ahead); a write error met here is kept for the descriptors' next
        fsync or close(2), which report it. The file's lock is taken only when a comparison
        is due: a stat does not wait for the WRITE or fsync in flight otherwise. ``seen``:
        meta's attributes of the file the caller asked by a name just now (a LOOKUP's), the
        first comparison's. Returns meta's attributes of the file as the catch-up left them
        (``seen``, or what it asked after its sync), None when not known (the caller asks):
        a due GETATTR costs one STAT, not two (review session 15)."""
        w = self._writer(inode)
        if w is None or w.file.dirty or not self._is_due(w.file):
            return seen
        async with w.lock:
            if not w.file.closed and not w.file.dirty:
                return await self._catch_up_locked(w, keep_errors=True, seen=seen)
        return seen

    async def _catch_up_locked(self, h: Handle, *, keep_errors: bool = False,
                               seen: Attr | None = None) -> Attr | None:
        """Under ``h.lock``: a write file whose length was last compared with meta's more than
        ``attr_timeout`` ago (the window the kernel's attributes may be that old) is compared
        again, as NFS revalidates the size before an O_APPEND write: another mount or client
        may have appended to the file or cut it (logrotate's copytruncate) meanwhile. Its own
        writes are reported first (fsync: meta's length is then the larger of its end and
        another's, or another client's cut), then meta's length asked; when the two differ the
        file is closed and opened again from meta (``_usable_locked``: its length, inline bytes,
        truncate epoch, a new write session). Before, a write file's length was the one it
        opened with and its own writes ever after: the ``O_APPEND`` records of two mounts
        wrote over each other, a writer's next line after a copytruncate elsewhere left a hole
        of zeros up to its old end, and ``fstat`` never showed either. Returns meta's
        attributes of the file by its name after the catch-up's sync (``seen`` when it
        asked nothing), None when not known or the file was opened again."""
        f = h.file
        # (nameless here: no other client reaches it by a name)
        if f.closed or not self.inodes.has_name(h.inode) or not self._due(f):
            return seen
        # A sync only when something is buffered, or the lengths differ: meta stamps mtime and
        # ctime at every sync that reports a length, so a sync at each stat of an idle write
        # file moved its times forward (and reopened every reader of it) (session 15 review)
        synced = False
        if f.dirty:
            if not await self._catch_up_sync(h, keep_errors):
                return None
            synced = True
            seen = None  # asked before the sync
        attr = seen if seen is not None and seen.inode == h.inode else await self._catch_up_attr(h)
        if attr is not None and attr.size != f.length and not synced:
            if not await self._catch_up_sync(h, keep_errors):  # its writes may be what differs
                return None
            attr = await self._catch_up_attr(h)
        if attr is None or attr.size == f.length:
            return attr
        self.stats.requests["writer_catch_ups"] += 1
        logger.debug("inode %d: meta's length %d, this mount's writer's %d: reopened", h.inode, attr.size, f.length)
        # opened again from meta before the old file closes: a name renamed or unlinked
        # elsewhere meanwhile leaves the descriptors their open file (its write session keeps
        # it at meta), not a closed one no path reopens (session 15 review)
        try:
            new = await self.call(self.client.open(self._inode_path(h.inode), "r+b"))
        except OSError as exc:
            logger.info("inode %d: not reopened (%s): its open file stays", h.inode, exc)
            return None
        if new.inode != h.inode:  # the name is another file's now
            await self.call(new.close())
            return None
        try:
            await self.call(f.close())  # synced just now: ends the old write session
        except OSError as exc:
            logger.warning("inode %d: closing the write file it caught up from: %s", h.inode, exc)
            self._keep_error(f, exc)  # every descriptor's next fsync or close(2) reports it
        self._file_opened(new)
        for o in self.handles.values():  # every descriptor sharing it
            if isinstance(o, Handle) and o.file is f:
                o.file = new
        h.file = new
        return None

    async def _catch_up_sync(self, h: Handle, keep_errors: bool) -> bool:
        """The catch-up's fsync of ``h``'s file: False when it failed and the error is kept for
        the descriptors' next fsync or close(2) (``keep_errors``, a GETATTR's: every descriptor
        sharing the file keeps it); else it is raised (an O_APPEND write's: that write reports
        it for its descriptor, and every other descriptor sharing the file keeps it)."""
        f = h.file
        try:
            await self.call(f.fsync())
        except OSError as exc:
            self._keep_error(f, exc, reported_by=None if keep_errors else h)
            if not keep_errors:
                raise
            return False
        return True

    async def _catch_up_attr(self, h: Handle) -> Attr | None:
        """Meta's attributes of ``h``'s file by its name here, for the catch-up; None when the
        name leads elsewhere or nowhere now (its next open finds out), or meta could not be
        asked (compared again once attr_timeout has passed: a failed check fails no write)."""
        try:
            attr = await self._attr(self._inode_path(h.inode))
        except FileNotFoundError:
            return None
        except OSError as exc:
            logger.info("inode %d: meta's length not known (%s): not compared this time", h.inode, exc)
            return None
        return attr if attr.inode == h.inode else None

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
        self._file_opened(f)
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

    async def _synced(self, h: Handle, *, close: bool = False, report: bool = True) -> None:
        async with h.lock:
            await self._synced_locked(h, close=close, report=report)

    async def _synced_locked(self, h: Handle, *, close: bool = False, report: bool = True) -> None:
        """``h``'s file synced (or closed: ``close``), its times set again after. ``report``:
        the fsync or close(2) of ``h``'s descriptor, which raises the write error ``h`` kept
        (met by a catch-up or another descriptor's sync) or this sync's; without it (a lock's
        reopen, a read-only descriptor's fsync) ``h``'s kept error stays for its descriptor.
        A failed sync's error is kept by every other descriptor sharing the file (and by
        ``h`` without ``report``) for its next fsync or close(2): as Linux reports a
        writeback error to every file open at the time, once each (errseq)."""
        kept = self._kept_error(h) if report else None
        if not h.file.closed:  # (closed by another descriptor's close(2), or a lock's reopen: synced)
            f = h.file
            try:
                await self.call(f.close() if close else f.fsync())
            except OSError as exc:
                self._keep_error(f, exc, reported_by=h if report else None)
                raise
            if h.times_ns is not None:  # by inode: also after its last name went
                path = self._path_of(h) or h.file.path
                req = SetattrReq(path=path, inode=h.inode, follow_symlinks=False,
                                 atime_ns=h.times_ns[0], mtime_ns=h.times_ns[1])
                await self.call(self.client._setattr(req))
        if kept is not None:
            raise kept

    def _path_of(self, h: Handle) -> str | None:
        """An open file's name now (None when the last one was unlinked)."""
        if self.inodes.has_name(h.inode):
            return self.inodes.path(h.inode)
        return None if self.inodes.lookups(h.inode) else h.file.path

    def _keep_error(self, f: AsyncFile, exc: BaseException, *, reported_by: Handle | None = None) -> None:
        """A write error of the client file ``f``: every descriptor sharing it but
        ``reported_by`` (whose request raises it now) reports it at its next fsync or
        close(2), once (a descriptor keeps the first error it has not reported)."""
        for o in self.handles.values():
            if isinstance(o, Handle) and o.file is f and o is not reported_by and o.error is None:
                o.error = exc

    @staticmethod
    def _kept_error(h: Handle) -> BaseException | None:
        """The write error ``h``'s descriptor kept (``_keep_error``), taken: reported once
        by each descriptor."""
        exc, h.error = h.error, None
        return exc
