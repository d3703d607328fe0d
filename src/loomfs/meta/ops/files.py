"""File operations: open/create (os.O_* flags), close, sync, setattr (truncate, chmod, utimes).

Shrinks (SETATTR, O_TRUNC) queue a trim in their transaction and cut the chunks before they
answer; every call that hands a writer the file's truncate epoch (write OPEN, SETATTR of the
size, SYNC, CLOSE) first settles the file's pending trim. ``loomfs.meta.trim`` has the rules
and why they are safe.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import stat
from collections.abc import Sequence

import crc32c

from loomfs.common.identity import Identity, Right
from loomfs.common.routing import Routing
from loomfs.errors import StatusError
from loomfs.meta import orphans, perm, tenancy
from loomfs.meta.caller import caller
from loomfs.meta.ops.base import C_BYTES, DIR, FILE, LINK
from loomfs.meta.ops.inline import InlineOps, MigrationBusy
from loomfs.meta.ops.walk import walk
from loomfs.meta.paths import split_path
from loomfs.meta.store.base import MetaTxn
from loomfs.wire.meta import RENEW_SESSIONS_MAX
from loomfs.wire.status import Status
from loomfs.wire.types import FILE_BYTES_MAX, Attr

logger = logging.getLogger(__name__)

O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0o400000)
_WRITE_RIGHT = int(Right.WRITE)  # tested as an int: an IntFlag's & costs ~1 us (a new flag object)
O_DIRECTORY = getattr(os, "O_DIRECTORY", 0o200000)


@dataclasses.dataclass(frozen=True, slots=True)
class Opened:
    attr: Attr
    session_id: int = 0  # nonzero for write opens
    truncated_from: int = 0
    created: bool = False
    replayed: bool = False  # a retried OPEN that had been applied: nothing done this time
    trunc_epoch: int = 0  # write opens: the file's truncate epoch
    settle: bool = False  # a trim must be cut before the reply
    data: bytes | None = None  # an inline file's content (not for a put: the caller has it)
    held: bool = False  # a read-only open took a read hold (``session_id`` stays 0: it grants no write)


@dataclasses.dataclass(frozen=True, slots=True)
class SetattrResult:
    attr: Attr
    truncated_from: int = -1
    trunc_epoch: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Reported:
    """A length report's outcome: the attributes (None: the inode is gone) and the epoch."""

    attr: Attr | None
    trunc_epoch: int = 0


MIGRATION_WAITS = 4  # an open that moves an inline file to chunks waits for its migration
SETATTR_SETTLE_ROUNDS = 3  # an extend settles the file's trim, then tries again at most this often


@dataclasses.dataclass(frozen=True, slots=True)
class _Migrate:
    inode: int


