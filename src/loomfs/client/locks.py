"""Locks across clients on the async core: ``flock``-style whole-file locks and POSIX byte-range
locks, held at meta (``loomfs.meta.locks``), seen by every client and mount of the cluster.

``LockClient`` (one per ``AsyncClient``: ``locks_of(client)``) makes the calls. A lock is
(inode, kind, owner): ``owner`` is any 64-bit number the caller picks (a mount passes the
kernel's ``lock_owner``; the functions below default to one per ``LockClient``), and two
owners of one client conflict like two processes. Meta never waits: a blocking ``set`` polls
with backoff (``WAIT_BACKOFF``: 2 ms doubling to 100 ms, as JuiceFS polls) until granted,
``interrupted()`` says stop (EINTR) or ``wait_max_s`` passed (EAGAIN). While the client holds
locks it renews its lease at meta every third of ``lease_s``; a lease that ran out (the client
was cut off or paused that long) loses every lock at once: the renewal says so, the locks are
forgotten here and ``lost_total`` counts them (logged as an error). A process that dies with
its client loses its locks one lease later; ``close`` ends them at once.

For scripts: ``await lock(client, path, WRITE)`` / ``unlock`` by path, and the blocking API
through ``fs.run(lock(fs.client, ...))``.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import random
import secrets
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from loomfs.common.retry import Backoff
from loomfs.errors import LoomError
from loomfs.wire import meta_lock as wl
from loomfs.wire.status import Status

if TYPE_CHECKING:
    from loomfs.client.core import AsyncClient
    from loomfs.client.meta_client import MetaClient

logger = logging.getLogger(__name__)

FLOCK = 1
POSIX = 2
UNLOCK = 0
READ = 1  # shared
WRITE = 2  # exclusive
OFFSET_MAX = wl.OFFSET_MAX
DEFAULT_LEASE_S = 30.0
WAIT_BACKOFF = Backoff(0.002, 0.1)


class LockClient:
    """This client's locks at meta: set/get/release, blocking waits, the lease."""

    def __init__(self, meta: MetaClient, client_id: int, *, lease_s: float = DEFAULT_LEASE_S,
                 rng: random.Random | None = None):
        self.meta = meta
        self.client_id = client_id
        self.lease_s = lease_s
        self.default_owner = secrets.randbits(63) | 1
        self._held: set[tuple[int, int, int]] = set()  # (inode, kind, owner) that may hold locks at meta
        self._renew_task: asyncio.Task[None] | None = None
        self._rng = rng or random.Random()
        self.used = False  # took a lock at some point (close tells meta)
        self.waits_total = 0  # polls of blocking waits
        self.lost_total = 0  # owners whose locks a lapsed lease took away
        # (inode, kind, owner) -> the undo of a grant a cancelled caller never saw (_attempt)
        self._undoing: dict[tuple[int, int, int], asyncio.Task[None]] = {}

    def __repr__(self) -> str:
        return (f"LockClient(client={self.client_id:#x} held={len(self._held)} lease_s={self.lease_s} "
                f"lost_total={self.lost_total})")

    def holds(self, inode: int, kind: int, owner: int) -> bool:
        """Whether (inode, kind, owner) may hold locks (a close asks meta only then)."""
        return (inode, kind, owner) in self._held

    def _req(self, inode: int, kind: int, type_: int, first: int, last: int, owner: int, pid: int) -> wl.LockReq:
        return wl.LockReq(inode=inode, kind=kind, client_id=self.client_id, owner=owner, type=type_, first=first,
                          last=last, pid=pid, lease_s=self.lease_s)

    async def try_set(self, inode: int, kind: int, type_: int, first: int = 0, last: int = OFFSET_MAX, *,
                      owner: int, pid: int = 0) -> wl.LockInfo | None:
        """One attempt: None when granted (or unlocked), else the lock in the way."""
        key = (inode, kind, owner)
        before = set(self._held)
        before.discard(key)
        if type_ != UNLOCK:
            self._held.add(key)  # before the call: a lost reply may have granted it
            self.used = True
            self._keep_renewing()
        rsp: wl.LockRsp = await self.meta.call(wl.LOCK_SET, self._req(inode, kind, type_, first, last, owner, pid))
        if rsp.lease_new and before:
            self._lost(before & self._held)
        return None if rsp.granted else (rsp.conflict or wl.LockInfo())

    def _lost(self, lost: set[tuple[int, int, int]]) -> None:
        """Meta said our lease had run out: the locks of these owners are gone."""
        if not lost:
            return
        self._held -= lost
        self.lost_total += len(lost)
        logger.error("the lock lease of client %#x ran out (cut off from meta for %.0fs?): "
                     "%d lock owner(s) lost their locks", self.client_id, self.lease_s, len(lost))

    async def set(self, inode: int, kind: int, type_: int, first: int = 0, last: int = OFFSET_MAX, *,
                  owner: int, pid: int = 0, wait: bool = False, interrupted: Callable[[], bool] | None = None,
                  wait_max_s: float | None = None) -> None:
        """Take or drop a lock. Not granted: ``BlockingIOError`` (EAGAIN) at once (``wait``
        False), else poll until granted, ``InterruptedError`` (EINTR) once ``interrupted()`` is
        true, ``BlockingIOError`` after ``wait_max_s``."""
        loop = asyncio.get_running_loop()
        deadline = None if wait_max_s is None else loop.time() + wait_max_s
        attempt = 0
        while True:
            hit = await self._attempt(inode, kind, type_, first, last, owner, pid)
            if hit is None:
                return
            if not wait or (deadline is not None and loop.time() >= deadline):
                raise BlockingIOError(errno.EAGAIN, f"inode {inode}: locked by client {hit.client_id:#x} "
                                      f"(pid {hit.pid}) over {hit.first}..{hit.last}")
            if interrupted is not None and interrupted():
                raise InterruptedError(errno.EINTR, f"inode {inode}: lock wait interrupted")
            delay_s = WAIT_BACKOFF.delay_s(attempt, self._rng)
            if deadline is not None:
                delay_s = max(0.0, min(delay_s, deadline - loop.time()))
            await asyncio.sleep(delay_s)
            attempt += 1
            self.waits_total += 1
            if interrupted is not None and interrupted():
                raise InterruptedError(errno.EINTR, f"inode {inode}: lock wait interrupted")

    async def _attempt(self, inode: int, kind: int, type_: int, first: int, last: int, owner: int,
                       pid: int) -> wl.LockInfo | None:
        """``try_set``, and if the caller is cancelled while it is in flight (an interrupted
        blocking ``lock()``, a FUSE INTERRUPT), a grant it may still bring is undone: the call
        runs on, and once meta answered (granted, or no answer), an UNLOCK of the range
        follows, so the lock's fate is "not granted", as the caller was told. Only when this
        owner held nothing on the file before (else the unlock could drop a lock it held
        before the call). The owner's next call on the file waits for that undo first."""
        key = (inode, kind, owner)
        pending = self._undoing.get(key)
        if pending is not None:
            await asyncio.wait([pending])
        fresh = type_ != UNLOCK and key not in self._held
        task = asyncio.ensure_future(self.try_set(inode, kind, type_, first, last, owner=owner, pid=pid))
        if not fresh:
            return await task
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            undo = asyncio.get_running_loop().create_task(
                self._undo_late_grant(task, inode, kind, first, last, owner, pid), name="loomfs-lock-undo")
            self._undoing[key] = undo
            undo.add_done_callback(lambda t: self._undoing.pop(key) if self._undoing.get(key) is t else None)
            raise

    async def _undo_late_grant(self, task: asyncio.Future[wl.LockInfo | None], inode: int, kind: int,
                               first: int, last: int, owner: int, pid: int) -> None:
        await asyncio.wait([task])
        if not task.cancelled() and task.exception() is None and task.result() is not None:
            return  # refused: nothing was taken
        try:
            await self.try_set(inode, kind, UNLOCK, first, last, owner=owner, pid=pid)
        except (LoomError, OSError) as exc:
            logger.warning("undoing the lock of inode %d that a cancelled call may have taken: %s", inode, exc)

    async def get(self, inode: int, kind: int, type_: int, first: int = 0, last: int = OFFSET_MAX, *,
                  owner: int) -> wl.LockInfo | None:
        """F_GETLK: the lock that would stop this one, None if it would be granted."""
        rsp: wl.LockRsp = await self.meta.call(wl.LOCK_GET, self._req(inode, kind, type_, first, last, owner, 0))
        return rsp.conflict

    async def release(self, inode: int, kind: int, owner: int) -> int:
        """Every lock of ``owner`` of ``kind`` on ``inode`` goes (a close); no call when this
        owner never locked the file here."""
        if (inode, kind, owner) not in self._held:
            return 0
        rsp: wl.LockReleaseRsp = await self.meta.call(
            wl.LOCK_RELEASE, wl.LockReleaseReq(inode=inode, kind=kind, client_id=self.client_id, owner=owner))
        self._held.discard((inode, kind, owner))
        return rsp.released

    def _keep_renewing(self) -> None:
        task = self._renew_task
        if task is None or task.done():
            self._renew_task = asyncio.get_running_loop().create_task(self._renew_loop(), name="loomfs-locks-renew")

    async def _renew_loop(self) -> None:
        while self._held:
            await asyncio.sleep(self.lease_s / 3)
            if not self._held:
                return
            try:
                await self.renew()
            except (LoomError, OSError) as exc:  # meta unreachable: the next period tries again
                logger.warning("renewing the lease of %d lock owner(s): %s", len(self._held), exc)

    async def renew(self) -> bool:
        """One renewal; False (and every lock forgotten) when meta says the lease had run out."""
        held = list(self._held)
        rsp: wl.LockRenewRsp = await self.meta.call(
            wl.LOCK_RENEW, wl.LockRenewReq(client_id=self.client_id, lease_s=self.lease_s))
        if not rsp.held and held:
            self._lost(set(held) & self._held)  # released meanwhile: not lost
        return rsp.held

    async def close(self) -> None:
        """Every lock of this client goes now (unmount, client close)."""
        task, self._renew_task = self._renew_task, None
        if task is not None:
            task.cancel()
        if self.used:
            self._held.clear()
            await self.meta.call(wl.LOCK_RENEW, wl.LockRenewReq(client_id=self.client_id, drop=True))


