"""Read holds: the mount's read-only opens of files in chunks are registered at meta, so that a
file unlinked (or renamed over) by anyone, on any node, while it is open here stays readable.

Meta keeps a file whose last name goes while a client holds it as a nameless *orphan*
(``loomfs.meta.orphans``): write opens hold it through their write session; a read-only open
asks for a read hold, a read-only OPEN naming a hold id (a second OPEN of the same path after
the client's, checked to name the same inode). An inline file needs none: its whole content
came with the open. Holds are leases: this module renews them every third of the lease, and a
hold ends at the handle's release (a CLOSE naming it), or with the lease if the mount dies, so
a dead mount keeps nothing for longer than a lease.

``Holds`` is the bookkeeping (no I/O); ``HoldOps`` the mount's calls, mixed into
``LoomOperations``.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import secrets
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from loomfs.client.core import AsyncClient
from loomfs.client.file import AsyncFile
from loomfs.errors import LoomError
from loomfs.meta.gc import SESSION_LEASE_S
from loomfs.mount.dirs import DirStream
from loomfs.mount.edge import Handle
from loomfs.mount.inodes import InodeTable
from loomfs.wire.types import FileType

logger = logging.getLogger(__name__)
T = TypeVar("T")


def new_hold_id() -> int:
    """Unguessable, in the range clients pick session ids from (meta's own are below it)."""
    return (1 << 62) | secrets.randbits(62)


class Holds:
    """hold id -> inode of this mount's read holds at meta, and when meta last renewed them."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._inodes: dict[int, int] = {}
        self.lease_s = SESSION_LEASE_S  # meta's (OPEN's reply says it when meta sends it)
        self.clock = clock
        self.renewed_at = clock()  # the last renewal meta answered (or the first hold)
        self.taken_total = 0
        self.lost_total = 0  # holds meta no longer had at a renewal (the mount could not reach it)

    def __repr__(self) -> str:
        return f"Holds(held={len(self._inodes)} taken_total={self.taken_total} lost_total={self.lost_total})"

    def __len__(self) -> int:
        return len(self._inodes)

    def add(self, hold_id: int, inode: int) -> None:
        if not self._inodes:
            self.renewed_at = self.clock()  # a new one is fresh; the lease counts from here
        self._inodes[hold_id] = inode
        self.taken_total += 1

    def overdue(self) -> bool:
        """No renewal answered for half a lease (the mount was paused or cut off): holds may
        have expired at meta, so reads must wait for the next renewal's verdict."""
        return bool(self._inodes) and self.clock() - self.renewed_at > self.lease_s / 2

    def __contains__(self, hold_id: object) -> bool:
        return hold_id in self._inodes

    def pop(self, hold_id: int) -> int | None:
        return self._inodes.pop(hold_id, None)

    def ids(self) -> list[int]:
        return sorted(self._inodes)

    def items(self) -> list[tuple[int, int]]:
        return sorted(self._inodes.items())


class HoldOps:
    client: AsyncClient
    holds: Holds
    handles: dict[int, Handle | DirStream]
    inodes: InodeTable
    _renew_task: asyncio.Task[None] | None
    _renewing: asyncio.Future[None] | None

    if TYPE_CHECKING:  # LoomOperations's
        async def call(self, coro: Coroutine[Any, Any, T]) -> T: ...

    async def _take_hold(self, path: str, f: AsyncFile) -> int:
        """A read-only open of ``path`` got ``f``: hold it at meta unless it is inline. Returns
        the hold id (0: inline, none needed). ESTALE when the name no longer leads to ``f``'s
        inode (unlinked, renamed over, since the open): meta may drop that file at any
        moment, so the open fails and the kernel looks the name up again (it retries an
        open that answers ESTALE once, revalidating the path)."""
        attr = f.opened_attr
        if f.inline or attr is None or attr.type != FileType.FILE:
            return 0
        hold_id = new_hold_id()
        meta = self.client.meta
        try:
            rsp = await self.call(meta.open(path, os.O_RDONLY, 0, self.client.client_id, hold_id))
        except FileNotFoundError as exc:  # ESTALE: the kernel looks the name up again
            raise OSError(errno.ESTALE, "the file's name went during the open", path) from exc
        if rsp.session_lease_s:
            self.holds.lease_s = min(self.holds.lease_s, rsp.session_lease_s)
        if rsp.attr is None or rsp.attr.inode != f.inode:  # the name went to another file meanwhile
            await self._end_hold(rsp.attr.inode if rsp.attr is not None else f.inode, hold_id)
            raise OSError(errno.ESTALE, "the file's name went to another file during the open", path)
        self.holds.add(hold_id, f.inode)
        self._keep_renewing()
        return hold_id

    async def _release_hold(self, hold_id: int) -> None:
        inode = self.holds.pop(hold_id)
        if inode is not None:
            await self._end_hold(inode, hold_id)

    async def _end_hold(self, inode: int, hold_id: int) -> None:
        try:
            await self.call(self.client.meta.close(inode, hold_id, -1))
        except (LoomError, OSError) as exc:  # it ends with its lease
            logger.warning("ending read hold %#x on inode %d: %s", hold_id, inode, exc)

    def _keep_renewing(self) -> None:
        task = self._renew_task
        if task is None or task.done():
            self._renew_task = asyncio.get_running_loop().create_task(self._renew_loop(), name="loomfs-mount-holds")

    async def _renew_loop(self) -> None:
        while len(self.holds):
            await asyncio.sleep(self.holds.lease_s / 3)
            if not len(self.holds):
                return
            try:
                await self._renew_holds()
            except (LoomError, OSError) as exc:  # meta down: next period
                logger.warning("renewing %d read holds: %s", len(self.holds), exc)

    async def _renew_holds(self) -> None:
        """One renewal of every hold (one at a time: a read that found them overdue waits for
        the one in flight). Holds meta no longer has (expired: the mount was paused or cut
        off past the lease) are taken again by their file's name when it still leads to the
        file; otherwise their handles answer EIO from then on (the file may be gone, its
        chunks collected: reading on would return zeros)."""
        if self._renewing is not None:
            await asyncio.shield(self._renewing)
            return
        self._renewing = asyncio.get_running_loop().create_future()
        try:
            ids = self.holds.ids()
            asked_at = self.holds.clock()
            held = await self.call(self.client.meta.renew_sessions(self.client.client_id, ids)) if ids else 0
            if held < len(ids):
                self.holds.lost_total += len(ids) - held
                logger.warning("meta held %d of our %d read holds (the others expired)", held, len(ids))
                await self._find_lost(ids)
            self.holds.renewed_at = asked_at
        finally:
            fut, self._renewing = self._renewing, None
            fut.set_result(None)

    async def _find_lost(self, ids: list[int]) -> None:
        meta = self.client.meta
        for hold_id in ids:
            if hold_id not in self.holds:
                continue  # released meanwhile
            still: int = await self.call(meta.renew_sessions(self.client.client_id, [hold_id]))
            if still:
                continue
            inode = self.holds.pop(hold_id)
            handles = [h for h in self.handles.values() if isinstance(h, Handle) and h.hold_id == hold_id]
            new_id, retaken = 0, False
            if inode is not None and handles and self.inodes.has_name(inode):
                try:
                    new_id, retaken = await self._take_hold(self.inodes.path(inode), handles[0].file), True
                except (LoomError, OSError) as exc:
                    logger.warning("read hold on inode %d lapsed and cannot be taken again: %s", inode, exc)
            for h in handles:
                h.hold_id = new_id
                h.lost = not retaken
            if not retaken:
                logger.error("read hold on inode %d lapsed: its %d descriptor(s) answer EIO", inode, len(handles))

    async def _check_holds(self, h: Handle) -> None:
        """Before a read of a held handle: holds overdue for renewal are renewed first; a
        handle whose hold lapsed answers EIO."""
        if h.hold_id and self.holds.overdue():
            await self._renew_holds()
        if h.lost:
            raise OSError(errno.EIO, "this descriptor's read hold lapsed (the mount lost meta past the lease): "
                          "the file may be gone", h.file.path)

    async def _drop_holds(self) -> None:
        """At unmount: every hold ends."""
        for hold_id, inode in self.holds.items():
            self.holds.pop(hold_id)
            await self._end_hold(inode, hold_id)
        task, self._renew_task = self._renew_task, None
        if task is not None:
            task.cancel()
