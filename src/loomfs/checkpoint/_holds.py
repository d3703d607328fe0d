"""Read holds for a checkpoint load: the files a load reads stay readable while it reads them.

``client.open(path, "rb")`` takes no hold at meta, so a file unlinked (``prune``) or renamed
over (``prune(archive_ec=...)`` converts each file and renames the copy over it) during a load
is dropped by meta and its chunks are collected: a ``pread`` then answers zeros, with no
error. A read hold (what the mount takes, ``loomfs.mount.holds``: a read-only OPEN naming a
hold id) makes meta keep such a file as a nameless orphan until the hold ends, so the load
reads the bytes of the file it opened, whatever happens to its name.

``ReadHolds`` takes a hold *before* opening (the hold's OPEN answers the inode it holds) and
checks the opened file is that inode (else the name moved meanwhile: the hold ends and both
are taken again), renews the holds every third of meta's lease while the reads run and ends
them at ``close``. A hold meta no longer has at a renewal (this client was cut off from meta
for longer than the lease) makes ``check`` raise: the file may be gone and the bytes read
zeros. A file whose whole content came with the open (inline) needs none.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import secrets
from typing import Any

logger = logging.getLogger(__name__)

OPEN_ATTEMPTS = 3  # a name renamed over between the hold and the open: take both again
DEFAULT_LEASE_S = 60.0  # meta's session lease when its OPEN reply does not say


def new_hold_id() -> int:
    """Unguessable, in the range clients pick session ids from (meta's own are below it)."""
    return (1 << 62) | secrets.randbits(62)


class HoldLapsed(OSError):
    """A read hold ended before the reads did: the bytes read may be zeros."""


class ReadHolds:
    """The read holds of one batch of reads on ``client`` (an ``AsyncClient``)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.held: dict[int, tuple[int, str]] = {}  # hold id -> (inode, path)
        self.lease_s = DEFAULT_LEASE_S
        self.lost: list[str] = []  # paths whose hold meta no longer had at a renewal
        self._task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"ReadHolds(held={len(self.held)} lost={len(self.lost)})"

    async def open(self, path: str) -> Any:
        """``path`` opened read-only, held at meta (unless inline). FileNotFoundError when the
        name is gone (the checkpoint was deleted before the load reached this file)."""
        meta = self.client.meta
        for _ in range(OPEN_ATTEMPTS):
            hold_id = new_hold_id()
            rsp = await meta.open(path, os.O_RDONLY, 0, self.client.client_id, hold_id)
            inode = rsp.attr.inode if rsp.attr is not None else 0
            if rsp.session_lease_s:
                self.lease_s = min(self.lease_s, rsp.session_lease_s)
            try:
                f = await self.client.open(path, "rb")
            except BaseException:
                await self._end(inode, hold_id)
                raise
            if getattr(f, "inline", False):  # its whole content is in memory: nothing to hold
                await self._end(inode, hold_id)
                return f
            if f.inode == inode:
                self.held[hold_id] = (inode, path)
                self._keep_renewing()
                return f
            # the name went to another file between the hold and the open: again
            await f.close()
            await self._end(inode, hold_id)
        raise OSError(errno.ESTALE, "the file's name kept moving during the open", path)

    def check(self) -> None:
        """Raise when a hold lapsed while the reads ran (their bytes may be zeros)."""
        if self.lost:
            raise HoldLapsed(errno.EIO, f"read holds lapsed during the load (meta unreachable past its "
                             f"{self.lease_s:.0f} s lease): the files may be gone", self.lost[0])

    async def renew(self) -> None:
        """One renewal of every hold; holds meta no longer has are recorded in ``lost``."""
        ids = list(self.held)
        if not ids:
            return
        meta, client_id = self.client.meta, self.client.client_id
        if await meta.renew_sessions(client_id, ids) == len(ids):
            return
        for hold_id in ids:  # which ones: one at a time (rare)
            if hold_id in self.held and not await meta.renew_sessions(client_id, [hold_id]):
                self.lost.append(self.held.pop(hold_id)[1])

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        held, self.held = self.held, {}
        for hold_id, (inode, _path) in held.items():
            await self._end(inode, hold_id)

    def _keep_renewing(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._renew_loop(), name="loomfs-ckpt-holds")

    async def _renew_loop(self) -> None:
        while self.held:
            await asyncio.sleep(self.lease_s / 3)
            try:
                await self.renew()
            except OSError as exc:  # meta unreachable: next period (a lapse shows at the next one)
                logger.warning("renewing %d checkpoint read holds: %s", len(self.held), exc)

    async def _end(self, inode: int, hold_id: int) -> None:
        if not inode:
            return
        try:
            await self.client.meta.close(inode, hold_id, -1)
        except OSError as exc:  # it ends with its lease
            logger.warning("ending read hold %#x on inode %d: %s", hold_id, inode, exc)