_clients: weakref.WeakKeyDictionary[AsyncClient, LockClient] = weakref.WeakKeyDictionary()


def locks_of(client: AsyncClient) -> LockClient:
    """The ``LockClient`` of ``client`` (made at the first use)."""
    lc = _clients.get(client)
    if lc is None:
        lc = _clients[client] = LockClient(client.meta, client.client_id)
    return lc


async def lock(client: AsyncClient, path: str, type_: int = WRITE, *, kind: int = FLOCK, first: int = 0,
               last: int = OFFSET_MAX, owner: int | None = None, wait: bool = True,
               wait_max_s: float | None = None) -> None:
    """Lock the file at ``path`` (``type_`` READ/WRITE, or UNLOCK) for every client of the
    cluster to see; ``owner`` defaults to this client's own (one per client)."""
    lc = locks_of(client)
    attr = await client.stat(path)
    await lc.set(attr.inode, kind, type_, first, last, owner=lc.default_owner if owner is None else owner,
                 wait=wait, wait_max_s=wait_max_s)


async def unlock(client: AsyncClient, path: str, *, kind: int = FLOCK, first: int = 0, last: int = OFFSET_MAX,
                 owner: int | None = None) -> None:
    await lock(client, path, UNLOCK, kind=kind, first=first, last=last, owner=owner, wait=False)


async def close_client(client: AsyncClient) -> None:
    """``client`` ends: its locks go at meta now (nothing to do when it never locked)."""
    lc = _clients.pop(client, None)
    if lc is not None and lc.used:
        try:
            await lc.close()
        except (LoomError, OSError) as exc:  # they go with the lease
            logger.warning("dropping the locks of client %#x: %s", lc.client_id, exc)


async def meta_has_locks(client: AsyncClient) -> bool:
    """Whether the meta servers answer the lock calls (a meta older than them answers
    UNKNOWN_METHOD): a mount then keeps the kernel's local locks rather than fail every one."""
    try:
        await client.meta.call(wl.LOCK_RENEW, wl.LockRenewReq(client_id=client.client_id, lease_s=DEFAULT_LEASE_S))
    except LoomError as exc:
        if exc.status is Status.UNKNOWN_METHOD:
            return False
        logger.warning("asking meta whether it keeps locks: %s (assuming it does)", exc)
    return True
