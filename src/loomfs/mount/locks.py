"""flock and fcntl locks of a mount, held at meta so every mount and client of the cluster
sees them (``loomfs.meta.locks``; the requests come through ``loomfs.mount.lowlevel``).

* **Owner** = (this mount's client id, the kernel's ``lock_owner``): for POSIX locks the
  process's file table, for flock the open file description; so processes of one mount
  conflict as they would locally, and processes of two mounts conflict through meta.
* **F_SETLK / LOCK_NB**: one LOCK_SET; refused -> EAGAIN (``EWOULDBLOCK``).
  **F_SETLKW / flock without LOCK_NB**: LOCK_SET polled with backoff (``LockClient.set``)
  until granted; the kernel's INTERRUPT (a signal to the waiting process, ^C, its kill)
  ends the wait with EINTR; a wait abandoned without a signal (its owner closed the file in
  another thread, or the mount stops) answers ENOLCK (EINTR without a pending signal would
  reach the process as the kernel's internal ERESTARTSYS, 512).
* **F_GETLK**: LOCK_GET; the lock in the way, with its pid when a process of this mount
  holds it (another node's pid means nothing here: 0).
* **close(2)**: the kernel's FLUSH carries the closing process's ``lock_owner``: its POSIX
  locks on the file go (as ``close`` does on Linux), after the mount's own flush. Waits of
  that owner on that file are abandoned first (the process is closing or gone), so a grant
  cannot land after the unlock. **flock** locks go at the RELEASE of their open file
  description (``FUSE_RELEASE_FLOCK_UNLOCK``), and so do **OFD** locks (``F_OFD_SETLK``: POSIX
  requests whose owner is the description; the RELEASE drops the POSIX locks asked for
  through it that are still held). A killed process's descriptors close the same
  way. A killed *mount* holds nothing for longer than its lease (``lock_lease_s``, 30 s):
  the lease is renewed while it holds locks, and meta drops them when that stops.
* **Unlock publishes writes**: an explicit unlock (``F_UNLCK``, ``LOCK_UN``) first syncs what
  this mount wrote to the file (bytes to storage, length to meta), as close does; so a process
  on another node that takes the lock next reads them. **A lock is a sync point**
  (``loomfs.mount.revalidate``, NFS's lock-time close-to-open): before it is asked for, what
  this mount buffers of the file goes out; once granted, before the process hears of it,
  the file's client files here (write and read-only) are reopened from meta and the
  kernel's pages and attributes of it dropped, so a descriptor opened before another node
  changed the file reads and writes (at the end, O_APPEND) the file as that node left it.
* Only owners that locked a file here send anything at close: a mount that never locks
  pays nothing.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

import pyfuse3

from loomfs.client.locks import FLOCK, OFFSET_MAX, POSIX, READ, UNLOCK, WRITE, LockClient
from loomfs.mount.lowlevel import Handlers, Libfuse, LockReq
from loomfs.mount.revalidate import flush_writers, revalidate

logger = logging.getLogger(__name__)

ABANDON_WAIT_S = 5.0  # a close waits this long at most for its owner's lock waits to stop
_TYPES = {fcntl.F_RDLCK: READ, fcntl.F_WRLCK: WRITE, fcntl.F_UNLCK: UNLOCK}
_FCNTL_OF = {READ: fcntl.F_RDLCK, WRITE: fcntl.F_WRLCK}


def byte_range(start: int, length: int) -> tuple[int, int]:
    """libfuse's (l_start, l_len) -> (first, last) inclusive; l_len 0: to the end."""
    if start < 0 or length < 0:
        raise OSError(errno.EINVAL, f"lock range start {start} length {length}")
    if length == 0 or start + length - 1 >= OFFSET_MAX:
        return start, OFFSET_MAX
    return start, start + length - 1


