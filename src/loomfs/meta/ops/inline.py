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

Migration (``migrate``), crash-safe, serialised per inode in this process by a lock and
across meta processes by a *claim* kept in the inline row (``claim_owner``, ``claim_until_ns``):

1. in one transaction: take the claim (a live one of another process: wait for it, EAGAIN
   after ``migration_wait_s``), mark the row ``chunks_dirty`` (and, if it already was, queue
   a trim of every chunk);
2. cut that trim (``Trimmer.settle``), then write the content to chunk 0 (the limit is at
   most a chunk) within ``migration_copy_timeout_s``;
3. in one transaction, if the content's version did not move, the claim is still ours and no
   trim is pending: drop the row, clear ``inline``. Otherwise start again.

A crash before 3 leaves an inline file (the truth) with dirty chunks and a claim that runs
out; the next migration cuts them first. Readers see the inline content until 3 commits and
the chunks after, which hold the same bytes by then. Writers of an inline file send their
writes to meta (``write_inline``, patches applied in one transaction; a patch keeps the
claim and moves the version, so the migration copies again); one that finds the file
migrated (``applied=False``) writes to the chunks instead. Truncates of inline files edit the
content, and an extend past the limit migrates first.

Every other move of an inline file to chunks (an O_TRUNC or put in chunks, on any meta) waits
while the row holds a live claim (``MigrationBusy``, ``wait_migration``), so a migration's
copy of the old content can never land after the file's new chunks or its cut (PostgreSQL
hunt, session 14: an O_TRUNC on another meta cut before the copy landed, and an extend then
read old bytes past the new end). A claim lasts ``migration_claim_s``, longer than a copy
may take plus a storage request's deadline (as the trim queue's claims); a copy that failed
drops it; one that hung (or a migration cancelled mid-copy) turns it into a fence (owner 0)
that nobody, this process included, passes before it runs out, because that write may still
land. A meta that died holding a claim delays moves to chunks of that file until it runs out.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from loomfs.meta.trim import POLL_S, queue_trim
from loomfs.wire.status import Status
from loomfs.wire.types import ROOT_INODE, Attr, Layout

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


@dataclasses.dataclass(frozen=True, slots=True)
class _Round:
    data: bytes
    layout: Layout | None
    version: int
    dirty: bool  # the chunks were dirty: a trim of them was queued, to settle before the copy


