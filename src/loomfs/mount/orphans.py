"""Open files whose last name went: kept alive under a hidden name until their last close.

Meta drops an inode when its last name goes, even while a client has it open. So that
``fchmod``, ``ftruncate``, ``futimens`` and ``fstat`` of such a file keep working through the
mount (as on a local file system), the mount does what NFS clients do ("silly rename"): an
``unlink`` of the last name of a regular file open here, or a ``rename`` over one, first moves
the file to ``/.loomfs-orphans/HOST-PID-INODE-SEQ``; the mount hides that directory, reports
``st_nlink`` one lower for such inodes (0 once no user-visible name is left), and unlinks the
hidden name at the file's last close here (or at unmount). A mount that dies leaves its
orphans behind: the next mount on the same host removes those of processes that are gone.

Limits: other clients (and native listings of the root) see ``/.loomfs-orphans``; a rename
over an open file is two meta calls (the target's name is briefly absent for other clients);
when the move is refused (another meta rule, root squash) the unlink is done plainly and the
file behaves as before (ENOENT for changes by descriptor).

``Orphans`` is the bookkeeping (no I/O); ``OrphanOps`` the mount's calls, mixed into
``LoomOperations``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from loomfs.client.core import AsyncClient
from loomfs.mount.dirs import DirStream
from loomfs.mount.edge import Handle
from loomfs.mount.inodes import InodeTable
from loomfs.wire.types import FileType

logger = logging.getLogger(__name__)
T = TypeVar("T")

ORPHANS_DIR_NAME = ".loomfs-orphans"
ORPHANS_DIR = "/" + ORPHANS_DIR_NAME


def _host() -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in socket.gethostname())[:64] or "host"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Orphans:
    """inode -> its hidden path, for the files this mount keeps past their last name."""

    def __init__(self, host: str | None = None, pid: int | None = None):
        self.host = host or _host()
        self.pid = os.getpid() if pid is None else pid
        self._seq = itertools.count(1)
        self._paths: dict[int, str] = {}
        self.swept = False  # stale orphans of dead mounts on this host were removed
        self.kept_total = 0

    def __repr__(self) -> str:
        return f"Orphans(open={len(self._paths)} kept_total={self.kept_total})"

    def __contains__(self, inode: object) -> bool:
        return inode in self._paths

    def new_path(self, inode: int) -> str:
        return f"{ORPHANS_DIR}/{self.host}-{self.pid}-{inode}-{next(self._seq)}"

    def kept(self, inode: int, path: str) -> None:
        self._paths[inode] = path
        self.kept_total += 1

    def path(self, inode: int) -> str | None:
        return self._paths.get(inode)

    def release(self, inode: int) -> str | None:
        """The inode's last descriptor here closed: its hidden path, to unlink."""
        return self._paths.pop(inode, None)

    def inodes(self) -> list[int]:
        return list(self._paths)

    def stale(self, names: list[str]) -> list[str]:
        """Names in the orphans directory left by dead mounts of this host."""
        out = []
        for n in names:
            parts = n.rsplit("-", 3)  # HOST-PID-INODE-SEQ (the host may hold dashes)
            if len(parts) != 4 or parts[0] != self.host or not parts[1].isdigit():
                continue
            pid = int(parts[1])
            if pid != self.pid and not pid_alive(pid):
                out.append(n)
        return out


def hidden(parent: str, name: bytes) -> bool:
    """Whether ``name`` in ``parent`` is the orphans directory (hidden by the mount)."""
    return parent == "/" and name == ORPHANS_DIR_NAME.encode()