class FileOps(InlineOps):
    async def open(
        self, path: str, flags: int = os.O_RDONLY, *, mode: int = 0o644, uid: int = 0, gid: int = 0,
        client_id: int = 0, session_id: int = 0, data: bytes | None = None, data_crc: int | None = None,
        chunked: bool = False,
    ) -> Opened:
        """Open ``path`` with ``os.O_*`` flags; a write open starts a write session.

        ``session_id``: the id the client chose for the write session (0 = meta picks). A
        retried OPEN whose first attempt was applied but whose reply was lost (meta killed,
        connection cut) carries the same id and is answered from that session, so it is
        applied once: no second session, no EEXIST for its own O_EXCL create, no second
        truncation.

        ``data`` (a *put*, with O_CREAT|O_WRONLY and O_TRUNC or O_EXCL): the file's whole new
        content. If it fits the file's inline limit it is stored inline in this transaction
        and no write session is opened (``session_id`` 0 in the result); otherwise this is an
        ordinary write open and the caller writes the bytes to chunks. ``chunked``: create
        (or O_TRUNC) the file in chunks, not inline (the caller is writing a big file).

        A read-only open of a file in chunks that names ``session_id`` and ``client_id`` takes a
        *read hold* under that id (``held`` in the result): should the file's last name go
        while it is held, the file stays, nameless, until the hold ends (CLOSE with that id,
        or the lease runs out: holds are renewed with the client's write sessions); see
        ``loomfs.meta.orphans``. An inline file's content comes with the reply, so it takes
        none. Clients that do not ask (session_id 0 on read opens) pay nothing.
        """
        parts = split_path(path)
        acc = flags & os.O_ACCMODE
        if acc == os.O_ACCMODE:
            raise StatusError(Status.EINVAL, "bad access mode")
        if not 0 <= session_id < 1 << 63:
            raise StatusError(Status.EINVAL, f"bad session id {session_id}")
        write = acc != os.O_RDONLY
        creat = bool(flags & os.O_CREAT)
        excl = creat and bool(flags & os.O_EXCL)
        trunc = bool(flags & os.O_TRUNC)
        follow = not excl and not flags & O_NOFOLLOW
        if data is not None:
            if not (creat and acc == os.O_WRONLY and (trunc or excl)):
                raise StatusError(Status.EINVAL, "a put needs O_CREAT|O_WRONLY and O_TRUNC or O_EXCL")
            if data_crc is not None and crc32c.crc32c(data) != data_crc:
                raise StatusError(Status.CHECKSUM_MISMATCH, f"{path}: data fails its CRC32C")
        if (creat or trunc or write) and not int(caller().rights) & _WRITE_RIGHT:
            raise StatusError(Status.EPERM, f"{path}: opening for writing needs the WRITE right (read-only token)")
        if not (creat or trunc or write):
            async with self.store.read() as txn:
                r = await walk(txn, parts, follow_last=follow)
                if r.inode is None:
                    raise StatusError(Status.ENOENT, path)
                if r.type == LINK:
                    raise StatusError(Status.ELOOP, f"{path!r} is a symbolic link (O_NOFOLLOW)")
                if flags & O_DIRECTORY and not r.is_dir:
                    raise StatusError(Status.ENOTDIR, path)
                attr = await self._attr(txn, r.inode)
                who = caller()
                if who.uid != 0:
                    perm.need(attr, who, perm.R, path)
                content = await self._inline_content(txn, attr)
            if session_id and client_id and attr.type == FILE and not attr.inline:
                return await self._open_held(path, parts, follow, session_id, client_id)
            return Opened(attr, data=content)
        routing = await self._routing_for_create() if creat else None
        refreshed = False
        for _ in range(MIGRATION_WAITS):
            try:
                o = await self._open_write(path, parts, flags, mode, uid, gid, client_id, session_id, routing,
                                           follow, data, chunked)
                break
            except MigrationBusy as busy:  # the O_TRUNC moves it to chunks: after the migration's copy
                await self.wait_migration(busy.inode)
            except StatusError as exc:
                if exc.status is not Status.NO_CHAIN_TABLE or self.routing is None or refreshed:
                    raise
                # a chain table may have been created since our last routing refresh
                routing = await self.routing.refresh()
                refreshed = True
        else:
            raise StatusError(Status.EAGAIN, f"{path}: migrated again and again while opening")
        if o.settle and o.attr.inline and o.session_id:
            # a write open of an inline file: its writes go to meta; the pending trim of
            # chunks it had before is cut by the next migration or by GC
            o = dataclasses.replace(o, settle=False)
        if o.settle:  # O_TRUNC's own trim, or one a crash left: cut before anyone writes
            try:
                await self._settle(o.attr.inode)
            except StatusError as exc:
                if o.attr.inline and not o.session_id:
                    # a put made the file inline: its old chunks are never read, and the next
                    # migration cuts them first; GC retries the trim
                    logger.info("meta: put of inode %d leaves its trim to GC: %s", o.attr.inode, exc)
                    return dataclasses.replace(o, settle=False)
                if o.session_id:  # the open failed: its session would only wait to expire
                    async with self.store.write() as txn:
                        await txn.remove_session(o.attr.inode, o.session_id)
                        await orphans.release_if_unheld(txn, o.attr.inode, self.clock.now_ns(),
                                                        self.default_layout)
                raise
            o = dataclasses.replace(o, settle=False)
        return o

    async def _open_held(self, path: str, parts: list[str], follow: bool, hold_id: int, client_id: int) -> Opened:
        """A read-only open that takes a read hold (``open``): walked again in a write
        transaction, so the hold is on what the name names when it commits."""
        async with self.store.write() as txn:
            r = await walk(txn, parts, follow_last=follow)
            if r.inode is None:
                raise StatusError(Status.ENOENT, path)
            if r.type == LINK:
                raise StatusError(Status.ELOOP, f"{path!r} is a symbolic link (O_NOFOLLOW)")
            attr = await self._attr(txn, r.inode)
            who = caller()
            if who.uid != 0:
                perm.need(attr, who, perm.R, path)
            if attr.type != FILE or attr.inline:  # changed meanwhile: nothing to hold
                return Opened(attr, data=await self._inline_content(txn, attr))
            await txn.add_hold(attr.inode, hold_id, client_id, self.clock.now_ns())
            return Opened(attr, held=True)

    async def _open_write(
        self, path: str, parts: list[str], flags: int, mode: int, uid: int, gid: int, client_id: int,
        session_id: int, routing: Routing | None, follow: bool, data: bytes | None = None,
        chunked: bool = False,
    ) -> Opened:
        write = flags & os.O_ACCMODE != os.O_RDONLY
        creat = bool(flags & os.O_CREAT)
        who = caller()
        async with self.store.write() as txn:
            now = self.clock.now_ns()
            r = await walk(txn, parts, follow_last=follow)
            truncated_from = 0
            created = False
            if r.inode is not None:
                if write and session_id and r.type == FILE:
                    owner = await txn.session_client(r.inode, session_id)
                    if owner == client_id:
                        attr = await self._attr(txn, r.inode)
                        if who.uid != 0:
                            perm.need(attr, who, perm.open_bits(flags), path)
                        return Opened(attr, session_id, replayed=True,
                                      trunc_epoch=await txn.trunc_epoch(r.inode),
                                      settle=await self._must_settle(txn, r.inode),
                                      data=await self._inline_content(txn, attr))
                    if owner is not None:
                        session_id = 0  # another client's id: take one of ours
                if creat and flags & os.O_EXCL:
                    raise StatusError(Status.EEXIST, path)
                if r.type == LINK:
                    raise StatusError(Status.ELOOP, f"{path!r} is a symbolic link (O_NOFOLLOW)")
                if r.type == DIR:
                    if write or creat or flags & os.O_TRUNC:
                        raise StatusError(Status.EISDIR, path)
                    attr = await self._attr(txn, r.inode)
                    if who.uid != 0:
                        perm.need(attr, who, perm.R, path)
                    return Opened(attr)
                if flags & O_DIRECTORY:
                    raise StatusError(Status.ENOTDIR, path)
                attr = await self._attr(txn, r.inode)
                if who.uid != 0:
                    perm.need(attr, who, perm.open_bits(flags), path)
                if flags & os.O_TRUNC and attr.type == FILE:
                    truncated_from = attr.size
                    attr = await self._truncate_at_open(txn, attr, data, chunked, now)
                    if who.uid != 0 and _killpriv(attr.mode) != attr.mode:
                        attr = dataclasses.replace(attr, mode=_killpriv(attr.mode))
                        await txn.put_inode(attr)
                    if data is not None and attr.inline:
                        return Opened(attr, 0, truncated_from, settle=await self._must_settle(txn, attr.inode))
            else:
                if not creat:
                    raise StatusError(Status.ENOENT, path)
                if r.must_be_dir or r.parent is None or r.name is None:
                    raise StatusError(Status.EISDIR, path)
                parent = await self._attr(txn, r.parent)
                perm.may_create(parent, who, path)
                uid, gid, mode = self._owner(parent, who, FILE, mode, uid, gid)
                limit = self.inline_limit(parent)
                layout = self._file_layout(routing, parent, limit)
                inline = limit > 0 and not chunked and (data is None or len(data) <= limit)
                attr = await self._new_inode(
                    txn, r.parent, r.name, type=FILE, mode=mode, uid=uid, gid=gid, layout=layout, now=now,
                    inline=(data or b"") if inline else None,
                )
                created = True
                if data is not None and inline:
                    return Opened(attr, 0, created=True)  # a put: no session
            if not write:
                session_id = 0
            elif not session_id:
                # unguessable (a session lets its holder write the file even without write
                # permission, see _may_write_inode), below the ids clients pick (1 << 62 up)
                session_id = secrets.randbits(62) or 1
            if session_id:
                await txn.add_session(attr.inode, session_id, client_id, now)
            content = await self._inline_content(txn, attr)
            if created or not (write or truncated_from):
                return Opened(attr, session_id, truncated_from, created, data=content)
            return Opened(attr, session_id, truncated_from, created, trunc_epoch=await txn.trunc_epoch(attr.inode),
                          settle=await self._must_settle(txn, attr.inode), data=content)

    async def _truncate_at_open(self, txn: MetaTxn, attr: Attr, data: bytes | None, chunked: bool, now: int) -> Attr:
        """O_TRUNC of file ``attr``: its new state, inline with ``data`` (a put that fits),
        inline and empty, or in chunks and empty (``chunked``, or a put too big to inline)."""
        limit = attr.layout.inline_max_bytes if attr.layout is not None else 0
        if data is None:  # a plain O_TRUNC keeps the file where it is
            to_chunks = chunked or not attr.inline
        else:
            to_chunks = chunked or limit <= 0 or len(data) > limit
            if not attr.inline and await txn.has_session(attr.inode):
                to_chunks = True  # its writers write chunks: a put over it stays there too
        if attr.inline:
            if not to_chunks:
                return await self._set_inline(txn, attr, data or b"", now)
            row = await txn.get_inline(attr.inode)
            self._check_not_migrating(attr.inode, row)
            cut = row is None or row.chunks_dirty  # a migration may have left chunks
            await txn.delete_inline(attr.inode)
            attr = dataclasses.replace(attr, inline=False)
        else:
            # other writers may have written past the length they reported; a file that
            # becomes inline (a put) has chunks from before
            cut = bool(attr.size) or await txn.has_session(attr.inode) or not to_chunks
        if cut:  # the trim is settled before the reply
            await self._shrink(txn, attr, 0, now)
        if attr.size:
            await txn.add_counter(C_BYTES, -attr.size)
        attr = dataclasses.replace(attr, size=0, mtime_ns=now, ctime_ns=now)
        await txn.put_inode(attr)
        if not to_chunks:  # a put over a file in chunks: inline from now on
            attr = await self._set_inline(txn, attr, data or b"", now, chunks_dirty=True)
        return attr

    async def close(
        self, inode: int, session_id: int = 0, length: int = -1, mtime_ns: int = 0, *, trunc_epoch: int = 0
    ) -> Attr | None:
        """End a write session and apply its length report. None if the inode is gone."""
        return (await self.report(inode, session_id, length, mtime_ns, trunc_epoch=trunc_epoch, end=True)).attr

    async def sync(self, inode: int, length: int = -1, mtime_ns: int = 0, *, trunc_epoch: int = 0) -> Attr | None:
        """An open writer's length report (fsync). None if the inode is gone."""
        return (await self.report(inode, 0, length, mtime_ns, trunc_epoch=trunc_epoch)).attr

    async def report(
        self, inode: int, session_id: int = 0, length: int = -1, mtime_ns: int = 0, *, trunc_epoch: int = 0,
        end: bool = False, ec_reduced: bool = False, ec_reduced_done: int = 0,
    ) -> Reported:
        """A writer's length report (SYNC; CLOSE with ``end``: its session ends too).

        ``trunc_epoch``: the epoch the writer knows; an older one than the file's does not
        grow the length (``_report_length``). The file's pending trim is settled before the
        reply, which hands the writer the current epoch. ``ec_reduced`` / ``ec_reduced_done``:
        ``Layout.ec_reduced`` marked (a new generation) / cleared if still that generation."""
        who = caller()
        async with self.store.write() as txn:
            await self._confine(txn, inode)
            held = released = False
            if end and session_id:
                held = await txn.remove_session(inode, session_id)
                # or the end of a read hold (it proves nothing about writing: checked below)
                released = held or await txn.remove_hold(inode, session_id)
            if who.uid != 0 and not held and (length >= 0 or ec_reduced or ec_reduced_done):
                await self._may_write_inode(txn, inode, session_id, who)
            attr, epoch, lost = await self._report_length(txn, inode, length, mtime_ns, trunc_epoch)
            if attr is not None and (ec_reduced or ec_reduced_done):
                attr = await mark_ec_reduced(txn, attr, ec_reduced, ec_reduced_done)
            if lost and (held or (session_id and await txn.session_client(inode, session_id) is not None)):
                lost = False  # a live session: it opened the file inline (it writes patches)
            if released and await orphans.release_if_unheld(txn, inode, self.clock.now_ns(), self.default_layout):
                attr = None  # the last holder of a nameless file: it is gone now
            settle = attr is not None and await self._must_settle(txn, inode)
        if lost:
            raise StatusError(Status.EIO, f"inode {inode}: this writer's bytes were written in chunks of a file "
                                          "made inline since its session expired (a put): they are not the file's")
        if settle:
            try:
                await self._settle(inode)
            except StatusError as exc:
                if not end:
                    raise  # the writer goes on: it may write only once the trim is cut
                logger.info("meta: close of inode %d leaves its trim to GC: %s", inode, exc)
        return Reported(attr, epoch)

    async def _may_write_inode(self, txn: MetaTxn, inode: int, session_id: int, who: Identity) -> None:
        """A call by inode number (no path to walk) that changes the file: the caller holds
        the write session it names, or may write the file (EACCES). A gone inode passes (the
        call answers that)."""
        attr = await txn.get_inode(inode)
        if attr is None or perm.allowed(attr, who, perm.W):
            return
        if session_id and await txn.session_client(inode, session_id) is not None:
            return
        raise StatusError(Status.EACCES, f"inode {inode}: permission denied")

    async def renew_sessions(self, client_id: int, session_ids: Sequence[int]) -> int:
        """A writer's lease renewal of the write sessions it holds. Returns how many of them
        still exist (fewer: some expired, see ``loomfs.meta.gc``)."""
        if len(session_ids) > RENEW_SESSIONS_MAX:
            raise StatusError(Status.EINVAL, f"{len(session_ids)} sessions in one renewal (max {RENEW_SESSIONS_MAX})")
        if not client_id or not session_ids:
            return 0
        async with self.store.write() as txn:
            return await txn.renew_sessions(client_id, session_ids, self.clock.now_ns())

    async def sessions_held(self, client_id: int, sessions: Sequence[tuple[int, int]]) -> list[bool]:
        """Per (inode, session id): whether ``client_id`` holds that write session."""
        if len(sessions) > RENEW_SESSIONS_MAX:
            raise StatusError(Status.EINVAL, f"{len(sessions)} sessions in one call (max {RENEW_SESSIONS_MAX})")
        tenant = caller().tenant
        async with self.store.read() as txn:
            mine = await tenancy.tenant_number(txn, tenant) if tenant else None
            return [(mine is None or tenancy.tenant_of(ino) == mine) and await txn.session_client(ino, sid) == client_id
                    for ino, sid in sessions]

    async def getattr_inode(self, inode: int) -> Attr | None:
        async with self.store.read() as txn:
            return await txn.get_inode(inode)

    async def setattr(
        self, path: str, *, follow_symlinks: bool = True, mode: int = -1, uid: int = -1, gid: int = -1,
        atime_ns: int = -1, mtime_ns: int = -1, size: int = -1, inode: int = 0, times_now: bool = False,
    ) -> SetattrResult:
        """chmod/chown/utimes/truncate. A size change settles the file's trim: an extend
        before it commits (the bytes it exposes must read zeros), a shrink after (its own).
        ``inode``: change that inode (an open file's), not what ``path`` names now.
        ``times_now``: set atime and mtime to meta's clock (utimes(path, NULL): the owner or
        a caller with write permission may; explicit times only the owner)."""
        if times_now:
            atime_ns = mtime_ns = self.clock.now_ns()
        parts = split_path(path) if not inode else []
        if inode < 0:
            raise StatusError(Status.EINVAL, f"bad inode {inode}")
        if size < -1:
            raise StatusError(Status.EINVAL, f"negative size {size}")
        if size > FILE_BYTES_MAX:
            raise StatusError(Status.EFBIG, f"size {size} past the largest file length {FILE_BYTES_MAX}")
        for _ in range(SETATTR_SETTLE_ROUNDS):
            r = await self._setattr(parts, path, follow_symlinks, mode, uid, gid, atime_ns, mtime_ns, size,
                                    inode, times_now)
            if isinstance(r, _Migrate):
                await self.migrate(r.inode, checked=True)  # an extend past the inline limit (checked)
                continue
            if isinstance(r, int):
                await self._settle(r)  # an extend waits for the file's pending trim
                continue
            result, settle = r
            if settle:
                await self._settle(result.attr.inode)
            return result
        raise StatusError(Status.EAGAIN, f"{path}: truncated again and again while extending")

    async def _setattr(
        self, parts: list[str], path: str, follow_symlinks: bool, mode: int, uid: int, gid: int,
        atime_ns: int, mtime_ns: int, size: int, inode: int = 0, times_now: bool = False,
    ) -> tuple[SetattrResult, bool] | int | _Migrate:
        """One try: the result and whether to settle the file's trim before replying; or an
        inode number: settle that file's trim first and try again; or ``_Migrate``: move the
        inline file to chunks first and try again."""
        async with self.store.write() as txn:
            if inode:
                await self._confine(txn, inode)
                found = await txn.get_inode(inode)
                if found is None:
                    gc = await txn.gc_get(inode)
                    raise StatusError(Status.ENOENT, f"{path}: inode {inode} is gone"
                                      + (" (unlinked; its data waits for GC)" if gc is not None else ""))
                attr = found
            else:
                r = await walk(txn, parts, follow_last=follow_symlinks or size >= 0)
                if r.inode is None:
                    raise StatusError(Status.ENOENT, path)
                attr = await self._attr(txn, r.inode)
            if size >= 0:
                if attr.type == DIR:
                    raise StatusError(Status.EISDIR, path)
                if attr.type != FILE:
                    raise StatusError(Status.EINVAL, path)
            who = caller()
            now = self.clock.now_ns()
            changes: dict[str, int] = {}
            if size >= 0 and who.uid != 0:
                perm.need(attr, who, perm.W, path)
            if uid >= 0 or gid >= 0:
                changes["uid"], changes["gid"], changes["mode"] = perm.chown_attrs(attr, who, uid, gid, path)
            if mode >= 0:
                regrouped = dataclasses.replace(attr, gid=changes["gid"]) if "gid" in changes else attr
                changes["mode"] = perm.chmod_mode(regrouped, who, mode, path)
            if size >= 0 and who.uid != 0 and _killpriv(changes.get("mode", attr.mode)) != attr.mode:
                changes["mode"] = _killpriv(changes.get("mode", attr.mode))  # a truncate, as Linux's
            if atime_ns >= 0 or mtime_ns >= 0:
                perm.may_set_times(attr, who, now=times_now, what=path)
            if atime_ns >= 0:
                changes["atime_ns"] = atime_ns
            if mtime_ns >= 0:
                changes["mtime_ns"] = mtime_ns
            truncated_from = -1
            epoch = 0
            if size >= 0 and attr.inline:
                if size > (attr.layout.inline_max_bytes if attr.layout is not None else 0):
                    return _Migrate(attr.inode)
                truncated_from = attr.size
                attr = await self._resize_inline(txn, attr, size, now, mtime_ns if mtime_ns >= 0 else now)
                changes.pop("mtime_ns", None)
                size = -1
                epoch = await txn.trunc_epoch(attr.inode)
            if size >= 0:
                if size > attr.size and self.trimmer is not None and await self._must_settle(txn, attr.inode):
                    return attr.inode
                truncated_from = attr.size
                changes["size"] = size
                if mtime_ns < 0:
                    changes["mtime_ns"] = now
                if size != attr.size:
                    await txn.add_counter(C_BYTES, size - attr.size)
                # open writers may have written past the length they reported: for them any
                # size set is a shrink (their bytes past it are cut, their reports stale)
                if size < attr.size or await txn.has_session(attr.inode):
                    epoch = await self._shrink(txn, attr, size, now)
                else:
                    epoch = await txn.trunc_epoch(attr.inode)
            if changes:
                changes["ctime_ns"] = now
                attr = dataclasses.replace(attr, **changes)  # type: ignore[arg-type]
                await txn.put_inode(attr)
            settle = size >= 0 and await self._must_settle(txn, attr.inode)
            return SetattrResult(attr, truncated_from, epoch), settle


def _killpriv(mode: int) -> int:
    """A regular file's mode after a truncate by a caller other than root: without setuid,
    and without setgid when group-executable (Linux's should_remove_suid)."""
    mode &= ~stat.S_ISUID
    if mode & (stat.S_ISGID | stat.S_IXGRP) == (stat.S_ISGID | stat.S_IXGRP):
        mode &= ~stat.S_ISGID
    return mode


async def mark_ec_reduced(txn: MetaTxn, attr: Attr, mark: bool, done: int) -> Attr:
    """``Layout.ec_reduced`` of an EC file: a new generation (``mark``: a writer around a
    stripe written without some fragments), or 0 if it is still ``done`` (a scrub that read
    that generation before it started repaired the whole file). Other inodes: unchanged."""
    lay = attr.layout
    if attr.type != FILE or lay is None or not lay.ec_k:
        return attr
    gen = lay.ec_reduced + 1 if mark else (0 if lay.ec_reduced == done else lay.ec_reduced)
    if gen == lay.ec_reduced:
        return attr
    attr = dataclasses.replace(attr, layout=dataclasses.replace(lay, ec_reduced=gen))
    await txn.put_inode(attr)
    return attr
