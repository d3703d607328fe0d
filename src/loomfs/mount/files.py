# pyfuse3's stubs type inodes, handles and names as NewTypes; the handlers take plain ints
# mypy: disable-error-code="override"
"""The mount's file handlers: open/create, read/write, flush/fsync/release, and the kernel
page cache decision at each open (``keep_cache``, ``direct_io``). Mixed into
``LoomOperations`` (``loomfs.mount.ops``), whose state and path helpers they use."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import pyfuse3

from loomfs.client.core import AsyncClient
from loomfs.client.file import AsyncFile
from loomfs.mount.dirs import DirStream
from loomfs.mount.edge import Handle, fuse_errors, join
from loomfs.mount.inodes import InodeTable
from loomfs.mount.names import AbsentNames
from loomfs.mount.options import MountOptions
from loomfs.mount.prefetch import Budget, Prefetcher
from loomfs.mount.revalidate import refresh_readers, refreshable
from loomfs.mount.stats import MountStats
from loomfs.mount.uses import FileUses
from loomfs.mount.writers import WriterOps
from loomfs.wire.types import Attr

logger = logging.getLogger(__name__)
T = TypeVar("T")
READ_BUFFERS_KEPT = 16  # per request size: read replies reuse them
FALLOC_FL_KEEP_SIZE = 0x01  # linux/falloc.h


class FileOps(WriterOps, pyfuse3.Operations):
    client: AsyncClient
    options: MountOptions
    inodes: InodeTable
    handles: dict[int, Handle | DirStream]
    _cached: dict[int, tuple[int, int, int] | None]  # inode -> the version its kernel pages hold
    _next_fh: int
    _read_buffers: dict[int, list[bytearray]]  # request size -> free reply buffers
    _dir_attrs: dict[int, tuple[Attr, float]]  # directory inode -> (attributes, when meta gave them)
    _stale_names: dict[int, str]  # open inode -> its name here a reopen found leading elsewhere
    stats: MountStats
    prefetch_budget: Budget
    uses: FileUses
    absent: AbsentNames

    if TYPE_CHECKING:  # LoomOperations's
        async def call(self, coro: Coroutine[Any, Any, T]) -> T: ...
        async def _attr(self, path: str) -> Attr: ...
        async def _owned(self, path: str, attr: Attr, ctx: Any, parent_inode: int) -> Attr: ...
        def _known(self, attr: Attr, path: str) -> pyfuse3.EntryAttributes: ...
        def entry(self, attr: Attr) -> pyfuse3.EntryAttributes: ...
        def _dir_create_starts(self, inode: int) -> tuple[tuple[Attr, float] | None, int]: ...
        def _dir_created_in(self, inode: int, known: tuple[Attr, float] | None, epoch: int,
                            created_ns: int | None) -> None: ...
        def _inode_path(self, inode: int) -> str: ...
        async def _attr_of(self, inode: int) -> Attr: ...
        async def _take_hold(self, path: str, f: AsyncFile) -> int: ...
        async def _release_hold(self, hold_id: int) -> None: ...
        async def _drop_holds(self) -> None: ...
        async def _check_holds(self, h: Handle) -> None: ...

    def _new_handle(self, h: Handle | DirStream) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self.handles[fh] = h
        return fh

    def _file_info(self, h: Handle, flags: int) -> pyfuse3.FileInfo:
        fi = pyfuse3.FileInfo()
        fi.fh = self._new_handle(h)
        self._file_opened(h.file)
        fi.direct_io = (self.options.direct_io or bool(flags & os.O_DIRECT)
                        or (self.options.direct_read and not h.writable))
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

    @fuse_errors
    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        acc = flags & os.O_ACCMODE
        if not self.inodes.has_name(inode):  # its last name went, open here: /proc/PID/fd/N
            return self._open_nameless(inode, flags)
        path = self._inode_path(inode)
        if acc != os.O_RDONLY and self.options.read_only:
            raise pyfuse3.FUSEError(errno.EROFS)
        append = bool(flags & os.O_APPEND)
        w = self._writer(inode)
        if acc != os.O_RDONLY and w is not None:  # another descriptor's file, shared
            if flags & os.O_TRUNC:
                async with w.lock:
                    await self._usable_locked(w)  # a lock's reopen may have closed it meanwhile
                    await self.call(w.file.truncate(0))
                    await self.call(w.file.fsync())
            self.inodes.opened(inode)
            return self._file_info(Handle(inode, w.file, True, append=append, lock=w.lock), flags)
        await self._sync_writers(inode)
        if acc == os.O_RDONLY:
            opened = await self._open_by_names(inode, "rb")
            if opened is None:  # unlinked elsewhere, or the name is another file's now:
                return self._open_nameless(inode, flags, gone_errno=errno.ESTALE)  # /proc/PID/fd/N, else ESTALE
            path = opened.path
            try:  # kept by meta if unlinked while open; ENOENT if it went meanwhile
                hold_id = await self._take_hold(path, opened)
            except BaseException:
                await self.call(opened.close())
                raise
            self.inodes.opened(inode)
            return self._file_info(Handle(inode, opened, False, append=append, prefetch=self._prefetcher(opened),
                                          hold_id=hold_id), flags)
        self.drop_prefetched(inode)  # what readers here fetched ahead may be written over now
        # r+b, then O_TRUNC through the file once it is known to be the kernel's inode (a
        # "w+b" open would have cut whatever file the name leads to by now)
        f = await self._open_by_names(inode, "r+b")
        if f is None:
            return self._open_nameless(inode, flags, gone_errno=errno.ESTALE)
        if flags & os.O_TRUNC:
            try:
                await self.call(f.truncate(0))
            except BaseException:
                await self.call(f.close())
                raise
        self.inodes.opened(inode)
        return self._file_info(Handle(inode, f, True, append=append), flags)

    async def _open_by_names(self, inode: int, mode: str) -> AsyncFile | None:
        """Meta's open of the kernel's ``inode`` by its names here, the last one a LOOKUP
        confirmed first; a name that leads nowhere or to another file now (renamed or
        unlinked by another client) is dropped while another is left to try (a hard link).
        None when none leads to it."""
        while True:
            path = self._inode_path(inode)
            try:
                f = await self._opened_as(inode, await self.call(self.client.open(path, mode)))
            except FileNotFoundError:
                f = None
            if f is not None or not self.inodes.drop_stale(inode, path):
                return f

    async def _opened_as(self, inode: int, f: AsyncFile) -> AsyncFile | None:
        """``f`` if meta opened the kernel's ``inode``; else (the name was renamed over, or
        unlinked and made again, between the kernel's LOOKUP and this OPEN) None, ``f``
        closed: the descriptor must not read or write another file's bytes."""
        if f.inode == inode:
            return f
        logger.info("open of inode %d: its name leads to inode %d now", inode, f.inode)
        await self.call(f.close())
        return None

    def _open_nameless(self, inode: int, flags: int, *, gone_errno: int = errno.ENOENT) -> pyfuse3.FileInfo:
        """An open of a file open here whose last name went (``/proc/PID/fd/N``), or whose
        name leads to another file now: no path reaches it at meta, so the new descriptor
        shares an open one's client file (a write open needs a writable one). None open
        here: ``gone_errno``. ESTALE makes the kernel look the name up again and open what
        it names now, as a local open racing a rename or an unlink would: ENOENT, or a
        CREATE for ``O_CREAT`` (another node unlinked the name after this kernel's lookup,
        e.g. SQLite's rollback journal: an O_CREAT open answered ENOENT)."""
        writable = flags & os.O_ACCMODE != os.O_RDONLY
        for h in list(self.handles.values()):
            if isinstance(h, Handle) and h.inode == inode and not h.file.closed and (h.writable or not writable):
                self.inodes.opened(inode)
                shared = Handle(inode, h.file, h.writable, append=bool(flags & os.O_APPEND), lock=h.lock)
                return self._file_info(shared, flags)
        raise OSError(gone_errno, "the file is gone: no name leads to it, no descriptor here to share", str(inode))

    def _prefetcher(self, f: AsyncFile) -> Prefetcher | None:
        if self.options.prefetch_chunks <= 0 or f.inline or f.layout is None or f.layout.chunk_size <= 0:
            return None
        return Prefetcher(f, self.client.pool, self.prefetch_budget, self.options.prefetch_chunks, self.call,
                          self.stats, self.uses)

    def drop_prefetched(self, inode: int) -> None:
        """Forget what read-only handles of ``inode`` fetched ahead (the mount's prefetch and
        the client file's own read-ahead): a write or truncate here is about to change it,
        and their next reads must see it, as with one kernel inode."""
        for h in self.handles.values():
            if isinstance(h, Handle) and h.inode == inode and not h.writable:
                if h.prefetch is not None:
                    h.prefetch.drop_all()
                h.file.cache.clear()

    @fuse_errors
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: Any) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        known, epoch = self._dir_create_starts(parent_inode)  # back with the create's times if it works
        created_ns: int | None = None
        try:
            fi, entry, created_ns = await self._create(parent_inode, name, mode, flags, ctx)
            return fi, entry
        finally:
            self._dir_created_in(parent_inode, known, epoch, created_ns)

    async def _create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                      ctx: Any) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes, int | None]:
        """(file info, entry, the directory's new mtime and ctime: meta's time of the create,
        0 when no file was created (an existing one opened), None when not known)."""
        if self.options.read_only:
            raise pyfuse3.FUSEError(errno.EROFS)
        path = join(self.inodes.path(parent_inode), name)
        self.absent.adding(parent_inode, os.fsdecode(name))  # a LOOKUP of it asks meta from now on
        perm = mode & 0o7777
        c = self.client
        created_ns: int | None = None
        if flags & os.O_EXCL:
            f = await self.call(c.open(path, "x+b", perm=perm))
        else:
            try:
                f = await self.call(c.open(path, "x+b", perm=perm))
            except FileExistsError:  # the name appeared meanwhile: an open of that file
                known = self.inodes.inode_of(path)
                w = self._writer(known) if known is not None else None
                if w is not None:
                    self.inodes.remember(w.inode, path)  # create counts a lookup
                    fi = await self.open(w.inode, flags & ~os.O_CREAT, ctx)
                    return fi, self.entry(await self._attr(path)), 0
                # the name went again meanwhile, a "w+b" open makes it: not known which, so
                # meta is asked for the directory's times next
                f = await self.call(c.open(path, "w+b" if flags & os.O_TRUNC else "r+b", perm=perm))
        opened = f.opened_attr  # as meta answered the open (None for a lazy create)
        if created_ns is None and opened is not None and opened.inode:
            created_ns = opened.ctime_ns  # meta stamped the directory with the same time
        attr = opened if opened is not None and opened.inode else await self._attr(path)
        attr = await self._owned(path, attr, ctx, parent_inode)
        self.inodes.opened(attr.inode)
        h = Handle(attr.inode, f, True, append=bool(flags & os.O_APPEND))
        fi = self._file_info(h, flags)
        return fi, self._known(attr, path), created_ns

    async def fallocate(self, inode: int, fh: int, mode: int, offset: int, length: int) -> None:
        """fallocate(2) through the lowlevel glue (``loomfs.mount.lowlevel``). Mode 0 makes the
        file at least ``offset + length`` long (zeros: a length report that writes nothing,
        ``AsyncFile.grow``; meta keeps the larger length, so another client's longer file
        stays); ``FALLOC_FL_KEEP_SIZE``
        alone changes nothing. LoomFS reserves no space ahead of writes (as JuiceFS: a write is
        checked for space when it lands), so neither promises later writes cannot meet ENOSPC.
        Other modes (punching holes, zeroing, collapsing, inserting ranges): EOPNOTSUPP."""
        if offset < 0 or length <= 0:
            raise OSError(errno.EINVAL, f"fallocate offset {offset} length {length}")
        if mode & ~FALLOC_FL_KEEP_SIZE:
            raise OSError(errno.EOPNOTSUPP, f"fallocate mode {mode:#x}")
        h = self.handles.get(fh)
        if not isinstance(h, Handle) or not h.writable:
            raise OSError(errno.EBADF, "fallocate needs a file open for writing")
        if mode & FALLOC_FL_KEEP_SIZE:
            return
        async with h.lock:
            await self._usable_locked(h)  # a lock's reopen may have closed it
            self.drop_prefetched(inode)
            h.file.path = self._inode_path(inode)  # its name now (in errors)
            # a length report (meta keeps the larger): a file another client made longer is
            # not cut (this handle's own idea of the length may be behind)
            await self.call(h.file.grow(offset + length))

    @fuse_errors
    async def read(self, fh: int, off: int, size: int) -> memoryview:
        h = self.handles[fh]
        assert isinstance(h, Handle)
        if h.writable:
            await self._usable(h)
        else:
            if h.hold_id or h.lost:
                await self._check_holds(h)  # a hold lapsed while the mount was away: EIO, not zeros
            # changed by another client since: read it as meta has it now (a file whose name
            # leads elsewhere keeps reading its own bytes, asking meta nothing: refreshable)
            if refreshable(self, h.inode) and self._due(h.file):
                try:
                    attr = await self._attr_of(h.inode)
                except OSError as exc:  # a READ needs no meta: served as before (session 15 review)
                    logger.info("inode %d: no refresh before a read (%s)", h.inode, exc)
                else:
                    await refresh_readers(self, h.inode, attr)
        w = h if h.writable else self._writer(h.inode)
        self.stats.read_started(size)
        n = 0
        try:
            if w is None and h.prefetch is not None:  # a view into a chunk fetched ahead
                view = await h.prefetch.read(off, size, lambda: self._read_into_buffer(h, None, off, size))
            else:
                if h.prefetch is not None:  # written here meanwhile: fetched chunks may be stale
                    h.prefetch.drop_all()
                view = await self._read_into_buffer(h, w, off, size)
            n = len(view)
            return view
        finally:
            self.stats.read_done(n)

    async def _read_into_buffer(self, h: Handle, w: Handle | None, off: int, size: int) -> memoryview:
        free = self._read_buffers.setdefault(size, [])
        buf = free.pop() if free else bytearray(size)  # fresh memory costs a page fault per 4 KiB
        n = -1
        if w is not None:  # through the writer's file: what any descriptor here wrote
            async with w.lock:
                if w is h:  # a lock's reopen may have closed it while this READ waited
                    await self._usable_locked(h)
                if not w.file.closed:  # (else another descriptor's: this one reads its own)
                    n = await self.call(w.file.pread(off, memoryview(buf)))
        if n < 0:  # counted: a lock's revalidation closes a file it swaps out after its reads
            f = h.file
            self.uses.begin(f)
            try:
                n = await self.call(f.pread(off, memoryview(buf)))
            finally:
                self.uses.end(f)
        # pyfuse3 copies the reply to the kernel as soon as this returns, before any other
        # request handler runs on this loop: the buffer may go back to the free list now
        # (only after a read that finished: a failed one may still have fetches writing it)
        if len(free) < READ_BUFFERS_KEPT:
            free.append(buf)
        return memoryview(buf)[:n]

    @fuse_errors
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        h = self.handles[fh]
        assert isinstance(h, Handle)
        async with h.lock:
            await self._usable_locked(h)  # closed by a close(2), or by a lock's reopen meanwhile
            if h.append:  # the end as this mount's writer knows it (what getattr answers): the
                await self._catch_up_locked(h)  # (meta's, when last compared over attr_timeout ago)
                await self._usable_locked(h)
                off = h.file.length  # kernel's may be older, e.g. a size cut at another node
            return await self.call(self._write_at(h.file, off, buf))

    @staticmethod
    async def _write_at(f: AsyncFile, off: int, buf: bytes) -> int:
        return await f.pwrite(off, buf)  # one step: descriptors of this mount share the file

    @fuse_errors
    async def flush(self, fh: int) -> None:
        """close(2) of a descriptor: the bytes and the length reach meta (close-to-open).
        When no other open of this mount shares the client file, it is closed here, in one
        round trip for a small file (its last bytes with the session's end) instead of a
        sync now and a CLOSE at release; ``_usable`` reopens it if the open file is used
        again (a dup'd descriptor, a shared mapping's writeback)."""
        h = self.handles[fh]
        if isinstance(h, Handle) and h.writable:  # (a closed file: synced; a kept error is reported)
            shared = any(isinstance(o, Handle) and o is not h and o.file is h.file for o in self.handles.values())
            # a file whose last name went stays open until release: its write session is
            # what keeps it at meta, and no path could reopen it for a dup'd descriptor
            await self._synced(h, close=not shared and self.inodes.has_name(h.inode))

    @fuse_errors
    async def fsync(self, fh: int, datasync: bool) -> None:
        h = self.handles[fh]
        if isinstance(h, Handle) and not h.writable:  # Linux syncs the inode whichever descriptor
            w = self._writer(h.inode)  # asks: what this mount's write descriptors wrote (session 15;
            if w is not None:  # before, nothing: their bytes stayed buffered). Their kept errors
                await self._synced(w, report=False)  # stay theirs; this sync's failure is theirs too
        elif isinstance(h, Handle) and h.writable:
            await self._synced(h)  # (a file closed by a close(2): synced; its kept error reported)

    @fuse_errors
    async def release(self, fh: int) -> None:
        h = self.handles.pop(fh, None)
        if isinstance(h, Handle):
            if h.prefetch is not None:
                h.prefetch.close()
            try:
                shared = any(isinstance(o, Handle) and o.file is h.file for o in self.handles.values())
                if h.writable and not h.file.closed:  # closed: by the flush of its close(2)
                    await self._synced(h, close=not shared)  # the last descriptor closes it
                elif not shared:
                    await self.call(h.file.close())
            finally:
                self.inodes.closed(h.inode)
                if not self.inodes.is_open(h.inode):
                    self._stale_names.pop(h.inode, None)
                if h.hold_id:
                    await self._pass_or_release_hold(h)

    async def _pass_or_release_hold(self, h: Handle) -> None:
        """A released handle's read hold goes to a handle that shares its client file (a
        ``/proc/PID/fd`` reopen of a nameless file), else it ends."""
        for o in self.handles.values():
            if isinstance(o, Handle) and o.file is h.file and not o.hold_id:
                o.hold_id, h.hold_id = h.hold_id, 0
                return
        await self._release_hold(h.hold_id)

    async def close_all(self) -> None:
        """At unmount: close every open file (their bytes reach storage and meta)."""
        closed: set[int] = set()
        for fh in list(self.handles):
            h = self.handles.pop(fh)
            if isinstance(h, DirStream):
                await h.close()
            elif isinstance(h, Handle) and h.prefetch is not None:
                h.prefetch.close()
            if isinstance(h, Handle) and id(h.file) not in closed:
                closed.add(id(h.file))
                try:
                    await self.call(h.file.close())
                except OSError as exc:
                    logger.warning("closing %s at unmount: %s", h.file.path, exc)
        await self.uses.drain()
        await self._drop_holds()

