"""Inline files: small files whose bytes live in the metadata store, not in chunks.

A file is *inline* (``Attr.inline``) when its content is a row of the store (``InlineData``),
written in the same transaction as its inode. That makes a small file one round trip to
create (OPEN with ``data``) and one to read (READ, or OPEN, answers with the bytes), with no
storage hop. New files start inline when their directory's limit (``Layout.inline_max_bytes``,
fixed in the file's layout at create) is above 0; a file grows out of it by *migration*.

Invariants:

* a file is inline exactly when it has an inline row; ``size == len(data)``, and
  ``crc == crc32c(data)`` (checked on every read: rot answers EIO);
* an inline file's chunks are never read. ``chunks_dirty`` says storage may hold chunks of
  it (a migration that did not finish, or a file that was in chunks before an O_TRUNC
  ``put`` made it inline): they are cut before a migration writes, and GC removes them when
  the file goes. A clean inline file costs storage nothing, also to delete.

Migration (``migrate``), crash-safe and serialised per inode in this process:

1. mark the row ``chunks_dirty`` (and, if it already was, queue a trim of every chunk);
2. cut that trim (``Trimmer.settle``), then write the content to chunk 0 (the limit is at
   most a chunk);
3. in one transaction, if the content's version did not move and no trim is pending: drop
   the row, clear ``inline``. Otherwise start again.

A crash before 3 leaves an inline file (the truth) with dirty chunks; the next migration cuts
them first. Readers see the inline content until 3 commits and the chunks after, which hold
the same bytes by then. Writers of an inline file send their writes to meta
(``write_inline``, patches applied in one transaction); one that finds the file migrated
(``applied=False``) writes to the chunks instead. Truncates of inline files edit the content,
and an extend past the limit migrates first. Several meta processes migrating one inode at
once are not serialised yet (issue 12: a claim like the trim queue's), and neither is a
migration on one meta with an O_TRUNC or put of the file on another (only this process's
migrations are waited for, ``MigrationBusy``): the migration's copy, landing after the other
meta's O_TRUNC and its cut, leaves the old bytes in chunk 0 past the new length, where an
extend reads them (PostgreSQL hunt, session 14). The fix is the same claim, kept in the
inline row and checked by O_TRUNC and puts; not done yet.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import crc32c

from loomfs.errors import StatusError
from loomfs.meta import orphans, perm
from loomfs.meta.caller import caller
from loomfs.meta.layout import INLINE_MAX_BYTES_CAP
from loomfs.meta.ops.base import C_BYTES, FILE, NamespaceBase
from loomfs.meta.ops.walk import walk
from loomfs.meta.paths import split_path
from loomfs.meta.store.base import GcEntry, InlineData, MetaTxn, TrimEntry
from loomfs.meta.trim import queue_trim
from loomfs.wire.status import Status
from loomfs.wire.types import ROOT_INODE, Attr

logger = logging.getLogger(__name__)

DEFAULT_INLINE_MAX_BYTES = 64 << 10
MIGRATE_ROUNDS = 5


@dataclasses.dataclass(frozen=True, slots=True)
class Patch:
    offset: int
    data: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class InlineWritten:
    attr: Attr | None  # None: the inode is gone
    applied: bool  # False: the file is in chunks (now): the writer writes there
    trunc_epoch: int = 0


def check_crc(inode: int, row: InlineData) -> bytes:
    if crc32c.crc32c(row.data) != row.crc:
        logger.error("meta: inline data of inode %d fails its CRC32C (store corruption)", inode)
        raise StatusError(Status.EIO, f"inode {inode}: inline data fails its checksum")
    return row.data


def apply_patches(data: bytes, patches: Sequence[Patch]) -> bytearray:
    out = bytearray(data)
    for p in patches:
        if p.offset < 0:
            raise StatusError(Status.EINVAL, f"negative offset {p.offset}")
        end = p.offset + len(p.data)
        if end > len(out):
            out.extend(bytes(end - len(out)))
        out[p.offset : end] = p.data
    return out


def patched_length(length: int, patches: Sequence[Patch]) -> int:
    """The length after the patches; EINVAL for a bad one (checked before anything is done)."""
    end = length
    for p in patches:
        if p.offset < 0:
            raise StatusError(Status.EINVAL, f"negative offset {p.offset}")
        end = max(end, p.offset + len(p.data))
    return end


class MigrationBusy(Exception):
    """Raised inside a transaction that would move an inline file to chunks while this
    process is migrating it: the caller waits for the migration (``wait_migration``) and
    tries again, so the migration's copy can never land after the file's new chunks."""

    def __init__(self, inode: int):
        super().__init__(inode)
        self.inode = inode


class InlineOps(NamespaceBase):
    def inline_limit(self, parent: Attr) -> int:
        """The inline limit a new file in directory ``parent`` gets (0 = chunks)."""
        lim = parent.layout.inline_max_bytes if parent.layout is not None else -1
        if lim < 0:
            lim = self.default_layout.inline_max_bytes
        if lim < 0:
            lim = DEFAULT_INLINE_MAX_BYTES
        cs = (parent.layout or self.default_layout).chunk_size
        return min(lim, cs, INLINE_MAX_BYTES_CAP)

    async def _set_inline(self, txn: MetaTxn, attr: Attr, data: bytes | bytearray, now: int, *, mtime_ns: int = 0,
                          chunks_dirty: bool | None = None) -> Attr:
        """Make ``attr`` (a file) inline with content ``data``, in the caller's transaction."""
        row = await txn.get_inline(attr.inode)
        version = row.version + 1 if row is not None else 1
        dirty = chunks_dirty if chunks_dirty is not None else (row.chunks_dirty if row is not None else False)
        await txn.put_inline(attr.inode, InlineData(bytes(data), crc32c.crc32c(data), version, dirty))
        new = dataclasses.replace(attr, inline=True, size=len(data), mtime_ns=mtime_ns or now, ctime_ns=now)
        await txn.put_inode(new)
        if new.size != attr.size:
            await txn.add_counter(C_BYTES, new.size - attr.size)
        return new

    async def _inline_content(self, txn: MetaTxn, attr: Attr) -> bytes | None:
        """An inline file's content (CRC checked); None for any other inode."""
        if not attr.inline:
            return None
        row = await txn.get_inline(attr.inode)
        if row is None:
            raise StatusError(Status.EIO, f"inode {attr.inode} is inline but has no data")
        return check_crc(attr.inode, row)

    async def read(self, path: str, *, follow_symlinks: bool = True) -> tuple[Attr, bytes | None]:
        """A file's attributes and, when it is inline, its content (READ)."""
        parts = split_path(path)
        who = caller()
        if not who.tenant:  # one statement when the engine can (a tenant's root needs a lookup)
            hit = self.store.quick_attr(ROOT_INODE, parts, follow_last=follow_symlinks, with_inline=True,
                                        perms=who.uid != 0)
            if hit is not None:
                attr = hit.attr
                if hit.dirs is not None:  # the walk's search checks, then the file's own
                    perm.search_rows(hit.dirs, who, "path lookup")
                    if attr.type == FILE:
                        perm.need(attr, who, perm.R, path)
                return attr, (check_crc(attr.inode, hit.inline) if hit.inline is not None else None)
        async with self.store.read() as txn:
            r = await walk(txn, parts, follow_last=follow_symlinks)
            if r.inode is None:
                raise StatusError(Status.ENOENT, path)
            attr = await self._attr(txn, r.inode)
            who = caller()
            if who.uid != 0 and attr.type == FILE:
                perm.need(attr, who, perm.R, path)
            return attr, await self._inline_content(txn, attr)

    async def write_inline(
        self, inode: int, session_id: int, patches: Sequence[Patch], *, mtime_ns: int = 0, close: bool = False,
    ) -> InlineWritten:
        """Apply a writer's patches to an inline file in one transaction. A file in chunks
        (or one the patches would grow past its limit: migrated here first) answers
        ``applied=False`` and is left alone, session included. A migration of the file in
        progress (in this meta) is waited for first: patches applied meanwhile change the
        content under its copy, and a writer's stream of them starved it to EAGAIN."""
        who = caller()
        if self._migrations.busy(inode):
            await self.wait_migration(inode)
        async with self.store.write() as txn:
            await self._confine(txn, inode)
            attr = await txn.get_inode(inode)
            if attr is not None and who.uid != 0 and not perm.allowed(attr, who, perm.W):
                if not session_id or await txn.session_client(inode, session_id) is None:
                    raise StatusError(Status.EACCES, f"inode {inode}: permission denied")
            if attr is None or attr.type != FILE or not attr.inline:
                if attr is None and close and session_id:
                    await txn.remove_session(inode, session_id)
                    await orphans.release_if_unheld(txn, inode, self.clock.now_ns(), self.default_layout)
                epoch = await txn.trunc_epoch(inode) if attr is not None else 0
                return InlineWritten(attr, False, epoch)
            limit = attr.layout.inline_max_bytes if attr.layout is not None else 0
            grow = patched_length(attr.size, patches) > limit
            if not grow:
                now = self.clock.now_ns()
                data = await self._inline_content(txn, attr) or b""
                attr = await self._set_inline(txn, attr, apply_patches(data, patches), now, mtime_ns=mtime_ns)
                if close and session_id:
                    await txn.remove_session(inode, session_id)
                    # the last holder of a nameless file: it goes now, not at GC's next sweep
                    await orphans.release_if_unheld(txn, inode, now, self.default_layout)
                return InlineWritten(attr, True, await txn.trunc_epoch(inode))
        attr, epoch = await self.migrate(inode, checked=True)  # its writer passed the check above
        return InlineWritten(attr, False, epoch)

    async def migrate(self, inode: int, *, checked: bool = False) -> tuple[Attr, int]:
        """Move an inline file's content to chunks (see the module docstring); returns the
        attributes (chunked) and the file's truncate epoch. A file in chunks is answered as is."""
        async with self._migrations.hold(inode):
            for _ in range(MIGRATE_ROUNDS):
                async with self.store.write() as txn:
                    await self._confine(txn, inode)
                    attr = await txn.get_inode(inode)
                    if attr is None:
                        raise StatusError(Status.ENOENT, f"inode {inode}")
                    who = caller()
                    if not checked and who.uid != 0 and not perm.allowed(attr, who, perm.W):
                        raise StatusError(Status.EACCES, f"inode {inode}: permission denied")
                    if attr.type != FILE:
                        raise StatusError(Status.EINVAL, f"inode {inode} is not a file")
                    if not attr.inline:
                        return attr, await txn.trunc_epoch(inode)
                    row = await txn.get_inline(inode)
                    if row is None:
                        raise StatusError(Status.EIO, f"inode {inode} is inline but has no data")
                    data = check_crc(inode, row)
                    if not data and not row.chunks_dirty:  # nothing in storage, nothing to write
                        return await self._finish_migration(txn, attr), await txn.trunc_epoch(inode)
                    now = self.clock.now_ns()
                    if row.chunks_dirty:
                        owner, until = self.trimmer.claim(now) if self.trimmer is not None else (0, 0)
                        await queue_trim(txn, TrimEntry(
                            inode=inode, layout=attr.layout or self.default_layout, length=0,
                            old_length=attr.size, idle=False, generation=0, enqueued_ns=now,
                            claim_owner=owner, claim_until_ns=until,
                        ), now)
                    else:
                        await txn.put_inline(inode, dataclasses.replace(row, chunks_dirty=True))
                    layout = attr.layout
                    version = row.version
                if row.chunks_dirty:
                    await self._settle(inode)
                if data:
                    if self.chunk_writer is None or layout is None or not layout.chains:
                        raise StatusError(Status.EIO, f"inode {inode}: no storage to migrate inline data to")
                    await self.chunk_writer.write_chunk(layout, inode, 0, 0, memoryview(data))
                async with self.store.write() as txn:
                    attr = await txn.get_inode(inode)
                    if attr is None and layout is not None:
                        # unlinked meanwhile: GC may have removed the chunks before our copy
                        # landed, or be removing them now; have it remove them (again): a
                        # fresh entry, which a removal already in flight does not delete
                        cur = await txn.gc_get(inode)
                        await txn.gc_put(GcEntry(inode, cur.layout if cur is not None else layout,
                                                 cur.length if cur is not None else 0, self.clock.now_ns()))
                if attr is None:
                    raise StatusError(Status.ENOENT, f"inode {inode}")
                async with self.store.write() as txn:
                    attr = await txn.get_inode(inode)
                    if attr is None:
                        raise StatusError(Status.ENOENT, f"inode {inode}")
                    if not attr.inline:
                        return attr, await txn.trunc_epoch(inode)
                    row = await txn.get_inline(inode)
                    if row is not None and row.version == version and await txn.trim_get(inode) is None:
                        logger.debug("meta: inode %d (%d bytes) migrated to chunks", inode, attr.size)
                        self.migrations_total += 1
                        return await self._finish_migration(txn, attr), await txn.trunc_epoch(inode)
            raise StatusError(Status.EAGAIN, f"inode {inode}: changed during every migration attempt")

    async def wait_migration(self, inode: int) -> None:
        async with self._migrations.hold(inode):
            pass

    def _check_not_migrating(self, inode: int) -> None:
        if self._migrations.busy(inode):
            raise MigrationBusy(inode)

    async def _finish_migration(self, txn: MetaTxn, attr: Attr) -> Attr:
        await txn.delete_inline(attr.inode)
        new = dataclasses.replace(attr, inline=False)
        await txn.put_inode(new)
        return new

    async def _resize_inline(self, txn: MetaTxn, attr: Attr, size: int, now: int, mtime_ns: int) -> Attr:
        """SETATTR of an inline file's size within its limit: cut or zero-extend the content."""
        data = await self._inline_content(txn, attr) or b""
        new = data[:size] if size <= len(data) else data + bytes(size - len(data))
        return await self._set_inline(txn, attr, new, now, mtime_ns=mtime_ns)
