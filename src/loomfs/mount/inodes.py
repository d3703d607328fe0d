"""inode -> path table for the kernel's inode-based requests (no I/O).

LoomFS hands out real inode numbers (``Attr.inode``; the root is 1 = FUSE_ROOT_ID) but its
meta API takes paths. Every inode the kernel knows about (each ``lookup``, ``create``,
``mkdir``, ``readdirplus`` entry... counted) maps to the names it is reachable by here; a
``forget`` that brings the count to zero drops it. Renames and unlinks update the names.

An open file may lose its last name (unlink, or a rename over it) and still be read, written
and ``fstat``-ed; the table keeps the last attributes seen of every open inode, with ``nlink``
counted down as names go, for ``getattr`` to answer from when no name is left.
"""

from __future__ import annotations

import dataclasses
import errno

from loomfs.wire.types import Attr

ROOT_INODE = 1


class InodeTable:
    def __init__(self) -> None:
        self._names: dict[int, list[str]] = {ROOT_INODE: ["/"]}
        self._lookups: dict[int, int] = {ROOT_INODE: 1}
        self._by_path: dict[str, int] = {"/": ROOT_INODE}
        self._opens: dict[int, int] = {}  # inode -> open handles
        self._open_attrs: dict[int, Attr] = {}  # open inode -> its last attributes seen

    def __repr__(self) -> str:
        return f"InodeTable(inodes={len(self._names)}, paths={len(self._by_path)}, open={len(self._opens)})"

    def __len__(self) -> int:
        return len(self._names)

    def path(self, inode: int) -> str:
        """A path the inode is reachable by (ENOENT when forgotten or unlinked)."""
        names = self._names.get(inode)
        if not names:
            raise OSError(errno.ENOENT, "inode no longer has a name", str(inode))
        return names[0]

    def has_name(self, inode: int) -> bool:
        return bool(self._names.get(inode))

    def inode_of(self, path: str) -> int | None:
        return self._by_path.get(path)

    def lookups(self, inode: int) -> int:
        return self._lookups.get(inode, 0)

    def remember(self, inode: int, path: str, count: int = 1) -> None:
        """The kernel learned ``inode`` under ``path`` (``count`` lookups)."""
        old = self._by_path.get(path)
        if old is not None and old != inode:
            self._drop_name(old, path)
        names = self._names.setdefault(inode, [])
        if path not in names:
            names.append(path)
        self._by_path[path] = inode
        self._lookups[inode] = self._lookups.get(inode, 0) + count

    def found(self, inode: int, path: str, *, directory: bool = False) -> None:
        """Meta just named ``inode`` by ``path`` (a LOOKUP): one more lookup, and ``path`` goes
        first among its names, the one calls ask meta by (another client may have renamed or
        unlinked the others). A directory has one name: its old one here moves to ``path``
        with everything known under it (the directory was renamed elsewhere)."""
        if directory:
            for old in [n for n in self._names.get(inode, []) if n != path]:
                if path.startswith(old.rstrip("/") + "/"):
                    self._drop_name(inode, old)  # moved under its old name: that path is another's now
                else:
                    self.renamed(old, path)
        self.remember(inode, path)
        names = self._names[inode]
        names.remove(path)
        names.insert(0, path)

    def missing(self, path: str) -> None:
        """Meta found nothing at ``path``: whatever the table knew by it lost that name (another
        client renamed or unlinked it; the inode may live on under other names)."""
        inode = self._by_path.get(path)
        if inode is not None and inode != ROOT_INODE:
            self._drop_name(inode, path)

    def drop_stale(self, inode: int, path: str) -> bool:
        """``path`` no longer leads to ``inode`` at meta: drop it when the inode has another
        name here to try (True), else keep it (False: the caller answers as for no name)."""
        names = self._names.get(inode, [])
        if path not in names or len(names) < 2:
            return False
        self._drop_name(inode, path)
        return True

    def forget(self, inode: int, count: int) -> None:
        if inode == ROOT_INODE:
            return
        left = self._lookups.get(inode, 0) - count
        if left > 0:
            self._lookups[inode] = left
            return
        self._lookups.pop(inode, None)
        for name in self._names.pop(inode, []):
            if self._by_path.get(name) == inode:
                del self._by_path[name]

    def unlinked(self, path: str) -> None:
        """``path`` no longer names anything (the inode may live on under other names, or
        open)."""
        inode = self._by_path.get(path)
        if inode is not None:
            self._drop_name(inode, path)
            kept = self._open_attrs.get(inode)
            if kept is not None:
                self._open_attrs[inode] = dataclasses.replace(kept, nlink=max(0, kept.nlink - 1))

    # --- open inodes ----------------------------------------------------------------------

    def opened(self, inode: int) -> None:
        self._opens[inode] = self._opens.get(inode, 0) + 1

    def closed(self, inode: int) -> None:
        left = self._opens.get(inode, 0) - 1
        if left > 0:
            self._opens[inode] = left
        else:
            self._opens.pop(inode, None)
            self._open_attrs.pop(inode, None)

    def is_open(self, inode: int) -> bool:
        return inode in self._opens

    def seen(self, attr: Attr) -> None:
        """Fresh attributes from meta: kept while the inode is open."""
        if attr.inode in self._opens:
            self._open_attrs[attr.inode] = attr

    def kept(self, inode: int) -> Attr | None:
        """The last attributes seen of an open inode (None when not open or never seen)."""
        return self._open_attrs.get(inode)

    def renamed(self, src: str, dst: str, *, exchange: bool = False) -> None:
        """``src`` (and everything under it) is now ``dst``; what ``dst`` named is gone
        (or, with ``exchange``, is now ``src``)."""
        if exchange:
            tmp = "\0exchange"
            self._move(src, tmp)
            self._move(dst, src)
            self._move(tmp, dst)
            return
        self.unlinked(dst)
        # what the table still knew under ``dst`` is stale (a directory renamed over is empty;
        # one met by a LOOKUP under a new name replaced whatever was there elsewhere): those
        # names would lead to what moves there now
        under, moving = dst.rstrip("/") + "/", src.rstrip("/") + "/"
        for p in [p for p in self._by_path if p.startswith(under) and p != src and not p.startswith(moving)]:
            self._drop_name(self._by_path[p], p)
        self._move(src, dst)

    def _move(self, src: str, dst: str) -> None:
        prefix = src.rstrip("/") + "/"
        moved = [(p, i) for p, i in self._by_path.items() if p == src or p.startswith(prefix)]
        for p, inode in moved:
            new = dst + p[len(src):]
            del self._by_path[p]
            names = self._names.get(inode, [])
            names[:] = [new if n == p else n for n in names]
            self._by_path[new] = inode

    def _drop_name(self, inode: int, path: str) -> None:
        if self._by_path.get(path) == inode:
            del self._by_path[path]
        names = self._names.get(inode)
        if names and path in names:
            names.remove(path)
