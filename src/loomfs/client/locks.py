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
its client loses its locks one lease later; ``close`` ends them at once. A lock call whose
caller never hears "granted" (cancelled on the way, or no answer) changes nothing: once meta
answered, the range is unlocked again, less what the owner held meanwhile, which is set back
to the type the owner was told it holds (``_attempt``). An owner that holds nothing is
forgotten: no release at close, no renewals for it.

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

from loomfs.client.lock_owner import OwnerRecord
from loomfs.client.lock_ranges import (
    Range,
    TRange,
    ranges_add,
    ranges_sub,
    ranges_union,
    typed_less,
    undo_plan,
)
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


def _holder(hit: wl.LockInfo, client_id: int) -> str:
    """Who holds the lock in the way, for messages: meta names another client only to
    administrators (``wire.meta_lock.LockInfo``); 0 is "another client"."""
    if hit.client_id == client_id:
        return "this client"
    return f"client {hit.client_id:#x}" if hit.client_id else "another client"


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
        self.lost_total = 0  # owners whose locks a lapsed lease took away; locks a restore lost (_restore)
        self._owners: dict[tuple[int, int, int], OwnerRecord] = {}  # (inode, kind, owner) -> what it holds
        # (inode, kind, owner) -> the undo of grants no caller saw (_attempt): the owner's next call waits
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
        """One attempt: None when granted (or unlocked), else the lock in the way. Raw: ``set``
        goes through ``_attempt``, which keeps the owner's record (``OwnerRecord``) and undoes
        grants no caller saw; a call made here directly is in no record."""
        key = (inode, kind, owner)
        before = set(self._held)
        if type_ != UNLOCK:
            self._held.add(key)  # before the call: a lost reply may have granted it
            self.used = True
            self._keep_renewing()
        rsp: wl.LockRsp = await self.meta.call(wl.LOCK_SET, self._req(inode, kind, type_, first, last, owner, pid))
        if rsp.lease_new and before:
            # this owner's older locks on the file went too: only this call's range is held now
            self._lost(before & self._held)
            if type_ != UNLOCK:
                self._held.add(key)
        return None if rsp.granted else (rsp.conflict or wl.LockInfo())

    def _lost(self, lost: set[tuple[int, int, int]]) -> None:
        """Meta said our lease had run out: the locks of these owners are gone. Counted: the
        owners known to hold some (or with no record: a raw ``try_set``)."""
        if not lost:
            return
        n = 0
        for key in lost:
            st = self._owners.get(key)
            n += st is None or bool(st.held or st.stray)
            self._gone(key)
        if n:
            self.lost_total += n
            logger.error("the lock lease of client %#x ran out (cut off from meta for %.0fs?): "
                         "%d lock owner(s) lost their locks", self.client_id, self.lease_s, n)

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
                raise BlockingIOError(errno.EAGAIN, f"inode {inode}: locked by {_holder(hit, self.client_id)} "
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

    async def _after_undo(self, key: tuple[int, int, int]) -> None:
        while (pending := self._undoing.get(key)) is not None and not pending.done():
            await asyncio.wait([pending])

    async def _attempt(self, inode: int, kind: int, type_: int, first: int, last: int, owner: int,
                       pid: int) -> wl.LockInfo | None:
        """``try_set``, kept in the owner's record (``OwnerRecord``). A caller that never hears
        "granted" (cancelled while the call is in flight: an interrupted blocking ``lock()``, a
        FUSE INTERRUPT; or no answer came) is left as it was, as POSIX has it for a failed call:
        the call runs on; once every attempt of the owner on the file was answered, the undo
        follows (``undo_plan``: an UNLOCK of the range less what the owner held meanwhile, that
        part set back to the type its callers were told; a part no caller holds now is left,
        with a warning). The owner's next call on the file waits for the undo first, as it
        waits for the answer of a cancelled UNLOCK."""
        key = (inode, kind, owner)
        await self._after_undo(key)
        rng = (0, OFFSET_MAX) if kind == FLOCK else (first, last)
        st = self._owners.get(key)
        if st is None:
            st = self._owners[key] = OwnerRecord()
        st.begin()
        call = asyncio.ensure_future(self.try_set(inode, kind, type_, first, last, owner=owner, pid=pid))
        try:
            hit = await asyncio.shield(call)
        except asyncio.CancelledError:
            if call.done():
                self._answered(key, st, type_, rng, call, told=False)
            else:  # the owner's next call waits for the answer (and the undo): a late
                # UNLOCK would drop what it takes, a late grant add to it
                self._undo_when_answered(key, st)
                call.add_done_callback(lambda c: self._answered(key, st, type_, rng, c, told=False))
            raise
        except BaseException:
            self._answered(key, st, type_, rng, call, told=False)
            raise
        self._answered(key, st, type_, rng, call, told=True)
        return hit

    def _answered(self, key: tuple[int, int, int], st: OwnerRecord, type_: int, rng: Range,
                  call: asyncio.Future[wl.LockInfo | None], *, told: bool) -> None:
        """One attempt's answer came (or never will): the owner's record follows it."""
        if call.cancelled():
            granted, unknown = False, True
        else:
            exc = call.exception()
            granted = exc is None and call.result() is None
            unknown = isinstance(exc, TimeoutError | ConnectionError)  # meta may have acted on it
        if st.answered(type_, rng, granted=granted, unknown=unknown, told=told):
            self._undo_when_answered(key, st)
        if st.inflight == 0:
            self._drain(key, st)

    def _undo_when_answered(self, key: tuple[int, int, int], st: OwnerRecord) -> None:
        if st.drained is not None:
            return
        fut: asyncio.Future[tuple[list[Range], list[TRange]]] = asyncio.get_running_loop().create_future()
        st.drained = fut
        undo = asyncio.get_running_loop().create_task(self._undo(key, st, fut), name="loomfs-lock-undo")
        self._undoing[key] = undo
        undo.add_done_callback(lambda t: self._undoing.pop(key) if self._undoing.get(key) is t else None)

    def _drain(self, key: tuple[int, int, int], st: OwnerRecord) -> None:
        """Every attempt of the owner on the file was answered: what none of its callers was
        told it got is undone (``undo_plan``)."""
        fut, st.drained = st.drained, None
        if fut is None:
            self._tidy(key, st)
            return
        unlock, restore, left = undo_plan(st.untold, st.touched, st.held)
        for first, last in left:
            logger.warning("inode %d: a lock over %d..%d that a cancelled call of owner %#x may have taken is left "
                           "in place (the same owner held it meanwhile); it goes when the owner releases the file",
                           key[0], first, last, key[2])
        st.stray = ranges_union([*st.stray, *left])
        st.untold = []
        if not fut.done():  # cancelled: the loop is closing
            fut.set_result((unlock, restore))

    async def _undo(self, key: tuple[int, int, int], st: OwnerRecord,
                    answered: asyncio.Future[tuple[list[Range], list[TRange]]]) -> None:
        inode, kind, owner = key
        try:
            unlock, restore = await answered
            for part in restore:
                if st.holds(part):  # not released nor lost meanwhile
                    await self._restore(key, st, part)
            for first, last in unlock:
                try:
                    await self.try_set(inode, kind, UNLOCK, first, last, owner=owner)
                except (LoomError, OSError) as exc:  # it goes with a release, or the lease
                    st.stray = ranges_add(st.stray, (first, last))
                    logger.warning("undoing the lock of inode %d that a cancelled call may have taken: %s", inode, exc)
                else:
                    st.stray = ranges_sub(st.stray, (first, last))
        finally:
            if self._undoing.get(key) is asyncio.current_task():
                del self._undoing[key]
            self._tidy(key, st)

    async def _restore(self, key: tuple[int, int, int], st: OwnerRecord, part: TRange) -> None:
        """Set the owner's lock over ``part`` back to the type its callers were told. A WRITE is
        refused when another owner took a READ while a cut-short READ made it shared: that lock
        is lost (POSIX cannot say so); the owner keeps meta's READ, out of its record."""
        inode, kind, owner = key
        first, last, type_ = part
        try:
            hit = await self.try_set(inode, kind, type_, first, last, owner=owner)
        except (LoomError, OSError) as exc:
            st.stray = ranges_add(st.stray, (first, last))
            logger.warning("inode %d: setting owner %#x's lock over %d..%d back to type %d after a call cut short: %s",
                           inode, owner, first, last, type_, exc)
            return
        if hit is None and st.holds(part):
            return
        st.stray = ranges_add(st.stray, (first, last))  # refused, or the record forgot it meanwhile
        if hit is not None:
            st.held = typed_less(st.held, (first, last))
            self.lost_total += 1
            logger.error("inode %d: owner %#x lost its exclusive lock over %d..%d: a call cut short made it shared "
                         "at meta, and %s took a shared lock over %d..%d before it was set back",
                         inode, owner, first, last, _holder(hit, self.client_id), hit.first, hit.last)

    def _tidy(self, key: tuple[int, int, int], st: OwnerRecord) -> None:
        """The record goes once it is idle, and with it the key from ``_held``: nothing to
        release or renew for it."""
        if not st.idle() or self._owners.get(key) is not st:
            return
        pending = self._undoing.get(key)
        if pending is not None and not pending.done():
            return
        del self._owners[key]
        self._held.discard(key)

    async def get(self, inode: int, kind: int, type_: int, first: int = 0, last: int = OFFSET_MAX, *,
                  owner: int) -> wl.LockInfo | None:
        """F_GETLK: the lock that would stop this one, None if it would be granted."""
        rsp: wl.LockRsp = await self.meta.call(wl.LOCK_GET, self._req(inode, kind, type_, first, last, owner, 0))
        return rsp.conflict

    async def release(self, inode: int, kind: int, owner: int) -> int:
        """Every lock of ``owner`` of ``kind`` on ``inode`` goes (a close); no call when this
        owner holds nothing on the file here. An undo under way ends first (it may set a
        lock back)."""
        key = (inode, kind, owner)
        await self._after_undo(key)
        if key not in self._held:
            return 0
        rsp: wl.LockReleaseRsp = await self.meta.call(
            wl.LOCK_RELEASE, wl.LockReleaseReq(inode=inode, kind=kind, client_id=self.client_id, owner=owner))
        self._gone(key)
        return rsp.released

    def _gone(self, key: tuple[int, int, int]) -> None:
        """The owner holds nothing on the file at meta now (released, or its lease lapsed);
        the key stays in ``_held`` while attempts of it are in flight."""
        st = self._owners.get(key)
        if st is None:
            self._held.discard(key)
        else:
            st.forget()
            self._tidy(key, st)

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
            for key in list(self._owners):
                self._gone(key)
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