class _CopyHung(Exception):
    pass


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
        claim = (row.claim_owner, row.claim_until_ns) if row is not None else (0, 0)  # a migration's stays
        await txn.put_inline(attr.inode, InlineData(bytes(data), crc32c.crc32c(data), version, dirty, *claim))
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
            settle = False
            if attr is None or attr.type != FILE or not attr.inline:
                if attr is None and close and session_id:
                    await txn.remove_session(inode, session_id)
                    await orphans.release_if_unheld(txn, inode, self.clock.now_ns(), self.default_layout)
                epoch = await txn.trunc_epoch(inode) if attr is not None else 0
                in_chunks = InlineWritten(attr, False, epoch)
                # the writer goes on in chunks at this epoch: a pending truncate's trim is cut
                # before it hears it (rule 1 of ``loomfs.meta.trim``; hunt 16: the trim, cut
                # later, cut bytes it wrote and reported at that epoch)
                settle = attr is not None and attr.type == FILE and await self._must_settle(txn, inode)
                grow = False
            else:
                in_chunks = None
                limit = attr.layout.inline_max_bytes if attr.layout is not None else 0
                grow = patched_length(attr.size, patches) > limit
            if attr is not None and in_chunks is None and not grow:
                now = self.clock.now_ns()
                data = await self._inline_content(txn, attr) or b""
                attr = await self._set_inline(txn, attr, apply_patches(data, patches), now, mtime_ns=mtime_ns)
                if close and session_id:
                    await txn.remove_session(inode, session_id)
                    # the last holder of a nameless file: it goes now, not at GC's next sweep
                    await orphans.release_if_unheld(txn, inode, now, self.default_layout)
                return InlineWritten(attr, True, await txn.trunc_epoch(inode))
        if in_chunks is not None:
            if settle:
                await self._settle(inode)
            return in_chunks
        attr, epoch = await self.migrate(inode, checked=True)  # its writer passed the check above
        return InlineWritten(attr, False, epoch)

    async def migrate(self, inode: int, *, checked: bool = False) -> tuple[Attr, int]:
        """Move an inline file's content to chunks (see the module docstring); returns the
        attributes (chunked) and the file's truncate epoch. A file in chunks is answered as is.
        Its caller writes chunks at that epoch next, so the file's pending truncate trim is
        cut first (rule 1 of ``loomfs.meta.trim``; hunt 16: a trim a crash left, cut later,
        cut bytes written and reported at the epoch MIGRATE had handed out)."""
        answer = await self._migrate(inode, checked)
        if self.trimmer is not None:
            async with self.store.read() as txn:
                settle = await self._must_settle(txn, inode)
            if settle:
                await self._settle(inode)
        return answer

    async def _migrate(self, inode: int, checked: bool) -> tuple[Attr, int]:
        async with self._migrations.hold(inode):
            deadline = self.clock.monotonic() + self.migration_wait_s
            rounds = 0
            while rounds < MIGRATE_ROUNDS:
                async with self.store.write() as txn:
                    step = await self._claim_migration(txn, inode, checked)
                if isinstance(step, tuple):
                    return step
                if step is None:  # another meta's claim (or a hung copy's fence): wait for it
                    if self.clock.monotonic() >= deadline:
                        raise StatusError(Status.EAGAIN, f"inode {inode}: another meta is migrating it")
                    await asyncio.sleep(POLL_S)
                    continue
                rounds += 1
                data, layout, version, dirty = step.data, step.layout, step.version, step.dirty
                try:
                    if dirty:
                        await self._settle(inode)
                        if not await self._renew_migration(inode, version):
                            continue  # the content moved, or the claim was lost meanwhile
                    if data:
                        await self._copy(inode, layout, data)
                except _CopyHung as hung:  # its write may still land: nobody moves the file meanwhile
                    await self._release_migration(inode, self.migration_claim_s)
                    raise StatusError(Status.EIO, f"inode {inode}: migration copy: {hung}") from None
                except asyncio.CancelledError:
                    await asyncio.shield(self._release_migration(inode, self.migration_claim_s))
                    raise
                except BaseException:
                    await self._release_migration(inode, 0.0)
                    raise
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
                    if (row is not None and row.version == version and row.claim_owner == self.migration_owner
                            and await txn.trim_get(inode) is None):
                        logger.debug("meta: inode %d (%d bytes) migrated to chunks", inode, attr.size)
                        self.migrations_total += 1
                        return await self._finish_migration(txn, attr), await txn.trunc_epoch(inode)
            await self._release_migration(inode, 0.0)
            raise StatusError(Status.EAGAIN, f"inode {inode}: changed during every migration attempt")

    async def _claim_migration(self, txn: MetaTxn, inode: int, checked: bool) -> _Round | tuple[Attr, int] | None:
        """Step 1 of a migration round, in ``txn``: the answer when there is nothing to copy
        (a file in chunks, an empty clean one: migrated here), None while another claim
        holds the file, else the round (the claim taken, the chunks marked dirty, a trim of
        them queued when they already were)."""
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
        now = self.clock.now_ns()
        if row.claim_until_ns > now and row.claim_owner != self.migration_owner:
            return None
        if not data and not row.chunks_dirty:  # nothing in storage, nothing to write
            return await self._finish_migration(txn, attr), await txn.trunc_epoch(inode)
        if row.chunks_dirty:
            owner, until = self.trimmer.claim(now) if self.trimmer is not None else (0, 0)
            await queue_trim(txn, TrimEntry(
                inode=inode, layout=attr.layout or self.default_layout, length=0,
                old_length=attr.size, idle=False, generation=0, enqueued_ns=now,
                claim_owner=owner, claim_until_ns=until,
            ), now)
        await txn.put_inline(inode, dataclasses.replace(
            row, chunks_dirty=True, claim_owner=self.migration_owner,
            claim_until_ns=now + int(self.migration_claim_s * 1e9)))
        return _Round(data, attr.layout, row.version, row.chunks_dirty)

    async def _renew_migration(self, inode: int, version: int) -> bool:
        """After a settle (which may take up to a claim's worth of waits and cuts): the claim
        starts again for the copy, if it is still ours and the content did not move."""
        async with self.store.write() as txn:
            row = await txn.get_inline(inode)
            if row is None or row.version != version or row.claim_owner != self.migration_owner:
                return False
            until = self.clock.now_ns() + int(self.migration_claim_s * 1e9)
            await txn.put_inline(inode, dataclasses.replace(row, claim_until_ns=until))
            return True

    async def _copy(self, inode: int, layout: Layout | None, data: bytes) -> None:
        """Write the content to chunk 0 within the copy timeout (``_CopyHung`` past it: a
        write of it may still be in flight)."""
        if self.chunk_writer is None or layout is None or not layout.chains:
            raise StatusError(Status.EIO, f"inode {inode}: no storage to migrate inline data to")
        copy = asyncio.ensure_future(self.chunk_writer.write_chunk(layout, inode, 0, 0, memoryview(data)))
        try:
            done, _ = await asyncio.wait({copy}, timeout=self.migration_copy_timeout_s)
        finally:
            if not copy.done():
                copy.cancel()
        if not done:
            raise _CopyHung(f"no answer in {self.migration_copy_timeout_s:.0f}s")
        copy.result()

    async def _release_migration(self, inode: int, fence_s: float) -> None:
        """Drop this process's claim after a failed round; ``fence_s`` > 0: a write of the
        copy may still land, so nobody (this process included) moves the file to chunks for
        that long."""
        with contextlib.suppress(Exception):
            async with self.store.write() as txn:
                row = await txn.get_inline(inode)
                if row is not None and row.claim_owner == self.migration_owner:
                    until = self.clock.now_ns() + int(fence_s * 1e9) if fence_s > 0 else 0
                    await txn.put_inline(inode, dataclasses.replace(row, claim_owner=0, claim_until_ns=until))

    async def wait_migration(self, inode: int) -> None:
        """Wait for this process's migration of ``inode`` and then for any other claim on it
        (another meta's migration, a hung copy's fence): EAGAIN past the wait."""
        async with self._migrations.hold(inode):
            pass
        deadline = self.clock.monotonic() + self.migration_wait_s
        while True:
            async with self.store.read() as txn:
                row = await txn.get_inline(inode)
            if row is None or row.claim_until_ns <= self.clock.now_ns():
                return
            if self.clock.monotonic() >= deadline:
                raise StatusError(Status.EAGAIN, f"inode {inode}: being migrated to chunks elsewhere")
            await asyncio.sleep(POLL_S)

    def _check_not_migrating(self, inode: int, row: InlineData | None = None) -> None:
        """Before a move of ``inode`` to chunks: ``MigrationBusy`` while a migration (here, or
        another meta's claim in ``row``) may still land a copy of the old content."""
        if self._migrations.busy(inode) or (row is not None and row.claim_until_ns > self.clock.now_ns()):
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
