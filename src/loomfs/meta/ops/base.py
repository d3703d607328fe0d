"""Shared state and helpers of the namespace operations (inode creation, link drops, lengths)."""

from __future__ import annotations

import dataclasses
import logging
import random
from typing import Protocol

import crc32c

from loomfs.common.clock import SYSTEM_CLOCK, Clock
from loomfs.common.identity import Identity
from loomfs.common.keylocks import KeyLocks
from loomfs.common.routing import Routing
from loomfs.errors import LoomError, StatusError
from loomfs.meta import orphans, perm, tenancy
from loomfs.meta.caller import caller
from loomfs.meta.gc import SESSION_LEASE_S
from loomfs.meta.layout import ChainAllocator
from loomfs.meta.store.base import InlineData, MetaStore, MetaTxn, TrimEntry
from loomfs.meta.trim import CLAIM_S, CUT_TIMEOUT_S, WAIT_S, Trimmer, must_settle, queue_trim
from loomfs.wire.status import Status
from loomfs.wire.types import FILE_BYTES_MAX, ROOT_INODE, Attr, FileType, Layout

logger = logging.getLogger(__name__)

FILE = int(FileType.FILE)
DIR = int(FileType.DIRECTORY)
LINK = int(FileType.SYMLINK)

# counter names in the store
C_INODE = "inode"
C_SESSION = "session"
C_FILES = "files"
C_DIRS = "directories"
C_BYTES = "bytes_used"


class RoutingSource(Protocol):
    """What the namespace needs from routing (``loomfs.common.routing.RoutingClient`` fits)."""

    async def get(self) -> Routing: ...

    async def refresh(self, min_version: int = 0) -> Routing: ...


class ChunkWriter(Protocol):
    """What moving an inline file to chunks needs from storage (``StorageClient`` fits)."""

    async def write_chunk(self, layout: Layout, inode: int, index: int, offset: int, data: memoryview) -> int | None: ...


