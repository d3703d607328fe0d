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
import dataclasses
import errno
import logging
import os
import stat
import time
import weakref
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pyfuse3

from loomfs.client.core import AsyncClient
from loomfs.client.file import AsyncFile
from loomfs.meta.ops.special import rdev_of
from loomfs.metrics.capacity import cluster_capacity
from loomfs.mount.dirops import DirOps
from loomfs.mount.dirs import DirStream
from loomfs.mount.edge import Handle, fuse_errors, join
from loomfs.mount.files import FileOps
from loomfs.mount.holds import HoldOps, Holds
from loomfs.mount.inodes import ROOT_INODE, InodeTable
from loomfs.mount.nameops import NameOps
from loomfs.mount.names import RELIST_MAX_NAMES, AbsentNames
from loomfs.mount.options import MountOptions
from loomfs.mount.prefetch import Budget
from loomfs.mount.revalidate import refresh_readers, refreshable
from loomfs.mount.stats import MountStats
from loomfs.mount.uses import FileUses
from loomfs.mount.xattrops import XattrOps
from loomfs.mount.xattrs import XattrProbes
from loomfs.wire.meta import SetattrReq
from loomfs.wire.types import Attr, FileType

logger = logging.getLogger(__name__)
T = TypeVar("T")
BLKSIZE_BYTES = 1 << 20  # st_blksize: tools size their buffers by it
STATFS_FREE_BYTES = 1 << 50  # meta does not know the storage capacity yet

_TYPE_BITS = {FileType.FILE: stat.S_IFREG, FileType.DIRECTORY: stat.S_IFDIR, FileType.SYMLINK: stat.S_IFLNK,
              FileType.FIFO: stat.S_IFIFO, FileType.SOCKET: stat.S_IFSOCK, FileType.CHAR_DEVICE: stat.S_IFCHR,
              FileType.BLOCK_DEVICE: stat.S_IFBLK}