class MountLocks:
    """The lock requests of one mount. ``ops``: the ``LoomOperations`` (its flush/release, and
    ``call`` onto the client's loop); ``lib``: the reply calls."""

    def __init__(self, ops: Any, lock_client: LockClient, lib: Libfuse):
        self.ops = ops
        self.locks = lock_client
        self.lib = lib
        self._tasks: set[asyncio.Task[None]] = set()
        # (inode, kind, owner) -> abandon flags of its blocking waits in progress
        self._waits: dict[tuple[int, int, int], list[list[bool]]] = {}
        self._wait_tasks: dict[tuple[int, int, int], set[asyncio.Task[None]]] = {}
        # handle -> (inode, owner) of the POSIX locks asked for through it: an OFD lock's
        # owner is the open file description, whose end (RELEASE) says nothing of it
        self._posix_by_fh: dict[int, set[tuple[int, int]]] = {}
        # counted with the mount's requests (user.loomfs.stats on the root): lock_getlk ...
        stats = getattr(ops, "stats", None)
        self.requests: Counter[str] = stats.requests if stats is not None else Counter()

    def __repr__(self) -> str:
        waits = sum(len(w) for w in self._waits.values())
        return f"MountLocks({self.locks!r} waits={waits} setlk={self.requests['lock_setlk']})"

    def handlers(self) -> Handlers:
        return Handlers(getlk=self.getlk, setlk=self.setlk, flock=self.flock, flush=self.flush, release=self.release,
                        fallocate=self.fallocate)

    def _spawn(self, coro: Coroutine[Any, Any, None], key: tuple[int, int, int] | None = None) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if key is not None:
            waiting = self._wait_tasks.setdefault(key, set())
            waiting.add(task)

            def done(t: asyncio.Task[None]) -> None:
                waiting.discard(t)
                if not waiting and self._wait_tasks.get(key) is waiting:
                    del self._wait_tasks[key]

            task.add_done_callback(done)
        return task

    async def _answer(self, req: int, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``work`` and answer the request: 0, or the errno it raised."""
        try:
            await work()
        except pyfuse3.FUSEError as exc:
            self.lib.reply_err(req, exc.errno)
        except OSError as exc:
            self.lib.reply_err(req, exc.errno or errno.EIO)
        except Exception:
            logger.exception("lock request failed")
            self.lib.reply_err(req, errno.EIO)
        else:
            self.lib.reply_err(req, 0)

    # --- the kernel's requests (called inside libfuse, on the FUSE loop) ------------------

    def getlk(self, r: LockReq, type_: int, start: int, length: int, pid: int) -> None:
        self.requests["lock_getlk"] += 1
        self._spawn(self._getlk(r, type_, start, length))

    async def _getlk(self, r: LockReq, type_: int, start: int, length: int) -> None:
        try:
            first, last = byte_range(start, length)
            hit = await self.ops.call(self.locks.get(r.ino, POSIX, _TYPES.get(type_, WRITE), first, last,
                                                     owner=r.owner))
        except OSError as exc:
            self.lib.reply_err(r.req, exc.errno or errno.EIO)
            return
        except Exception:
            logger.exception("getlk failed")
            self.lib.reply_err(r.req, errno.EIO)
            return
        if hit is None:
            self.lib.reply_lock(r.req, fcntl.F_UNLCK, start, length, 0)
            return
        pid = hit.pid if hit.client_id == self.locks.client_id else 0
        hit_len = 0 if hit.last >= OFFSET_MAX else hit.last - hit.first + 1
        self.lib.reply_lock(r.req, _FCNTL_OF.get(hit.type, fcntl.F_WRLCK), hit.first, hit_len, pid)

    def setlk(self, r: LockReq, type_: int, start: int, length: int, pid: int, sleep: bool) -> None:
        self.requests["lock_setlk"] += 1
        if type_ not in _TYPES:
            self.lib.reply_err(r.req, errno.EINVAL)
            return
        kind_type = _TYPES[type_]
        self._set(r, POSIX, kind_type, start, length, pid, sleep and kind_type != UNLOCK)

    def flock(self, r: LockReq, op: int) -> None:
        self.requests["lock_flock"] += 1
        base = op & ~fcntl.LOCK_NB
        type_ = {fcntl.LOCK_SH: READ, fcntl.LOCK_EX: WRITE, fcntl.LOCK_UN: UNLOCK}.get(base)
        if type_ is None:
            self.lib.reply_err(r.req, errno.EINVAL)
            return
        self._set(r, FLOCK, type_, 0, 0, 0, not op & fcntl.LOCK_NB and type_ != UNLOCK)

    def _set(self, r: LockReq, kind: int, type_: int, start: int, length: int, pid: int, wait: bool) -> None:
        key = (r.ino, kind, r.owner)
        if kind == POSIX and type_ != UNLOCK:
            self._posix_by_fh.setdefault(r.fh, set()).add((r.ino, r.owner))
        abandon = [False]

        def stop() -> bool:
            return abandon[0] or self.lib.interrupted(r.req)

        async def work() -> None:
            first, last = byte_range(start, length)
            if type_ == UNLOCK:
                await self._sync_writers(r.ino)
            else:  # a sync point, as NFS's: what this mount buffers goes out first
                await flush_writers(self.ops, r.ino)
            try:
                await self.ops.call(self.locks.set(r.ino, kind, type_, first, last, owner=r.owner, pid=pid,
                                                   wait=wait, interrupted=stop if wait else None))
            except InterruptedError:
                if abandon[0]:  # no signal: EINTR would reach the process as ERESTARTSYS (512)
                    raise OSError(errno.ENOLCK, "lock wait abandoned (the file closed, or unmount)") from None
                raise
            if type_ != UNLOCK:
                await revalidate(self.ops, r.ino)

        async def run() -> None:
            try:
                await self._answer(r.req, work)
            finally:
                if wait:
                    flags = self._waits.get(key)
                    if flags is not None and abandon in flags:
                        flags.remove(abandon)
                        if not flags:
                            del self._waits[key]

        if wait:
            self._waits.setdefault(key, []).append(abandon)
        self._spawn(run(), key if wait else None)

    async def _sync_writers(self, inode: int) -> None:
        """Before an unlock reaches meta: what this mount wrote to the file reaches storage and
        its length meta (as a close would), so whoever takes the lock next, on any node, and
        opens the file then reads it. An unlock does not fail for a failed sync (logged): the
        error, and any a descriptor kept, stays for every descriptor's next fsync or close(2)."""
        for h in self.ops._writers(inode):
            try:
                await self.ops._synced(h, report=False)
            except Exception as exc:  # noqa: BLE001 - the unlock goes on; the writer's close reports it
                logger.warning("syncing inode %d before an unlock: %s", inode, exc)

    async def _abandon_waits(self, key: tuple[int, int, int]) -> None:
        for flag in self._waits.get(key, []):
            flag[0] = True
        waiting = list(self._wait_tasks.get(key, ()))
        if waiting:
            await asyncio.wait(waiting, timeout=ABANDON_WAIT_S)

    def flush(self, r: LockReq) -> None:
        async def work() -> None:
            try:
                await self.ops.flush(r.fh)
            finally:
                key = (r.ino, POSIX, r.owner)
                if key in self._waits or self.locks.holds(*key):
                    await self._abandon_waits(key)
                    await self.ops.call(self.locks.release(r.ino, POSIX, r.owner))
                    self.requests["lock_flush_unlocks"] += 1

        self._spawn(self._answer(r.req, work))

    def release(self, r: LockReq, flock_release: bool) -> None:
        posix = self._posix_by_fh.pop(r.fh, set())

        async def work() -> None:
            try:
                await self.ops.release(r.fh)
            finally:
                keys = [(r.ino, FLOCK, r.owner)] if flock_release else []
                # POSIX locks taken through this open file description: a process's were
                # dropped at its close (FLUSH) already; an OFD lock's owner is the description
                keys += [(ino, POSIX, owner) for ino, owner in sorted(posix)]
                for key in keys:
                    if key in self._waits or self.locks.holds(*key):
                        await self._abandon_waits(key)
                        await self.ops.call(self.locks.release(*key))
                        self.requests["lock_release_unlocks"] += 1

        self._spawn(self._answer(r.req, work))

    def fallocate(self, r: LockReq, mode: int, offset: int, length: int) -> None:
        """Not a lock: the same glue's slot (``LoomOperations.fallocate``)."""
        self.requests["fallocate"] += 1
        self._spawn(self._answer(r.req, lambda: self.ops.fallocate(r.ino, r.fh, mode, offset, length)))

    async def close(self) -> None:
        """At unmount: waits stop (answered before libfuse's session goes), and every lock of
        this mount goes at meta."""
        for flags in self._waits.values():
            for flag in flags:
                flag[0] = True
        loop = asyncio.get_running_loop()
        here = [t for t in self._tasks if t.get_loop() is loop]  # a stopped FUSE loop's never run again
        if here:
            await asyncio.wait(here, timeout=ABANDON_WAIT_S)
        try:
            await self.ops.call(self.locks.close())
        except OSError as exc:  # they go with the lease
            logger.warning("dropping this mount's locks at meta: %s", exc)


def install(ops: Any, lease_s: float) -> MountLocks | None:
    """Cluster-wide locks for the pyfuse3 session ``pyfuse3.init()`` just made; None (and the
    kernel's local locks) when this pyfuse3/libfuse is not the one the glue knows."""
    try:
        lib = Libfuse()
    except OSError as exc:
        logger.warning("locks stay local to this mount: libfuse not loadable (%s)", exc)
        return None
    lc = LockClient(ops.client.meta, ops.client.client_id, lease_s=lease_s)
    mount_locks = MountLocks(ops, lc, lib)
    why = lib.install(pyfuse3, mount_locks.handlers())
    if why is not None:
        logger.warning("locks stay local to this mount (flock/fcntl not seen by other mounts): %s", why)
        return None
    return mount_locks
