"""Read holds for a checkpoint load: the files a load reads stay readable while it reads them.

``client.open(path, "rb")`` takes no hold at meta, so a file unlinked (``prune``) or renamed
over (``prune(archive_ec=...)`` converts each file and renames the copy over it) during a load
is dropped by meta and its chunks are collected: a ``pread`` then answers zeros, with no
error. A read hold (what the mount takes, ``loomfs.mount.holds``: a read-only OPEN naming a
hold id) makes meta keep such a file as a nameless orphan until the hold ends, so the load
reads the bytes of the file it opened, whatever happens to its name.

``ReadHolds`` holds every file of a load from before its first batch to its end
(``open_all``, ``META_CALLS_INFLIGHT`` OPENs at a time; ``close`` closes the files and ends the
holds as concurrently, also when a file's close failed): a checkpoint pruned between batches
fails nothing. On an ``AsyncClient`` the file is made from the hold's own OPEN reply (one OPEN
per file; it is the inode held); another client opens after the hold and the opened inode is
checked (else the name moved meanwhile: both again). Holds are renewed every third of meta's
lease; after each batch ``confirm`` raises ``HoldLapsed`` when meta dropped one, or when none
of its answers covers the reads' end (the last full renewal older than the lease and one now
fails): the file may be gone and the bytes read zeros. A renewal error within the lease fails
nothing. A file whose whole content came with the open (inline) needs no hold.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterable
from typing import Any

from loomfs.client import paths

logger = logging.getLogger(__name__)

OPEN_ATTEMPTS = 3  # a name renamed over between the hold and the open: take both again
DEFAULT_LEASE_S = 60.0  # meta's session lease when its OPEN reply does not say
META_CALLS_INFLIGHT = 16  # hold OPENs (and CLOSEs ending them) in flight at once


def new_hold_id() -> int:
    """Unguessable, in the range clients pick session ids from (meta's own are below it)."""
    return (1 << 62) | secrets.randbits(62)


class HoldLapsed(OSError):
    """A read hold ended before the reads did: the bytes read may be zeros."""


def _file_from_reply(client: Any, path: str, rsp: Any) -> Any | None:
    """The read-only file the hold's OPEN reply describes, made as ``AsyncClient.open`` makes
    one from its own OPEN (attributes, read grant, inline bytes: the hold's reply carries them
    all), so the load pays one OPEN per file, not two. None for another client (the caller
    then opens through it)."""
    from loomfs.client.core import AsyncClient

    if not isinstance(client, AsyncClient):
        return None
    return client.file_from_open(path, rsp)


class ReadHolds:
    """The read holds (and the files) of one load on ``client`` (an ``AsyncClient``): taken
    for every file before the first read, kept until ``close`` at the load's end."""

    def __init__(self, client: Any, *, clock: Callable[[], float] = time.monotonic,
                 inflight: int = META_CALLS_INFLIGHT) -> None:
        self.client = client
        self.clock = clock
        self.inflight = inflight
        self.held: dict[int, tuple[int, str]] = {}  # hold id -> (inode, path)
        self.files: dict[str, Any] = {}  # path -> its open file
        self.lease_s = DEFAULT_LEASE_S
        self.lost: list[str] = []  # paths whose hold meta no longer had at a renewal
        # when the last OPEN or renewal that meta answered for every hold was sent: every hold
        # is good until this plus the lease (meta renewed it after the send)
        self.confirmed_at: float | None = None
        self._task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"ReadHolds(files={len(self.files)} held={len(self.held)} lost={len(self.lost)})"

    async def open_all(self, paths: Iterable[str]) -> dict[str, Any]:
        """Every path opened under a hold, ``inflight`` OPENs at a time (``files``). On a
        failure the caller still calls ``close`` (what was opened is in ``files``)."""
        sem = asyncio.Semaphore(max(1, self.inflight))

        async def one(path: str) -> None:
            async with sem:
                self.files[path] = await self.open(path)

        todo = [p for p in dict.fromkeys(paths) if p not in self.files]
        outcomes = await asyncio.gather(*(one(p) for p in todo), return_exceptions=True)
        for out in outcomes:
            if isinstance(out, BaseException):
                raise out
        return self.files

    async def open(self, path: str) -> Any:
        """``path`` opened read-only, held at meta (unless inline). FileNotFoundError when the
        name is gone (the checkpoint was deleted before the load reached this file)."""
        meta = self.client.meta
        path = paths.normalize(path)  # as the client's own open does (meta takes normal paths only)
        for _ in range(OPEN_ATTEMPTS):
            hold_id = new_hold_id()
            sent = self.clock()
            rsp = await meta.open(path, os.O_RDONLY, 0, self.client.client_id, hold_id)
            inode = rsp.attr.inode if rsp.attr is not None else 0
            held = getattr(rsp, "data", None) is None  # meta takes no hold on an inline file: its bytes came along
            if rsp.session_lease_s:
                self.lease_s = min(self.lease_s, rsp.session_lease_s)
            try:
                f = _file_from_reply(self.client, path, rsp)
            except BaseException:
                await self._end(inode if held else 0, hold_id)
                raise
            if f is not None:  # the hold's own reply: the file is what the hold holds
                if held:
                    self._add(hold_id, inode, path, sent)
                return f
            try:
                f = await self.client.open(path, "rb")
            except BaseException:
                await self._end(inode, hold_id)
                raise
            if getattr(f, "inline", False):  # its whole content is in memory: nothing to hold
                await self._end(inode, hold_id)
                return f
            if f.inode == inode:
                self._add(hold_id, inode, path, sent)
                return f
            # the name went to another file between the hold and the open: again
            await f.close()
            await self._end(inode, hold_id)
        raise OSError(errno.ESTALE, "the file's name kept moving during the open", path)

    def _add(self, hold_id: int, inode: int, path: str, sent: float) -> None:
        self.held[hold_id] = (inode, path)
        self.confirmed_at = sent if self.confirmed_at is None else min(self.confirmed_at, sent)
        self._keep_renewing()

    def check(self) -> None:
        """Raise when a hold lapsed while the reads ran (their bytes may be zeros)."""
        if self.lost:
            raise HoldLapsed(errno.EIO, f"read holds lapsed during the load (meta unreachable past its "
                             f"{self.lease_s:.0f} s lease): the files may be gone", self.lost[0])

    async def confirm(self) -> None:
        """After reads that ended now: raise unless every hold is known to have lasted until
        now. Known without a meta call while the last full confirmation is younger than the
        lease; else a renewal now (meta still has every hold: it had them throughout). A
        renewal that fails then raises ``HoldLapsed`` (the lease ran out unconfirmed); a
        renewal error while the lease still covers the reads fails nothing."""
        self.check()
        if not self.held or self.confirmed_at is None or self.clock() - self.confirmed_at < self.lease_s:
            return
        try:
            await self.renew()
        except OSError as exc:
            raise HoldLapsed(errno.EIO, f"read holds unconfirmed for the {self.lease_s:.0f} s lease "
                             f"(renewal failed: {exc}): the files may be gone", next(iter(self.held.values()))[1]
                             ) from exc
        self.check()

    async def renew(self) -> None:
        """One renewal of every hold; holds meta no longer has are recorded in ``lost``."""
        ids = list(self.held)
        if not ids:
            return
        meta, client_id = self.client.meta, self.client.client_id
        sent = self.clock()
        if await meta.renew_sessions(client_id, ids) != len(ids):
            for hold_id in ids:  # which ones: one at a time (rare)
                if hold_id in self.held and not await meta.renew_sessions(client_id, [hold_id]):
                    self.lost.append(self.held.pop(hold_id)[1])
        self.confirmed_at = sent  # the rest: renewed after the send

    async def close(self) -> None:
        """Close every file, then end every hold (``inflight`` at a time) and the renewals,
        whatever the closes raised (the first such error is raised after)."""
        files, self.files = list(self.files.values()), {}
        try:
            outcomes = await asyncio.gather(*(f.close() for f in files), return_exceptions=True)
            for out in outcomes:
                if isinstance(out, BaseException):
                    raise out
        finally:
            task, self._task = self._task, None
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
            held, self.held = self.held, {}
            sem = asyncio.Semaphore(max(1, self.inflight))

            async def end(inode: int, hold_id: int) -> None:
                async with sem:
                    await self._end(inode, hold_id)

            await asyncio.gather(*(end(inode, hold_id) for hold_id, (inode, _p) in held.items()))

    def _keep_renewing(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._renew_loop(), name="loomfs-ckpt-holds")

    async def _renew_loop(self) -> None:
        while self.held:
            await asyncio.sleep(self.lease_s / 3)
            try:
                await self.renew()
            except OSError as exc:  # meta unreachable: next period (``confirm`` knows how long)
                logger.warning("renewing %d checkpoint read holds: %s", len(self.held), exc)

    async def _end(self, inode: int, hold_id: int) -> None:
        if not inode:
            return
        try:
            await self.client.meta.close(inode, hold_id, -1)
        except OSError as exc:  # it ends with its lease
            logger.warning("ending read hold %#x on inode %d: %s", hold_id, inode, exc)