class NamespaceBase:
    def __init__(
        self,
        store: MetaStore,
        *,
        routing: RoutingSource | None = None,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        default_layout: Layout | None = None,
        session_lease_s: float = SESSION_LEASE_S,
        trimmer: Trimmer | None = None,
        chunk_writer: ChunkWriter | None = None,
    ):
        self.store = store
        self.routing = routing
        self.clock = clock
        self.chains = ChainAllocator(rng or random.Random())
        self.default_layout = default_layout or Layout()
        self.session_lease_s = session_lease_s  # told to writers, who renew (GcWorker expires)
        # cuts the chunks of shrunk files before a call that lets writes land past the new end
        # answers (``loomfs.meta.trim``); without one (tests, offline tools) trims stay queued
        self.trimmer = trimmer
        # writes an inline file's content to chunks when it outgrows its limit
        # (``loomfs.meta.ops.inline``); without one only empty inline files can migrate
        self.chunk_writer = chunk_writer
        self._migrations: KeyLocks[int] = KeyLocks()
        self.migrations_total = 0
        # the migration claim kept in the inline row (``loomfs.meta.ops.inline``): this
        # process's owner id; a claim outlives a copy (its timeout) plus a storage request's
        # deadline, so a copy never lands after a claim ran out; others wait this long for it
        self.migration_owner = random.SystemRandom().getrandbits(62) | 1
        self.migration_claim_s = CLAIM_S
        self.migration_copy_timeout_s = CUT_TIMEOUT_S
        self.migration_wait_s = WAIT_S

    async def init(self) -> None:
        """Create the root directory on a fresh store (idempotent)."""
        async with self.store.write() as txn:
            if await txn.get_inode(ROOT_INODE) is not None:
                return
            now = self.clock.now_ns()
            root = Attr(
                inode=ROOT_INODE, type=DIR, mode=0o755, nlink=2, atime_ns=now, mtime_ns=now,
                ctime_ns=now, layout=dataclasses.replace(self.default_layout, chains=[]),
            )
            await txn.put_inode(root)
            counters = await txn.counters()
            if counters.get(C_INODE, 0) < ROOT_INODE:
                await txn.add_counter(C_INODE, ROOT_INODE - counters.get(C_INODE, 0))
            await txn.add_counter(C_DIRS, 1)
            logger.info("meta: created root inode %d", ROOT_INODE)

    # -- helpers used inside transactions -----------------------------------------------

    async def _routing_for_create(self) -> Routing | None:
        """Routing to place new files; fetched before the transaction (it may hit the network)."""
        if self.routing is None:
            return None
        return await self.routing.get()

    def _file_layout(self, routing: Routing | None, parent: Attr, inline_max_bytes: int | None = None) -> Layout:
        if routing is None:
            raise StatusError(Status.NO_CHAIN_TABLE, "no routing source: cannot place file data")
        dir_layout = parent.layout or self.default_layout
        # no table named: an erasure-coded file goes to an EC group's table, a replicated one
        # to a replicated table (a replicated single-replica table is no EC group, nor the
        # other way round: ChainTable.ec). A table named explicitly is taken as it is
        ec = None if dir_layout.table_id else dir_layout.ec_k > 0
        try:
            table = routing.table(dir_layout.table_id, dir_layout.replicas, ec=ec)
        except LoomError as exc:
            raise StatusError(Status.NO_CHAIN_TABLE, str(exc)) from exc
        return self.chains.file_layout(table, dir_layout, routing, inline_max_bytes=inline_max_bytes)

    async def _new_inode(
        self,
        txn: MetaTxn,
        parent: int,
        name: str,
        *,
        type: int,
        mode: int,
        uid: int,
        gid: int,
        layout: Layout | None,
        symlink_target: str = "",
        now: int,
        inline: bytes | None = None,
    ) -> Attr:
        """``inline``: a file whose bytes live in meta, with this content."""
        tenant = tenancy.tenant_of(parent)  # a tenant's objects number in its own range
        ino = tenancy.inode_in(tenant, await txn.next_id(tenancy.counter_of(tenant)))
        size = len(inline) if inline is not None else len(symlink_target.encode("utf-8", "surrogatepass"))
        attr = Attr(
            inode=ino, type=type, mode=mode & 0o7777, nlink=2 if type == DIR else 1, uid=uid,
            gid=gid, size=size, atime_ns=now, mtime_ns=now, ctime_ns=now, layout=layout,
            symlink_target=symlink_target, inline=inline is not None,
        )
        await txn.put_inode(attr)
        if inline is not None:
            await txn.put_inline(ino, InlineData(inline, crc32c.crc32c(inline) if inline else 0))
            if inline:
                await txn.add_counter(C_BYTES, len(inline))
        await txn.put_dentry(parent, name, ino, type)
        await txn.touch_inode(parent, mtime_ns=now, ctime_ns=now, nlink_delta=1 if type == DIR else 0)
        if type == DIR:
            await txn.add_counter(C_DIRS, 1)
        elif type == FILE:
            await txn.add_counter(C_FILES, 1)
        return attr

    async def _drop_link(self, txn: MetaTxn, attr: Attr, now: int) -> bool:
        """One name of ``attr`` is gone. Returns True when the file's data went to the GC queue.
        A file whose last name goes while a client holds it open stays, nameless, as an
        orphan until its last holder lets go (``loomfs.meta.orphans``)."""
        if attr.type == DIR:
            await txn.delete_inode(attr.inode)
            await txn.add_counter(C_DIRS, -1)
            return False
        if attr.nlink > 1:
            await txn.put_inode(dataclasses.replace(attr, nlink=attr.nlink - 1, ctime_ns=now))
            return False
        if await orphans.keep_if_held(txn, attr, now):
            return False
        return await orphans.drop_file(txn, attr, now, self.default_layout)

    async def _report_length(
        self, txn: MetaTxn, inode: int, length: int, mtime_ns: int, trunc_epoch: int
    ) -> tuple[Attr | None, int, bool]:
        """A writer's length report; returns the attributes, the file's truncate epoch, and
        whether the writer's bytes are lost (written in chunks of a file that became inline
        after the writer learnt the current epoch: its session had expired, so a put could
        make it inline; the caller answers EIO once its transaction is committed).

        At the file's truncate epoch (or a newer one): length = max(current, reported). At an
        older one the writer has not seen the last truncate: the length does not grow, and
        what it wrote past the current length is queued to be cut (an idle trim, see
        ``loomfs.meta.trim``)."""
        attr = await txn.get_inode(inode)
        if attr is None:
            gc = await txn.gc_get(inode)  # unlinked while open: GC must cover what was written
            if gc is not None and length > gc.length:
                await txn.gc_put(dataclasses.replace(gc, length=length))
            return None, 0, False
        if attr.type != FILE:
            return attr, 0, False
        epoch = await txn.trunc_epoch(inode)
        if length < 0:
            return attr, epoch, False
        if length > FILE_BYTES_MAX:
            raise StatusError(Status.EFBIG, f"inode {inode}: length {length} past the largest file length")
        if attr.inline:
            # a writer in chunks of a file that became inline since (an O_TRUNC put): its
            # bytes are not the file's; GC or the next migration removes them
            row = await txn.get_inline(inode)
            if row is not None and length > 0:
                # dirty, and a new version: a migration copying now starts again and cuts first
                await txn.put_inline(inode, dataclasses.replace(row, chunks_dirty=True, version=row.version + 1))
            return attr, epoch, length > 0 and trunc_epoch >= epoch
        now = self.clock.now_ns()
        size = max(attr.size, length)
        if trunc_epoch < epoch and length > attr.size:
            size = attr.size
            await queue_trim(txn, TrimEntry(
                inode=inode, layout=attr.layout or self.default_layout, length=attr.size,
                old_length=length, idle=True, generation=0, enqueued_ns=now,
            ), now)
            logger.info("meta: stale length report for inode %d (epoch %d < %d): %d kept, bytes to %d cut",
                        inode, trunc_epoch, epoch, attr.size, length)
        attr2 = dataclasses.replace(attr, size=size, mtime_ns=mtime_ns or now, ctime_ns=now)
        await txn.put_inode(attr2)
        if size != attr.size:
            await txn.add_counter(C_BYTES, size - attr.size)
        return attr2, epoch, False

    async def _shrink(self, txn: MetaTxn, attr: Attr, size: int, now: int) -> int:
        """``attr`` (a file) is cut to ``size`` (below its length, or anywhere while writers
        are open): a new truncate epoch and a trim of the chunks past ``size``, queued in the
        caller's transaction and claimed for the settle that follows its commit. Returns the
        new epoch."""
        epoch = await txn.trunc_epoch(attr.inode) + 1
        await txn.set_trunc_epoch(attr.inode, epoch)
        owner, until = self.trimmer.claim(now) if self.trimmer is not None else (0, 0)
        await queue_trim(txn, TrimEntry(
            inode=attr.inode, layout=attr.layout or self.default_layout, length=size,
            old_length=attr.size, idle=False, generation=0, enqueued_ns=now, claim_owner=owner,
            claim_until_ns=until,
        ), now)
        return epoch

    async def _must_settle(self, txn: MetaTxn, inode: int) -> bool:
        """Whether ``inode`` has a trim to cut before the caller's reply (``must_settle``)."""
        entry = await txn.trim_get(inode)
        return entry is not None and must_settle(entry, await txn.session_count(inode), self.clock.now_ns())

    async def _settle(self, inode: int) -> None:
        if self.trimmer is not None:
            await self.trimmer.settle(inode)

    @staticmethod
    async def _confine(txn: MetaTxn, inode: int) -> None:
        """A call by inode number: ENOENT for an inode outside the caller's tenant (a
        tenant-less caller's is the shared range: ``tenancy.confine``); services and admins
        (``Identity.privileged``) reach every inode."""
        who = caller()
        if not who.privileged:
            await tenancy.confine(txn, who.tenant, inode)

    @staticmethod
    def _same_tenant(a: int, b: int) -> None:
        """rename/link between two directories: EXDEV across tenants."""
        if tenancy.tenant_of(a) != tenancy.tenant_of(b):
            raise StatusError(Status.EXDEV, "rename or link across tenants")

    @staticmethod
    def _owner(parent: Attr, who: Identity, type: int, mode: int, uid: int, gid: int) -> tuple[int, int, int]:
        """(uid, gid, mode) of what ``who`` creates in ``parent`` (``perm.new_owner``). Root may
        name another owner in the request (``uid``/``gid`` > 0: the FUSE mount creating for
        the local caller), which is what create + chown would give; others' are ignored."""
        o_uid, o_gid, mode = perm.new_owner(parent, who, type, mode)
        if who.uid == 0:
            if uid > 0:
                o_uid = uid
            if gid > 0:
                o_gid = gid
        return o_uid, o_gid, mode

    async def _attr_at(self, txn: MetaTxn, r: object, inode: int) -> Attr:
        """``_attr`` (kept for callers written when the walk handed attributes on; it no
        longer does: its permission read builds no ``Attr`` objects)."""
        return await self._attr(txn, inode)

    async def _attr(self, txn: MetaTxn, inode: int) -> Attr:
        attr = await txn.get_inode(inode)
        if attr is None:
            raise StatusError(Status.EIO, f"dentry points at missing inode {inode}")
        return attr

    def __repr__(self) -> str:
        return f"{type(self).__name__}(store={self.store!r} {self.chains!r})"
