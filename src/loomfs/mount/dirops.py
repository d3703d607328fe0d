# pyfuse3's stubs type inodes, handles and names as NewTypes; the handlers take plain ints
# mypy: disable-error-code="override"
"""The mount's directory handlers: opendir, readdir (READDIRPLUS a page at a time through
``loomfs.mount.dirs.DirStream``, "." and ".." first), releasedir, fsyncdir. Mixed into
``LoomOperations`` (``loomfs.mount.ops``)."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import pyfuse3

from loomfs.client.core import AsyncClient
from loomfs.mount.dirs import DirStream, Pages
from loomfs.mount.edge import Handle, fuse_errors, join
from loomfs.mount.inodes import ROOT_INODE, InodeTable
from loomfs.mount.names import AbsentNames
from loomfs.mount.options import MountOptions
from loomfs.wire.types import Attr, FileType

T = TypeVar("T")
DOT_ENTRIES = 2  # "." and "..", listed first


def _dot_entry(inode: int) -> pyfuse3.EntryAttributes:
    """A READDIR entry for "." or "..": the kernel takes its inode number and type only."""
    e = pyfuse3.EntryAttributes()
    e.st_ino = inode
    e.st_mode = stat.S_IFDIR | 0o755
    return e


class DirOps:
    client: AsyncClient
    options: MountOptions
    inodes: InodeTable
    handles: dict[int, Handle | DirStream]
    absent: AbsentNames

    if TYPE_CHECKING:  # LoomOperations's
        async def call(self, coro: Coroutine[Any, Any, T]) -> T: ...
        async def _attr(self, path: str) -> Attr: ...
        def _new_handle(self, h: Handle | DirStream) -> int: ...
        def entry(self, attr: Attr) -> pyfuse3.EntryAttributes: ...

    @fuse_errors
    async def opendir(self, inode: int, ctx: Any) -> int:
        path = self.inodes.path(inode)

        def pages_after(after: str) -> Pages:
            """By the stream's path then (renamed here since: its new one), from this directory
            only: each page asks meta for this inode, so a path that leads to another directory
            by now (renamed away or removed elsewhere, another made under its name, which this
            mount may not know yet) is ENOENT, as Linux answers getdents of a directory removed
            while open, never the other directory's entries (sessions 15-16)."""
            return self.client.readdir_pages(stream.path, with_attrs=True, page_size=self.options.readdir_page,
                                             after=after, dir_inode=inode)
        stream = DirStream(path, pages_after, self.call, inode=inode)
        return self._new_handle(stream)

    @fuse_errors
    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        """Entries from offset ``start_id``: "." at offset 1, ".." at 2 (POSIX lists them where
        they exist, and ``ls -a`` shows them; the kernel links neither from a READDIRPLUS, so
        they count no lookup), then the directory's entry i at offset i + 3, a page at a time."""
        h = self.handles[fh]
        assert isinstance(h, DirStream)
        if start_id == 0:  # a listing from the start: if read to the end in order, its names are all
            if h.listing is not None:
                self.absent.abandon(h.inode, h.listing[1])
            h.listing = (time.monotonic(), self.absent.begin_listing(h.inode))
        for name, inode, off in ((b".", h.inode, 1), (b"..", self._parent_inode(h), 2)):
            if start_id < off and not pyfuse3.readdir_reply(token, name, _dot_entry(inode), off):
                return
        i = max(0, start_id - DOT_ENTRIES)
        if self.inodes.has_name(h.inode):  # renamed since the opendir: listed by its name now
            h.path = self.inodes.path(h.inode)
        base, page = await h.page_at(i, rewind=start_id == 0)
        h.replied_from = i  # the kernel's next READDIR of this stream resumes at or after it
        first = i
        while page:
            for e in page[i - base:]:
                path = join(h.path, os.fsencode(e.name))
                attr = e.attr if e.attr is not None else await self._attr(path)
                if not pyfuse3.readdir_reply(token, os.fsencode(e.name), self.entry(attr), i + 1 + DOT_ENTRIES):
                    return
                # the directory's name now (a rename of it or of a parent while this READDIR
                # ran): the stream's own may be another directory's by now (session 15 review)
                named = self.inodes.has_name(h.inode)
                if named:
                    path = join(self.inodes.path(h.inode), os.fsencode(e.name))
                    # first among its names (a directory renamed elsewhere moves its subtree here)
                    self.inodes.found(attr.inode, path, directory=attr.type == FileType.DIRECTORY)
                else:  # no name here: counted, not put first (a path that may lead elsewhere)
                    self.inodes.remember(attr.inode, path)
                i += 1
            try:
                base, page = await h.page_at(i)
            except OSError:
                if i == first:
                    raise
                # the entries given so far go (an error reply would drop them, and the lookups
                # counted for them would never be forgotten); the next READDIR meets it again
                return
        if h.names is not None and h.complete and h.listing is not None:  # read to the end, in order
            self.absent.listed(h.inode, h.names, *h.listing)
            h.names = h.listing = None

    def _parent_inode(self, h: DirStream) -> int:
        """The inode of the listed directory's parent as known here (the root's is itself);
        the directory's own when the parent is not known (only ``ls -ai`` shows it)."""
        if h.inode == ROOT_INODE:
            return ROOT_INODE
        path = self.inodes.path(h.inode) if self.inodes.has_name(h.inode) else h.path  # renamed since opendir
        parent = self.inodes.inode_of(path.rsplit("/", 1)[0] or "/")
        return parent if parent is not None else h.inode

    async def releasedir(self, fh: int) -> None:
        h = self.handles.pop(fh, None)
        if isinstance(h, DirStream):
            if h.listing is not None:
                self.absent.abandon(h.inode, h.listing[1])
            await h.close()

    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        return None  # meta commits every change before it answers