class OrphanOps:
    client: AsyncClient
    inodes: InodeTable
    handles: dict[int, Handle | DirStream]
    orphans: Orphans

    if TYPE_CHECKING:  # LoomOperations's
        async def call(self, coro: Coroutine[Any, Any, T]) -> T: ...

    def _inode_path(self, inode: int) -> str:
        """A path of ``inode`` for calls on an open file: its hidden name once its last name went."""
        return self.orphans.path(inode) or self.inodes.path(inode)

    async def _keep_orphan(self, path: str) -> bool:
        """Before ``path``'s name goes (unlink, a rename over it): when it is the last name of
        a regular file open here, move the file to a hidden name instead and forget ``path``;
        True then (the caller does not unlink). Also keeps the attributes of any open file
        it names, for ``getattr`` after the name is gone."""
        inode = self.inodes.inode_of(path)
        if inode is None or not self.inodes.is_open(inode):
            return False
        try:
            attr = await self.call(self.client.lstat(path))
        except FileNotFoundError:
            return False
        self.inodes.seen(attr)
        if attr.inode != inode or attr.type != FileType.FILE or attr.nlink != 1:
            return False
        hidden_path = self.orphans.new_path(inode)
        try:
            await self._orphans_dir()
            await self.call(self.client.rename(path, hidden_path, no_replace=True))
        except OSError as exc:  # refused (permissions, root squash...): a plain unlink then
            logger.info("keeping open file %s past its unlink failed (%s): unlinked plainly", path, exc)
            return False
        self.orphans.kept(inode, hidden_path)
        for h in self.handles.values():
            if isinstance(h, Handle) and h.inode == inode:
                h.file.path = hidden_path
        self.inodes.unlinked(path)
        self.inodes.seen(attr)  # meta's attributes: the hidden name counts in nlink (entry() takes it off)
        return True

    async def _rename_over(self, src: str, dst: str) -> None:
        """``rename(src, dst)``; a regular file open here that ``dst`` names last is kept under a
        hidden name first. Only when the rename can replace it (``src`` exists and is no
        directory, another inode): otherwise meta answers the error with ``dst`` untouched. If
        the rename still fails, ``dst`` is put back."""
        inode = self.inodes.inode_of(dst)
        if inode is None or not self.inodes.is_open(inode) or inode == self.inodes.inode_of(src):
            await self.call(self.client.rename(src, dst))
            return
        try:
            moved = await self.call(self.client.lstat(src))
        except OSError:
            moved = None
        if moved is None or moved.type == FileType.DIRECTORY or moved.inode == inode:
            await self.call(self.client.rename(src, dst))
            return
        kept = await self._keep_orphan(dst)
        try:
            await self.call(self.client.rename(src, dst))
        except BaseException:
            if kept:
                await self._put_back(inode, dst)
            raise

    async def _put_back(self, inode: int, path: str) -> None:
        hidden_path = self.orphans.release(inode)
        if hidden_path is None:
            return
        try:
            await self.call(self.client.rename(hidden_path, path, no_replace=True))
        except OSError as exc:
            self.orphans.kept(inode, hidden_path)  # still kept: removed at its last close
            logger.error("putting %s back from %s after a failed rename: %s", path, hidden_path, exc)
            return
        self.inodes.remember(inode, path, count=0)
        for h in self.handles.values():
            if isinstance(h, Handle) and h.inode == inode:
                h.file.path = path

    async def _orphans_dir(self) -> None:
        """The hidden directory exists; the first time, orphans of dead mounts of this host go."""
        if self.orphans.swept:
            return
        await self.call(self.client.mkdir(ORPHANS_DIR, 0o700, exist_ok=True))
        for name in self.orphans.stale(await self.call(self.client.listdir(ORPHANS_DIR))):
            with contextlib.suppress(OSError):
                await self.call(self.client.unlink(f"{ORPHANS_DIR}/{name}"))
                logger.info("removed %s/%s, left by a mount that died", ORPHANS_DIR, name)
        self.orphans.swept = True

    async def _last_close(self, inode: int) -> None:
        """A file's last descriptor here closed: an orphan's hidden name goes now."""
        if self.inodes.is_open(inode):
            return
        path = self.orphans.release(inode)
        if path is not None:
            try:
                await self.call(self.client.unlink(path))
            except OSError as exc:
                logger.warning("removing orphan %s: %s", path, exc)

    async def _drop_orphans(self) -> None:
        """At unmount (every file closed): every orphan's hidden name goes."""
        for inode in self.orphans.inodes():
            path = self.orphans.release(inode)
            if path is not None:
                with contextlib.suppress(OSError):
                    await self.call(self.client.unlink(path))
