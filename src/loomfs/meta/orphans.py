"""Orphan inodes: files kept, with no name, while clients hold them open (POSIX unlink-while-open).

When the last name of a regular file goes (unlink, a rename over it) and some client still
holds it (a write session, or a read hold: ``MetaTxn.add_hold``, taken by the FUSE mount for
its read-only opens), the namespace keeps the inode row with ``nlink`` 0 and lists it in the
store's ``orphans`` table instead of dropping it. No directory entry names it, so no listing
shows it; everything its holders do names the inode (reads and writes at storage, SETATTR,
SYNC, CLOSE, WRITE_INLINE, MIGRATE by inode), and goes on working. The file still counts in
the ``files`` and ``bytes_used`` counters while it lives.

Once it has no holder left the file is dropped as an unlinked file is (``drop_file``: its
inode row, inline data and truncate epoch go, its chunks to the GC queue): by the call that
ended the last holder when that call knows (CLOSE, the GC worker's lease expiry), else by the
GC worker's sweep of ``orphans_unheld`` (a WRITE_INLINE that closed, a client's sessions
removed at once), within one GC round. A crashed client's holds end with its lease, so an
orphan outlives its last holder by at most a lease and a GC round.

No I/O here beyond the transaction handed in (callers: ``loomfs.meta.ops.base``,
``loomfs.meta.ops.files``, ``loomfs.meta.gc``).
"""

from __future__ import annotations

import dataclasses
import logging

from loomfs.meta.store.base import GcEntry, MetaTxn
from loomfs.wire.types import Attr, FileType, Layout

logger = logging.getLogger(__name__)

# counter names in the store (``loomfs.meta.ops.base`` uses the same)
C_FILES = "files"
C_BYTES = "bytes_used"
_FILE = int(FileType.FILE)


async def drop_file(txn: MetaTxn, attr: Attr, now: int, default_layout: Layout, *,
                    unlinked_ns: int | None = None) -> bool:
    """File ``attr`` has neither a name nor a holder: its inode goes, its chunks to the GC
    queue (as of ``unlinked_ns``, default now: GC's delay counts from when the last name
    went). Returns True when storage may hold chunks of it (a GC entry was queued)."""
    queued_ns = now if unlinked_ns is None else min(now, unlinked_ns)
    await txn.delete_inode(attr.inode)
    if attr.type != _FILE:
        return False
    await txn.set_trunc_epoch(attr.inode, 0)
    trim = await txn.trim_get(attr.inode)
    if trim is not None and trim.claim_until_ns <= now:
        await txn.trim_delete(attr.inode)  # a claimed one is its performer's to drop (GC waits)
    await txn.add_counter(C_FILES, -1)
    if attr.size:
        await txn.add_counter(C_BYTES, -attr.size)
    if attr.inline:
        row = await txn.get_inline(attr.inode)
        await txn.delete_inline(attr.inode)
        if (row is None or not row.chunks_dirty) and trim is None and not await txn.has_session(attr.inode):
            return False  # storage holds nothing of it
        # chunks a migration or an earlier life in chunks left: GC removes every chunk
        await txn.gc_put(GcEntry(attr.inode, attr.layout or default_layout, 0, queued_ns))
        return True
    await txn.gc_put(GcEntry(attr.inode, attr.layout or default_layout, attr.size, queued_ns))
    return True


async def keep_if_held(txn: MetaTxn, attr: Attr, now: int) -> bool:
    """The last name of ``attr`` just went: when it is a file somebody holds, keep it as an
    orphan (``nlink`` 0, ctime now) and return True; else False (the caller drops it)."""
    if attr.type != _FILE or not await txn.holders(attr.inode):
        return False
    await txn.put_inode(dataclasses.replace(attr, nlink=0, ctime_ns=now))
    await txn.orphan_put(attr.inode, now)
    logger.debug("meta: inode %d unlinked while open: kept as an orphan", attr.inode)
    return True


async def release_if_unheld(txn: MetaTxn, inode: int, now: int, default_layout: Layout) -> bool:
    """A holder of ``inode`` went: if it is an orphan with no holder left, drop it now.
    Returns True when it was dropped."""
    since_ns = await txn.orphan_since(inode)
    if since_ns is None or await txn.holders(inode):
        return False
    await txn.orphan_delete(inode)
    attr = await txn.get_inode(inode)
    if attr is not None and attr.nlink <= 0:
        # queued as of the unlink: GC's delay counts from when the name went, as for any file
        await drop_file(txn, attr, now, default_layout, unlinked_ns=since_ns)
        logger.debug("meta: orphan inode %d has no holder left: dropped", inode)
    return True
