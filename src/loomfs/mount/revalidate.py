"""Locks as sync points (close-to-open at lock time, as NFS does on lock): a process on one
node that takes a flock/fcntl lock of a file it already had open reads and writes the file as
meta has it now, whatever another node changed and published under the lock since.

* **Before the lock is asked for** (``flush_writers``): this mount's unsent writes to the file
  go to storage (an error answers the lock request, which then takes nothing).
* **Once it is granted, before the process hears of it** (``revalidate``), each client file
  of the inode open here is reopened, once for all the descriptors sharing it:
  - a *write* file is closed first (what it still buffers goes to storage, its length and
    the write session's end to meta: one CLOSE, in one round trip for an inline file's last
    bytes), then opened again read-write: meta's length, inline bytes (or chunks: a file
    the other node grew past its inline limit), truncate epoch, a new write session; its
    chunk buffers and read-ahead are new. So a write at "the end it read", or with
    O_APPEND, lands after what the other node wrote, not over it;
  - a *read-only* file is opened again read-only (meta's length and inline bytes; its
    prefetched chunks and read-ahead go; a read hold stays: the same inode);
  - then the kernel drops its pages and attributes of the file (``invalidate_inode``, from
    a thread: the kernel waits for pages being read, whose READs this loop answers).
* A file whose last name went here is not reopened (no path leads to it; its write session is
  what keeps it at meta). A name that leads elsewhere or nowhere now (another node renamed or
  unlinked the file): a read-only file keeps what it had; a write file stays closed and
  its next use opens the name again (``_usable``: ENOENT when it is gone, as NFS answers
  ESTALE). Failures are logged and counted (``lock_revalidate_errors``): the lock stays
  granted.

``LOOMFS_MOUNT_LOCK_REVALIDATE=0`` in the mount's environment turns both off (for A/B
measurements of what they cost; locks are then no sync point for files already open).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import pyfuse3

from loomfs.client.file import AsyncFile
from loomfs.mount.edge import Handle
from loomfs.wire.types import Attr, FileType

logger = logging.getLogger(__name__)
ENABLED = os.environ.get("LOOMFS_MOUNT_LOCK_REVALIDATE", "1") != "0"


def _open_files(ops: Any, inode: int, *, writable: bool | None = None) -> list[list[Handle]]:
    """The handles of ``inode`` with an open client file, grouped by the file they share."""
    groups: dict[int, list[Handle]] = {}
    for h in list(ops.handles.values()):
        if isinstance(h, Handle) and h.inode == inode and not h.file.closed and writable in (None, h.writable):
            groups.setdefault(id(h.file), []).append(h)
    return list(groups.values())


def _swap(ops: Any, old: AsyncFile, new: AsyncFile) -> None:
    for h in ops.handles.values():
        if isinstance(h, Handle) and h.file is old:
            h.file = new
            if h.prefetch is not None:
                h.prefetch.close()
                h.prefetch = ops._prefetcher(new)


async def flush_writers(ops: Any, inode: int) -> None:
    """Before a lock request of ``inode``: its write files here send what they buffer (to
    storage; an inline file's writes to meta). Raises the first write error, which every
    descriptor of that file keeps too for its next fsync or close(2) (``_keep_error``; before,
    only the lock request saw it)."""
    if not ENABLED:
        return
    for group in _open_files(ops, inode, writable=True):
        h = group[0]
        async with h.lock:
            if not h.file.closed:
                try:
                    await ops.call(h.file.flush())
                except OSError as exc:
                    ops._keep_error(h.file, exc)
                    raise


async def revalidate(ops: Any, inode: int) -> None:
    """After a lock of ``inode`` is granted: every client file of it here is meta's file now,
    and the kernel's pages and attributes of it are gone (see the module's doc)."""
    if not ENABLED:
        return
    stats = ops.stats.requests
    stats["lock_revalidations"] += 1
    for group in _open_files(ops, inode):
        try:
            if group[0].writable:
                await _reopen_writer(ops, inode, group[0])
            else:
                await _reopen_reader(ops, inode, group[0].file)
        except OSError as exc:
            stats["lock_revalidate_errors"] += 1
            logger.warning("revalidating inode %d at a lock: %s", inode, exc)
    ops._cached.pop(inode, None)
    try:
        await asyncio.to_thread(pyfuse3.invalidate_inode, inode, False)
    except OSError as exc:  # ENOENT: the kernel has forgotten the inode (nothing cached)
        if exc.errno != errno.ENOENT:
            logger.warning("dropping the kernel's cache of inode %d at a lock: %s", inode, exc)


def refreshable(ops: Any, inode: int) -> bool:
    """Whether ``inode``'s read-only files here can be opened again by a name: it has one here,
    and not the one a reopen found leading nowhere or to another file (``ops._stale_names``:
    unlinked or renamed elsewhere while open here). Such a file keeps reading its own bytes
    (POSIX: an open file outlives its name) and costs no more meta calls per GETATTR or READ
    until a LOOKUP finds it by a name again (review session 15: before, its version never
    matched meta's by-inode answer and every GETATTR, and a READ per attr_timeout, cost a STAT,
    a SETATTR by inode and an OPEN that failed or a CLOSE of another file's)."""
    if not ops.inodes.has_name(inode):
        return False
    return bool(ops._stale_names.get(inode) != ops.inodes.path(inode))


async def refresh_readers(ops: Any, inode: int, attr: Attr) -> None:
    """Meta's attributes of ``inode`` are ``attr`` (a GETATTR, a LOOKUP, or a READ of a
    handle last compared over ``attr_timeout`` ago): its read-only files here opened at
    another version (size, mtime, ctime: another client wrote, cut or extended it since) are
    opened again, as at a lock grant (their inline bytes, length and prefetched chunks go).
    Before, a read-only descriptor served what it had at its open for as long as it stayed
    open: after another mount cut the file and extended it again, the bytes from before the
    cut came back where the file reads zeros (the kernel, told the new size, re-read its
    pages from the stale copy). Files whose name is gone here, or leads elsewhere at meta
    (``refreshable``), are left as they are."""
    if attr.inode != inode or attr.type != FileType.FILE or not refreshable(ops, inode):
        return
    version = (attr.size, attr.mtime_ns, attr.ctime_ns)
    for group in _open_files(ops, inode, writable=False):
        f = group[0].file
        seen = f.opened_attr
        if seen is not None and (seen.size, seen.mtime_ns, seen.ctime_ns) == version:
            continue
        ops.stats.requests["reader_refreshes"] += 1
        await _reopen_reader(ops, inode, f)


@contextlib.asynccontextmanager
async def _reader_lock(ops: Any, inode: int) -> AsyncIterator[None]:
    """One reopen of ``inode``'s read-only files at a time (a GETATTR's, a READ's, a lock's):
    two at once both opened the file, and the second's was swapped into no handle and never
    closed (review session 15)."""
    locks: dict[int, tuple[asyncio.Lock, list[int]]] = ops._reader_locks
    lock, users = locks.setdefault(inode, (asyncio.Lock(), [0]))
    users[0] += 1
    try:
        async with lock:
            yield
    finally:
        users[0] -= 1
        if not users[0]:
            del locks[inode]


def _in_use(ops: Any, f: AsyncFile) -> bool:
    return any(isinstance(h, Handle) and h.file is f for h in ops.handles.values())


async def _reopen_reader(ops: Any, inode: int, old: AsyncFile) -> None:
    async with _reader_lock(ops, inode):
        if old.closed or not _in_use(ops, old):  # swapped by the reopen before this one; released
            return
        path = ops._inode_path(inode)
        try:
            f = await ops.call(ops.client.open(path, "rb"))
        except FileNotFoundError as exc:  # gone or renamed: the handles keep what they had
            ops._stale_names[inode] = path
            logger.info("reopening inode %d: %s", inode, exc)
            return
        except OSError as exc:  # (tried again at the next check)
            logger.info("reopening inode %d: %s", inode, exc)
            return
        if f.inode != inode or old.closed or not _in_use(ops, old):  # the name is another file's now
            await ops.call(f.close())
            if f.inode != inode:
                ops._stale_names[inode] = path
            return
        _swap(ops, old, f)
        ops.stats.requests["lock_reopens"] += 1
        await ops.uses.retire(old)  # now, or once the reads that took it before the swap are done


async def _reopen_writer(ops: Any, inode: int, h: Handle) -> None:
    if not ops.inodes.has_name(inode):  # nameless here: its write session keeps it at meta
        return
    async with h.lock:  # shared by every descriptor of the file: no write lands in between
        old = h.file
        if old.closed:  # a close(2) closed it meanwhile
            return
        # its bytes, length, times; the session ends. A write error (this close's, or the one
        # a GETATTR's catch-up kept) stays with the descriptors for their next fsync or
        # close(2): before, the reopen took a kept one and only logged it (review session 15)
        kept = h.error
        try:
            await ops._synced_locked(h, close=True)  # raises (and takes) h's kept error, else its own
        except OSError as exc:
            if exc is not kept:  # the others keep it too (WriterOps._keep_error)
                ops.stats.requests["lock_revalidate_errors"] += 1
                logger.error("inode %d: a write before the lock failed closing its file (kept for "
                             "the descriptors' next fsync or close): %s", inode, exc)
            if h.error is None:
                h.error = kept if kept is not None else exc
        f = await ops.call(ops.client.open(ops._inode_path(inode), "r+b"))
        if f.inode != inode:  # the name is another file's now: the next use reopens (ENOENT)
            await ops.call(f.close())
            return
        _swap(ops, old, f)
        ops.stats.requests["lock_reopens"] += 1