class LoomOperations(NameOps, XattrOps, DirOps, HoldOps, FileOps):
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
        self._dirs: dict[int, tuple[int, int]] = {}  # directory inode -> (mode, gid) last seen
        # directory inode -> (attributes, when meta gave them): getattr within attr_timeout
        self._dir_attrs: dict[int, tuple[Attr, float]] = {}
        self._dir_epoch = 0  # grows with every directory change through this mount
        # names known absent (a miss, a directory made or listed here): LOOKUP without meta
        self.absent = AbsentNames(options.absent_ttl_s)
        self._relisting: dict[int, asyncio.Future[None]] = {}  # directory inode -> its relist in flight
        self.holds = Holds()  # read holds at meta of read-only opens (loomfs.mount.holds)
        self._renew_task: asyncio.Task[None] | None = None
        self._renewing: asyncio.Future[None] | None = None  # a hold renewal in flight
        self.stats = MountStats()  # what the kernel sent (user.loomfs.stats on the root)
        self.prefetch_budget = Budget(options.prefetch_mb << 20)  # loomfs.mount.prefetch
        self.uses = FileUses(lambda f: self.call(f.close()))  # reads in flight per client file
        self.xattr_probes = XattrProbes()  # setxattr's flags, from pyfuse3's check before it
        self._checked_at: weakref.WeakKeyDictionary[AsyncFile, float] = weakref.WeakKeyDictionary()
        # open inode -> its name here that a reader's reopen found leading nowhere or to another
        # file (loomfs.mount.revalidate.refreshable); inode -> the lock of its readers' reopens
        self._stale_names: dict[int, str] = {}
        self._reader_locks: dict[int, tuple[asyncio.Lock, list[int]]] = {}
        # run on this loop once the kernel's INIT is answered (the bdi read-ahead: INIT's
        # reply sets it to min(itself, what the kernel offered at mount time, 128 KiB))
        self.after_init: Callable[[], None] | None = None
        self.mount_locks: Any = None  # cluster-wide flock/fcntl locks (loomfs.mount.locks), when installed

    def init(self) -> None:
        # called inside INIT, before libfuse replies: the callback runs after the reply
        if self.after_init is not None:
            asyncio.get_running_loop().call_soon(self.after_init)

    def __repr__(self) -> str:
        return f"LoomOperations({self.inodes!r}, handles={len(self.handles)}, loop={self.options.loop})"

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a client coroutine on the client's loop (a thread hop when FUSE has its own)."""
        if asyncio.get_running_loop() is self.client_loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.client_loop))

    # --- attributes ---------------------------------------------------------------------

    def entry(self, attr: Attr) -> pyfuse3.EntryAttributes:
        self.inodes.seen(attr)  # kept while open: answers getattr when the last name is gone
        if attr.type == FileType.DIRECTORY:  # what a create in it needs (set-group-ID)
            self._dirs[attr.inode] = (attr.mode, attr.gid)
        e = pyfuse3.EntryAttributes()
        e.st_ino = attr.inode
        e.generation = 0
        e.st_mode = _TYPE_BITS.get(FileType(attr.type), stat.S_IFREG) | (attr.mode & 0o7777)
        e.st_nlink = attr.nlink  # 0 for a file open somewhere whose last name went (meta's orphan)
        e.st_uid, e.st_gid = self.options.uid_map.local(attr.uid), self.options.gid_map.local(attr.gid)
        size = attr.size
        writers = self._writers(attr.inode) if attr.type == FileType.FILE else []
        if writers:  # bytes written here and not yet synced to meta
            size = writers[-1].file.length
        if attr.type == FileType.SYMLINK:
            size = len(os.fsencode(attr.symlink_target))
        elif attr.type != FileType.FILE:
            size = 0
            e.st_rdev = attr.rdev or rdev_of(attr)  # rdev_of: the decimal text older meta servers kept
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
        # first among the inode's names: another client may have renamed or unlinked the others
        self.inodes.found(attr.inode, path, directory=attr.type == FileType.DIRECTORY)
        return self.entry(attr)

    @fuse_errors
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        path = join(self.inodes.path(parent_inode), name)
        text = os.fsdecode(name)
        if self.absent.wants_relist(parent_inode):
            await self._relist(parent_inode)
        if self.absent.absent(parent_inode, text):  # e.g. the LOOKUP before a create of a new name
            self.stats.requests["lookup_absent_cached"] += 1
            return self._no_such_name(path)
        epoch, asked = self.absent.epoch, time.monotonic()
        try:
            attr = await self._attr(path)
        except FileNotFoundError:
            self.absent.missed(parent_inode, text, asked, epoch)
            if self._path_now(parent_inode, name, path) == path:  # (else meta was asked by a name gone here)
                self.inodes.missing(path)  # renamed or unlinked elsewhere: not a name to ask by
            return self._no_such_name(path)
        self._stale_names.pop(attr.inode, None)  # a name leads to it (its readers refresh again)
        if attr.type == FileType.FILE:  # a write file open here: its length is what entry() answers
            attr = await self._catch_up(attr.inode, attr) or attr  # (compared with this STAT's)
            await refresh_readers(self, attr.inode, attr)
        # by the parent's name now: a rename of a parent further up through this mount (the
        # kernel does not serialise it with this LOOKUP) while meta answered moved it there
        return self._known(attr, self._path_now(parent_inode, name, path))

    def _path_now(self, parent_inode: int, name: bytes, asked: str) -> str:
        """The path of ``name`` in ``parent_inode`` by the parent's name now (``asked``, the
        path meta was asked by, when the parent has no name here any more)."""
        if not self.inodes.has_name(parent_inode):
            return asked
        return join(self.inodes.path(parent_inode), name)

    async def _relist(self, dir_inode: int) -> None:
        """List ``dir_inode`` again (names only, one READDIR) for ``AbsentNames``; one listing
        per directory at a time, the LOOKUPs meanwhile wait for it."""
        running = self._relisting.get(dir_inode)
        if running is not None:
            await asyncio.shield(running)
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._relisting[dir_inode] = done
        token = self.absent.begin_listing(dir_inode)
        asked = time.monotonic()
        names: list[str] = []
        try:
            pages = self.client.readdir_pages(self.inodes.path(dir_inode), page_size=RELIST_MAX_NAMES + 1,
                                              dir_inode=dir_inode)

            async def read_all() -> None:
                try:
                    async for page in pages:
                        names.extend(e.name for e in page)
                        if len(names) > RELIST_MAX_NAMES:
                            break
                finally:
                    await pages.aclose()  # type: ignore[attr-defined]
            await self.call(read_all())
            self.stats.requests["lookup_relist"] += 1
            if len(names) <= RELIST_MAX_NAMES:
                self.absent.listed(dir_inode, names, asked, token)
        except OSError as exc:  # the LOOKUP asks meta as before
            logger.debug("relisting %d: %s", dir_inode, exc)
        finally:
            self.absent.abandon(dir_inode, token)
            del self._relisting[dir_inode]
            done.set_result(None)

    def _no_such_name(self, path: str) -> pyfuse3.EntryAttributes:
        if self.options.negative_timeout_s > 0:  # the kernel keeps a negative dentry
            e = pyfuse3.EntryAttributes()
            e.st_ino = 0
            e.entry_timeout = self.options.negative_timeout_s
            return e
        raise OSError(errno.ENOENT, "no such name", path)

    async def forget(self, inode_list: list[tuple[int, int]]) -> None:
        for inode, n in inode_list:
            self.inodes.forget(inode, n)
            if not self.inodes.lookups(inode):
                self._cached.pop(inode, None)  # the kernel dropped the inode and its pages
                self._dirs.pop(inode, None)
                self._dir_attrs.pop(inode, None)
                self.absent.forget(inode)

    @fuse_errors
    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        known = self._dir_attrs.get(inode)
        if known is not None and time.monotonic() - known[1] < self.options.attr_timeout_s:
            # a directory whose attributes meta gave within attr_timeout: the kernel asks
            # again only because a create here dropped its copy (the create's times are in)
            self.stats.requests["getattr_dir_cached"] += 1
            return self.entry(known[0])
        epoch, asked = self._dir_epoch, time.monotonic()
        # a write file open here: another mount may have grown or cut it (the catch-up's STAT,
        # when it asked one, is this answer's too)
        attr = await self._catch_up(inode) or await self._attr_of(inode)
        await refresh_readers(self, inode, attr)  # read-only files open here: meta's version
        if attr.type == FileType.DIRECTORY and self._dir_epoch == epoch:
            # kept only when no directory changed through this mount while meta answered:
            # an answer from before such a change commits must not outlive it
            self._dir_attrs[inode] = (attr, asked)
        return self.entry(attr)

    def _dir_create_starts(self, inode: int) -> tuple[tuple[Attr, float] | None, int]:
        """A create in directory ``inode`` starts: its cached attributes step aside; returns
        them and the directory epoch, for ``_dir_created_in``."""
        self._dir_epoch += 1
        return self._dir_attrs.pop(inode, None), self._dir_epoch

    def _dir_created_in(self, inode: int, known: tuple[Attr, float] | None, epoch: int,
                        created_ns: int | None) -> None:
        """A create in directory ``inode`` ended: ``created_ns`` is the time meta stamped the
        directory with (the new file's ctime), 0 when the create opened an existing file (the
        directory did not change), None when it failed or the time is not known. Its cached
        attributes from before (``known``: no older than attr_timeout from meta's answer, as
        the kernel's would be) come back with that mtime and ctime, unless another directory
        change through this mount came meanwhile, so the kernel's GETATTR after every create
        (it drops the parent's attributes) needs no meta round trip. Meta's own time, never
        this host's clock: a directory's times that changed when meta was asked again made
        `tar c` report "file changed as we read it" (exit 1)."""
        unchanged = self._dir_epoch == epoch
        self._dir_epoch += 1
        if created_ns is not None and known is not None and unchanged:
            attr = known[0]
            if created_ns:
                attr = dataclasses.replace(attr, mtime_ns=created_ns, ctime_ns=created_ns)
            self._dir_attrs[inode] = (attr, known[1])

    def _dir_changed(self, *inodes: int | None) -> None:
        """Other changes of these directories (entries, links, modes, attributes): ask meta."""
        self._dir_epoch += 1
        for inode in inodes:
            if inode is not None:
                self._dir_attrs.pop(inode, None)

    @contextlib.contextmanager
    def _dir_change(self, *inodes: int | None) -> Iterator[None]:
        """Around a change of these directories: their cached attributes go at its start and
        at its end (a GETATTR answered by meta meanwhile is not kept: ``_dir_epoch``)."""
        self._dir_changed(*inodes)
        try:
            yield
        finally:
            self._dir_changed(*inodes)

    async def _attr_of(self, inode: int) -> Attr:
        """``inode``'s attributes: by its name here, or by inode when it is open here and the
        name is gone or names another file now."""
        if self.inodes.is_open(inode) and not refreshable(self, inode):
            return await self._attr_of_open(inode)  # its last name went, or leads elsewhere: by inode
        while True:
            path = self.inodes.path(inode)
            try:
                attr = await self._attr(path)
            except FileNotFoundError:
                if self.inodes.drop_stale(inode, path):
                    continue  # unlinked or renamed elsewhere: its other name (a hard link)
                if not self.inodes.is_open(inode):
                    raise
                return await self._attr_of_open(inode)  # unlinked elsewhere while open here
            if attr.inode == inode:
                return attr
            if self.inodes.drop_stale(inode, path):
                continue
            if self.inodes.is_open(inode):
                return await self._attr_of_open(inode)  # the name went to another file meanwhile
            return attr

    async def _attr_of_open(self, inode: int) -> Attr:
        """An open file's attributes by inode: a SETATTR that changes nothing answers them,
        also for a file whose last name went (meta keeps it while it is open: an orphan).
        The last ones seen if meta no longer has it."""
        req = SetattrReq(path=self._inode_path(inode), inode=inode)
        try:
            rsp = await self.call(self.client.meta.setattr(req))
        except (FileNotFoundError, PermissionError):  # gone; a read-only token
            rsp = None
        attr = rsp.attr if rsp is not None else None
        if attr is None:
            kept = self.inodes.kept(inode)
            if kept is None:
                raise OSError(errno.ENOENT, "open file is gone", str(inode))
            return dataclasses.replace(kept, nlink=0)
        return attr

    def _label(self, inode: int) -> str:
        """A path naming ``inode`` in errors and cache drops, "" when it has none here."""
        try:
            return self._inode_path(inode)
        except OSError:
            return ""

    def _inode_path(self, inode: int) -> str:
        """A path of ``inode``; for an open file whose last name went, the name it was opened
        by (calls on it go by inode: the path only names it in errors)."""
        if self.inodes.has_name(inode):
            return self.inodes.path(inode)
        for h in self.handles.values():
            if isinstance(h, Handle) and h.inode == inode:
                return h.file.path
        return self.inodes.path(inode)  # ENOENT

    @fuse_errors
    async def setattr(self, inode: int, attr: Any, fields: Any, fh: int | None, ctx: Any) -> pyfuse3.EntryAttributes:
        with self._dir_change(inode):
            # by inode (whatever names it has now, here or at another client; an open file whose
            # last name went lives on at meta as an orphan, loomfs.meta.orphans)
            path = self._inode_path(inode)
            c = self.client
            last: Attr | None = None
            if fields.update_size:
                self.drop_prefetched(inode)
                h = self.handles.get(fh) if fh is not None else None
                writers = [h] if isinstance(h, Handle) and h.writable and not h.file.closed else self._writers(inode)
                if writers:  # through the open file, so its own idea of the length follows
                    async with writers[0].lock:
                        await self._usable_locked(writers[0])  # a lock's reopen may have closed it
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
                        if not w.file.closed:  # closed meanwhile: synced
                            await self.call(w.file.fsync())
                        w.times_ns = (req.atime_ns, req.mtime_ns)
            if (req.mode, req.uid, req.gid, req.atime_ns, req.mtime_ns) != (-1, -1, -1, -1, -1):
                rsp = await self.call(c._setattr(req))  # one round trip for all of them
                last = rsp.attr
            if last is not None:
                return self.entry(last)
            return self.entry(await self._attr_of(inode))

    @fuse_errors
    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        rsp = await self.call(self.client.statfs())
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        routing = self.client.routing
        cap = cluster_capacity(routing.current.info) if routing is not None and routing.has_routing else None
        if cap is not None and cap.capacity_bytes:
            # what `loomfs top` and the dashboard show: each disk once, used = chunk bytes of
            # every replica
            s.f_blocks = cap.capacity_bytes // 4096
            s.f_bfree = s.f_bavail = cap.free_bytes // 4096
        else:  # no storage has reported its capacity yet
            s.f_blocks = (rsp.bytes_used + STATFS_FREE_BYTES) // 4096
            s.f_bfree = s.f_bavail = STATFS_FREE_BYTES // 4096
        s.f_files = rsp.files + rsp.directories + (1 << 32)
        s.f_ffree = s.f_favail = 1 << 32
        s.f_namemax = 255
        return s



assert ROOT_INODE == pyfuse3.ROOT_INODE
